"""Where the sampler may look after the warm start: near a config that met the SLA.

The warm start (:mod:`autotuner.search.priors`) moves one knob at a time from the best config
so far; what the sampler proposes after it is launched only when it lies within
:data:`NEAR_STEPS` steps of a launch that met the SLA at its own load. Far from every such
launch the sampler has nothing to go on: it has seen too few launches to model the space, and
a config several knobs away misses the SLA more often than not (most of the searched space
does, where a limit binds). A candidate out of reach is pruned before launch with the
nearest feasible launch and its distance as the reason; the sampler sees it pruned and moves
elsewhere. Until some launch meets the SLA nothing is out of reach.

When the sampler proposed ``MOVE_AFTER`` (10, search.study) configs out of reach since the
last launch, the latest is not simply dropped: :func:`into_reach` moves the nearest feasible
config toward it by at most :data:`NEAR_STEPS` steps (its changes in a random order, the last
one part of the way), and that move is launched next. Pruning alone never launched anything
on an H200 study of 12 parameters: a proposal of the first, unmodelled trials changes nearly
every parameter, so 40 in a row lay 7 to 16 steps away and the search stopped as
"exhausted" after 2 launches. The sampler gets its tries first: on spaces of a few knobs it
finds a proposal within reach after a few, and it chooses better than a random move.

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
import random
from collections.abc import Mapping
from dataclasses import dataclass

import optuna

from autotuner.core.types import same_value
from autotuner.records.trial import TrialRecord
from autotuner.search.misses import MissBook
from autotuner.search.study import counted, feasible
from autotuner.space import ParamSpec, ParamValue, SearchSpace

__all__ = ["NEAR_STEPS", "Nearest", "distance", "into_reach", "nearest_feasible", "steps"]

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
    params: dict[str, ParamValue]  # the launch's tuned values as given (the rest: the engine's)


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
        given = TrialRecord.from_trial(t).params_or(t.params)
        d = distance(book.space, mine, book.effective(given))
        if best is None or d < best.steps:
            tuned = {p.name for p in book.space.params}
            best = Nearest(t.number, d, {k: v for k, v in given.items() if k in tuned})
    return best


def into_reach(
    book: MissBook,
    near: Mapping[str, ParamValue],
    suggested: Mapping[str, ParamValue],
    budget: float,
    rng: random.Random,
) -> dict[str, ParamValue] | None:
    """``near`` (a feasible launch's tuned values) moved toward ``suggested`` by at most
    ``budget`` steps: the parameters where they differ, in ``rng``'s order, each taken whole
    while the budget lasts and the next part of the way (a range or a list of numbers). None
    when no move is left (nothing differs, or no step fits)."""
    space = book.space
    start = book.effective(near)
    out = dict(near)
    left = budget
    names = [p for p in space.params if p.name in suggested and space.is_active(p, suggested)]
    rng.shuffle(names)
    for p in names:
        a, b = start[p.name], suggested[p.name]
        cost = steps(p, a, b)
        if cost == 0 or left <= 1e-9:
            continue
        value = b if cost <= left + 1e-9 else _part_way(p, a, b, left)
        if value is not None:
            out[p.name] = value
            left -= steps(p, a, value)
    # A switch the move turned off leaves the parameters it governs to the engine.
    spec = {p.name: p for p in space.params}
    out = {k: v for k, v in out.items() if k not in spec or space.is_active(spec[k], out)}
    moved = distance(space, book.effective(out), start)
    if moved <= 0 or moved > budget + 1e-9:
        return None
    return out


def _part_way(p: ParamSpec, a: ParamValue, b: ParamValue, left: float) -> ParamValue | None:
    """A value of ``p`` from ``a`` toward ``b`` at most ``left`` steps away (a number only)."""
    x, y = _number(a), _number(b)
    if x is None or y is None or x == y:
        return None
    up = y > x
    if p.choices is not None:
        numbers = sorted(n for c in p.choices if (n := _number(c)) is not None)
        here = min(range(len(numbers)), key=lambda i: abs(numbers[i] - x))
        moves = int(left + 1e-9)
        if moves < 1:
            return None
        i = min(here + moves, len(numbers) - 1) if up else max(here - moves, 0)
        match = [c for c in p.choices if _number(c) == numbers[i]]
        return match[0] if match and i != here else None
    if p.low is None or p.high is None:
        return None
    low, high = float(p.low), float(p.high)
    target: float
    if p.log and x > 0:
        target = x * 2.0 ** (left if up else -left)
    else:
        target = x + (left if up else -left) * (high - low) / 4
    target = min(max(target, low), high)
    grid = float(p.step) if p.step else (1.0 if p.type == "int" else 0.0)
    if grid:  # round toward the start, so the rounded value stays within ``left``
        k = (target - low) / grid
        target = low + float(math.floor(k + 1e-9) if up else math.ceil(k - 1e-9)) * grid
    if target == x:
        return None
    if p.type == "int":
        return round(target)
    return round(target, 10)
