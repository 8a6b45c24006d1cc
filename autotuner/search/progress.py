"""How far a study has come: one number per launch, the best so far, when to stop.

:func:`capacity_of` is the single accessor of "how much does this launch serve": the
stopping rule, the warm start's incumbent and the sentence about the engine defaults all go
through it. A trial that records a capacity (issue 16: the highest arrival rate meeting the
SLA, measured to a resolution) is read as that; until trials carry one, a feasible launch
counts with its first objective -- the SLA goodput at the highest load that met the SLA when
it is maximised, its inverse when it is minimised, so that higher is always better. A launch
that failed or missed the SLA at its own load counts as 0; what was not a launch (pruned,
reused, interrupted, running) has no value at all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotuner.records.trial import StudyRecord, TrialRecord
from autotuner.search.stopping import StopDecision, StoppingRule, defaults_sentence
from autotuner.search.study import counted, feasible, fresh_from

__all__ = [
    "StudyStopper",
    "best_launch",
    "capacity_of",
    "defaults_line",
    "incumbent",
    "is_candidate_from_sampler",
    "launch_history",
]

_UNITS = {
    "capacity": "req/s",
    "capacity_per_gpu": "req/s per GPU",
    "goodput": "req/s",
    "request_rate": "req/s",
    "output_tokens_per_s": "tok/s",
    "total_tokens_per_s": "tok/s",
}


def _recorded_capacity(r: TrialRecord) -> float | None:
    """The capacity a trial record carries, in whichever shape it has (a number, or an
    object or mapping with ``value``); None when records carry none (yet)."""
    cap: Any = getattr(r, "capacity", None)
    if isinstance(cap, Mapping):
        cap = cap.get("value")
    elif cap is not None and not isinstance(cap, int | float):
        cap = getattr(cap, "value", None)
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not math.isfinite(cap):
        return None
    return float(cap)


def capacity_of(t: FrozenTrial, maximize_first: bool = True) -> float | None:
    """What a launch serves (see the module docstring); higher is better, None: no launch."""
    if not counted(t):
        return None
    if not feasible(t):
        return 0.0
    cap = _recorded_capacity(TrialRecord.from_trial(t))
    if cap is not None:
        return max(cap, 0.0)
    if not t.values:
        return 0.0
    v = float(t.values[0])
    if not math.isfinite(v):
        return 0.0
    if maximize_first:
        return max(v, 0.0)
    return 1.0 / v if v > 0 else 0.0


def _maximize_first(study: optuna.Study) -> bool:
    return study.directions[0] == optuna.study.StudyDirection.MAXIMIZE


def _launches(study: optuna.Study) -> list[tuple[FrozenTrial, float]]:
    """Counted launches in the order they finished, with their capacity (in a re-tune, its
    own: earlier ones may be out of date)."""
    up = _maximize_first(study)
    since = fresh_from(study)
    done = [t for t in study.get_trials(deepcopy=False) if counted(t) and t.number >= since]
    done.sort(key=lambda t: (t.datetime_complete or datetime.max, t.number))
    return [(t, c) for t in done if (c := capacity_of(t, up)) is not None]


def launch_history(study: optuna.Study) -> list[float | None]:
    """The capacity of every launch so far, in the order they finished."""
    return [c for _, c in _launches(study)]


def best_launch(study: optuna.Study) -> FrozenTrial | None:
    """The launch that serves the most (the earliest of equals); None while none held."""
    held = [(t, c) for t, c in _launches(study) if c > 0]
    if not held:
        return None
    return max(held, key=lambda tc: (tc[1], -tc[0].number))[0]


def incumbent(study: optuna.Study) -> FrozenTrial | None:
    """The config the warm start varies: the launch that serves the most; while none meets
    the SLA, the measured launch closest to meeting it (smallest worst constraint margin),
    so that a change that helped is carried forward. None: nothing measured yet."""
    best = best_launch(study)
    if best is not None:
        return best
    measured = [t for t, _ in _launches(study) if t.state == TrialState.COMPLETE and t.constraints]
    if not measured:
        return None
    return min(measured, key=lambda t: (max(t.constraints.values()), t.number))


def is_candidate_from_sampler(t: FrozenTrial) -> bool:
    """A candidate the sampler chose: neither enqueued by the warm start nor re-queued after
    an interruption (both are enqueued, which Optuna marks as ``fixed_params``). A config
    moved within reach of the sampler's proposal (search.nearby) is the sampler's too."""
    r = TrialRecord.from_trial(t)
    return (
        r.role == "candidate"
        and r.requeued_from is None
        and (r.moved_from is not None or "fixed_params" not in t.system_attrs)
        and t.state != TrialState.WAITING
    )


@dataclass(frozen=True)
class StudyStopper:
    """The stopping rule applied to a study's launches."""

    rule: StoppingRule

    def check(self, study: optuna.Study) -> StopDecision:
        return self.rule.check(launch_history(study))


def defaults_line(study: optuna.Study, resolution: float = 0.03) -> str | None:
    """The sentence "the engine defaults are within X % of the best of N configs tried";
    None before any launch, or when the first objective is minimised and no trial records a
    capacity (a relative shortfall in inverse latency would mislead)."""
    launches = _launches(study)
    if not launches:
        return None
    records = [(t, TrialRecord.from_trial(t)) for t, _ in launches]
    has_capacity = any(_recorded_capacity(r) is not None for _, r in records)
    if not _maximize_first(study) and not has_capacity:
        return None
    objectives = StudyRecord.from_attrs(study.user_attrs, study.study_name).objectives
    metric = "capacity" if has_capacity else (objectives[0] if objectives else "")
    baseline = next(
        (c for (_, c), (_, r) in zip(launches, records, strict=True) if r.baseline), None
    )
    held = [c for _, c in launches if c > 0]
    best = best_launch(study)
    compared = [r for t, r in records if r.baseline or (best is not None and t is best)]
    widths = [w for r in compared if (w := _bracket_width(r)) is not None]
    return defaults_sentence(
        baseline,
        max(held) if held else None,
        len(launches),
        resolution=resolution,
        unit=_capacity_unit(records) if has_capacity else _unit(study, metric),
        resolved=max([resolution, *widths]),
    )


def _unit(study: optuna.Study, metric: str) -> str:
    """``metric``'s unit; capacity per GPU is per engine rank on a CPU target (no GPUs)."""
    unit = _UNITS.get(metric, metric)
    identity = StudyRecord.from_attrs(study.user_attrs, study.study_name).identity or {}
    if str(identity.get("target", "")).startswith("cpu"):
        unit = unit.replace("per GPU", "per engine rank")
    return unit


def _capacity_unit(records: list[tuple[Any, TrialRecord]]) -> str:
    """The unit the launches measured capacity in (a closed loop's concurrency, a trace's
    replay speed), req/s unless recorded."""
    for _, r in records:
        unit = getattr(getattr(r, "capacity", None), "unit", None)
        if isinstance(unit, str) and unit:
            return unit
    return _UNITS["capacity"]


def _bracket_width(r: TrialRecord) -> float | None:
    """How wide the launch's capacity bracket stayed, relative to its low edge (None: no
    bracket, e.g. no level met or none missed)."""
    cap: Any = getattr(r, "capacity", None)
    low, high = getattr(cap, "low", None), getattr(cap, "high", None)
    if not isinstance(low, int | float) or not isinstance(high, int | float) or low <= 0:
        return None
    return float(high - low) / float(low)
