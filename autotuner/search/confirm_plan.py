"""Confirmation replicates are never measured twice for nothing: an interrupted confirmation
resumes, and a finished one can be extended with more replicates.

A confirmation is several launches (every chosen config's replicates, interleaved), about four
GPU-minutes each; a machine lent for pieces of minutes, or a Ctrl-C, can stop it half way.
Its plan (each config's params and the claim its capacity search starts around, and the
number of replicates) is written to ``confirm/plan.json`` before the first launch and marked
finished once the last one has ended. A later run keeps each replicate whose ``trial.json``
holds a finished launch of that config (a launch writes the file only when it ends) when:

- it finds the same plan, not finished: the interrupted run is resumed;
- it finds the same configs and claims with fewer replicates (finished or not): the
  confirmation is extended, and only the added replicates are launched. Pairing still holds:
  both configs of one replicate run back to back, whenever that replicate runs.

Anything else starts afresh, and the replicate files an earlier confirmation left in the
planned folders are dropped first, so none is taken for new. In particular a finished plan met
again unchanged (``tune --reconfirm``) measures every replicate anew.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from autotuner.core.types import ParamValue
from autotuner.records.confirm import ConfirmPlanFile, PlannedConfig
from autotuner.search.trial import TrialResult

__all__ = ["PLAN_NAME", "ConfirmPlan", "Start"]

PLAN_NAME = "plan.json"

Start = Literal["fresh", "resumed", "extended"]


class ConfirmPlan:
    """One confirmation's plan, and the replicates an earlier run of it finished."""

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
        self.kept = 0  # replicates per config that an earlier run may have finished
        self.earlier = 0  # the earlier plan's replicate count (0: none to build on)

    def start(self, run_dirs: Sequence[Path]) -> Start:
        """Record the plan and say how it relates to the one found. When it starts afresh,
        the ``trial.json`` files left in ``run_dirs`` are removed."""
        old = ConfirmPlanFile.read_or_none(self.path)
        how: Start = "fresh"
        if old is not None and old.configs == self.plan.configs:
            if old.replicates < self.plan.replicates:
                how = "extended"
            elif old.replicates == self.plan.replicates and not old.finished:
                how = "resumed"
        if how == "fresh":
            for d in run_dirs:
                (d / "trial.json").unlink(missing_ok=True)
        else:
            assert old is not None
            self.kept = self.earlier = old.replicates
        self.plan.write(self.path)
        return how

    def finished(
        self, run_dir: Path, replicate: int, params: Mapping[str, ParamValue]
    ) -> TrialResult | None:
        """Replicate ``replicate`` (0-based) in ``run_dir`` when an earlier run of this plan
        finished it; None: launch it."""
        if replicate >= self.kept:
            return None
        try:
            result = TrialResult.read(run_dir / "trial.json")
        except (OSError, ValueError):
            return None  # not there (cut short), or not a trial file: measure it again
        return result if result.params == dict(params) else None

    def done(self) -> None:
        """Every replicate ended: the same plan met again is measured anew, a larger one
        extends this one."""
        self.plan.model_copy(update={"finished": True}).write(self.path)
