"""The manifest's ``lossy_tier``: the two winners of a study that allowed lossy settings,
the gain of the lossy one over the lossless one, and its price (the settings that change
outputs and what the quality gate measured). Absent from studies without lossy settings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autotuner.core.types import ParamValue


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TierWinner(_Part):
    """The best config of one tier, as promotion measured it."""

    label: str  # "baseline" or "trial-<n>"
    trial: int
    params: dict[str, ParamValue] = Field(default_factory=dict)
    capacity: float | None = None
    basis: str = "single run"  # or "mean of N replicates"
    # Its confirmation against the baseline (compare_capacity's verdict and effect).
    verdict: str | None = None
    effect: float | None = None
    low: float | None = None  # the effect's interval (None in manifests before it was kept)
    high: float | None = None


class LossyTier(_Part):
    lossless: TierWinner | None = None
    lossy: TierWinner
    lossy_settings: dict[str, ParamValue] = Field(default_factory=dict)
    gain: float | None = None  # lossy capacity / lossless capacity - 1
    gain_basis: str = "single runs"
    gate: dict[str, Any] | None = None  # GateResult.to_dict(); None: the gate was not run
    promoted: Literal["lossy", "lossless"] = "lossless"
    why: str = ""
