"""Where the sampler may look after the warm start: near a config that met the SLA.

The warm start (:mod:`autotuner.search.priors`) moves one knob at a time from the best config
so far; what the sampler proposes after it is launched only when it lies within
:data:`NEAR_STEPS` steps of a launch that met the SLA at its own load. Far from every such
launch the sampler has nothing to go on: it has seen too few launches to model the space, and
a config several knobs away misses the SLA more often than not (most of the searched space
does, where a limit binds). A candidate out of reach is pruned before launch with the
nearest feasible launch and its distance as the reason; the sampler sees it pruned and moves
elsewhere. Until some launch meets the SLA nothing is out of reach.

Steps between two values of one parameter (:func:`steps`):

* equal: 0; either unknown (left to an engine whose default is not known) or not numeric
  (a flag, a mode): 1 when they differ;
* numbers from a list of choices: how many choices apart they are in ascending order;
* a range on a log scale: one step per factor of two; a linear range: one step per quarter
  of the range.

A parameter that one of the two configs switches off (``when:``) does not count: the switch
that turns it off does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import optuna

from autotuner.core.types import same_value
from autotuner.records.trial import TrialRecord
from autotuner.search.misses import MissBook
from autotuner.search.study import counted, feasible
from autotuner.space import ParamSpec, ParamValue, SearchSpace

__all__ = ["NEAR_STEPS", "Nearest", "distance", "nearest_feasible", "steps"]

# How far (in steps, summed over parameters) a sampled candidate may lie from a launch that
# met the SLA: a knob two steps, or two knobs one step each.
NEAR_STEPS = 2.0


def _number(v: ParamValue) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def steps(p: ParamSpec, a: ParamValue, b: ParamValue) -> float:
    """Steps between values ``a`` and ``b`` of ``p`` (see the module docstring)."""
    if same_value(a, b):
        return 0.0
    x, y = _number(a), _number(b)
    if x is None or y is None:
        return 1.0
    if p.choices is not None:
        numbers = sorted(n for c in p.choices if (n := _number(c)) is not None)
        if not numbers:
            return 1.0

        def index(v: float) -> int:
            return min(range(len(numbers)), key=lambda i: abs(numbers[i] - v))

        return float(abs(index(x) - index(y))) or 1.0
    if p.log and x > 0 and y > 0:
        return abs(math.log2(x / y))
    if p.low is not None and p.high is not None and p.high > p.low:
        return abs(x - y) / ((float(p.high) - float(p.low)) / 4)
    return 1.0


def distance(space: SearchSpace, a: Mapping[str, ParamValue], b: Mapping[str, ParamValue]) -> float:
    """Steps between two configs' effective values, summed over the tuned parameters that
    both leave switched on."""
    total = 0.0
    for p in space.params:
        if space.is_active(p, a) and space.is_active(p, b):
            total += steps(p, a.get(p.name), b.get(p.name))
    return total


@dataclass(frozen=True)
class Nearest:
    """The feasible launch nearest a candidate, and how many steps away it is."""

    trial: int
    steps: float


def nearest_feasible(
    study: optuna.Study, book: MissBook, suggested: Mapping[str, ParamValue]
) -> Nearest | None:
    """The launch of ``study`` that met the SLA nearest to ``suggested`` (effective values on
    both sides, through ``book``); None while no launch met it."""
    mine = book.effective(suggested)
    best: Nearest | None = None
    for t in study.get_trials(deepcopy=False):
        if not (counted(t) and feasible(t)):
            continue
        theirs = book.effective(TrialRecord.from_trial(t).params_or(t.params))
        d = distance(book.space, mine, theirs)
        if best is None or d < best.steps:
            best = Nearest(t.number, d)
    return best
