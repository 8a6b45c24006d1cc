"""``<study>/confirm/plan.json``: the plan of a confirmation, in progress or finished (see
:mod:`autotuner.search.confirm_plan`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from autotuner.core.types import ParamValue
from autotuner.records.base import Record


class PlannedConfig(BaseModel):
    """One config of the plan: what is launched, and the claim its search starts around."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    params: dict[str, ParamValue]
    around: float


class ConfirmPlanFile(Record):
    """The configs (by label) and replicate count of one confirmation."""

    KIND = "confirmation plan"

    replicates: int
    configs: dict[str, PlannedConfig]
    finished: bool = False  # every replicate ended; older plans: an interrupted one
