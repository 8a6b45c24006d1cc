"""An interrupted confirmation resumed: the replicates it finished are not launched again.

A confirmation is several launches (every chosen config's replicates, interleaved), about four
GPU-minutes each; a machine lent for pieces of minutes, or a Ctrl-C, can stop it half way.
Its plan (each config's params and the claim its capacity search starts around, and the
number of replicates) is written to ``confirm/plan.json`` before the first launch and removed
once the last one has ended. A run that finds the same plan there keeps each replicate whose
``trial.json`` holds a finished launch of that config (a launch writes the file only when it
ends); with another plan, or none, the confirmation starts afresh and the replicate files an
earlier confirmation left in the planned folders are dropped first, so none is taken for new.
A finished confirmation leaves no plan: deciding again (``tune --reconfirm``, or after more
trials) measures every replicate anew.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from autotuner.core.types import ParamValue
from autotuner.records.confirm import ConfirmPlanFile, PlannedConfig
from autotuner.search.trial import TrialResult

__all__ = ["PLAN_NAME", "ConfirmPlan"]

PLAN_NAME = "plan.json"


class ConfirmPlan:
    """One confirmation's plan, and the replicates an interrupted run of it finished."""

    def __init__(
        self,
        confirm_dir: Path,
        configs: Mapping[str, Mapping[str, ParamValue]],
        around: Mapping[str, float],
        replicates: int,
    ) -> None:
        self.path = confirm_dir / PLAN_NAME
        self.plan = ConfirmPlanFile(
            replicates=replicates,
            configs={
                n: PlannedConfig(params=dict(p), around=around[n]) for n, p in configs.items()
            },
        )
        self.resumed = False

    def start(self, run_dirs: Sequence[Path]) -> bool:
        """Record the plan; True when an interrupted run of the same plan is resumed.
        Otherwise the ``trial.json`` files left in ``run_dirs`` are removed."""
        self.resumed = ConfirmPlanFile.read_or_none(self.path) == self.plan
        if not self.resumed:
            for d in run_dirs:
                (d / "trial.json").unlink(missing_ok=True)
        self.plan.write(self.path)
        return self.resumed

    def finished(self, run_dir: Path, params: Mapping[str, ParamValue]) -> TrialResult | None:
        """The replicate in ``run_dir`` when the resumed run finished it; None: launch it."""
        if not self.resumed:
            return None
        try:
            result = TrialResult.read(run_dir / "trial.json")
        except (OSError, ValueError):
            return None  # not there (cut short), or not a trial file: measure it again
        return result if result.params == dict(params) else None

    def done(self) -> None:
        """Every replicate ended: a later confirmation is a new one."""
        self.path.unlink(missing_ok=True)
