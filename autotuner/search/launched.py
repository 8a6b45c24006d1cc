"""The study's launched configs, read back for the decisions made after the search: which
trials count as measured, each as a Pareto :class:`Candidate`, its capacity from the search
and its trial file. Confirmation (:mod:`autotuner.search.confirmation`) and the bundle read
the study through these."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotuner.records.trial import CapacityRecord, TrialRecord
from autotuner.search.pareto import Candidate
from autotuner.search.study import feasible, fresh_from
from autotuner.search.trial import TrialResult


class StudyView(Protocol):
    """A study and the directory its launches wrote to."""

    @property
    def study(self) -> optuna.Study: ...

    @property
    def study_dir(self) -> Path: ...


def measured(study: optuna.Study) -> list[FrozenTrial]:
    """Completed trials that launched an engine (not reused duplicates); in a fresh re-tune
    only its own (search.study.fresh_from): a decision never rests on out-of-date launches."""
    since = fresh_from(study)
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.number >= since and not TrialRecord.from_trial(t).duplicate
    ]


def candidates(study: optuna.Study) -> list[Candidate]:
    """The measured trials as Pareto candidates."""
    return [
        Candidate(
            trial=t.number,
            values=tuple(t.values),
            feasible=feasible(t),
            metrics=dict(r.metrics),
            params=r.params_or({}),
            baseline=r.baseline,
        )
        for t in measured(study)
        for r in (TrialRecord.from_trial(t),)
    ]


def search_capacity(ctx: StudyView, number: int) -> CapacityRecord | None:
    """A trial's capacity from the search (a single run); older studies: from its file."""
    r = TrialRecord.from_trial(ctx.study.trials[number])
    if r.capacity is not None:
        return r.capacity
    trial = trial_file(ctx, number)
    return trial.found_capacity() if trial is not None else None


def trial_file(ctx: StudyView, number: int) -> TrialResult | None:
    """A trial's own file (its levels, argv, capacity); None when it has none."""
    rel = TrialRecord.from_trial(ctx.study.trials[number]).result_file
    if not rel or not (ctx.study_dir / rel).exists():
        return None
    return TrialResult.read(ctx.study_dir / rel)
