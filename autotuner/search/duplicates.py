"""Near-duplicates: a candidate the measurement could not tell from a config already measured.

A launch resolves a config's latencies and capacity to a few per cent. A candidate that
differs from a measured config only by less than that in every knob it changes (``max_num_seqs``
33 after 34, 43 after 44) would measure the same config again, minutes of GPU for nothing:
it is not launched, and the measured config's result stands for it (the study loop reuses it
as it reuses an exact repeat, and says which config stood for it).

Per knob, in the steps of :mod:`autotuner.search.nearby` (a factor of two on a log range, a
quarter of a linear range, one choice of a list, a flipped flag): a change below
:data:`DUPLICATE_STEPS` is within the resolution. On a log range that is a change of less than
about 11 % (a slot count 10 % smaller moves the decode batch of a burst by at most that much,
and so the p99 TPOT by less, about what one launch resolves); one choice of a list or a flag is
a whole step, never a duplicate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from autotuner.core.show import show_value
from autotuner.records.trial import TrialRecord
from autotuner.search.misses import MissBook
from autotuner.search.nearby import steps
from autotuner.search.study import counted, fresh_from
from autotuner.space import ParamValue

__all__ = ["DUPLICATE_STEPS", "NearDuplicate", "near_duplicate"]

DUPLICATE_STEPS = 0.15  # 2**0.15 = 1.11: a log-range knob changed by less than ~11 %


@dataclass(frozen=True)
class NearDuplicate:
    """The measured trial that stands for a candidate, and how they differ."""

    trial: int
    differences: tuple[str, ...]  # "max_num_seqs 34 (trial 5: 33)"; empty: the same config

    def describe(self) -> str:
        if not self.differences:
            return f"the same config as trial {self.trial} in effect"
        return (
            f"within the measurement's resolution of trial {self.trial} "
            f"({', '.join(self.differences)})"
        )


def near_duplicate(
    study: optuna.Study,
    book: MissBook,
    suggested: Mapping[str, ParamValue],
    limit: float = DUPLICATE_STEPS,
) -> NearDuplicate | None:
    """The measured launch (complete, since a re-tune began) that stands for ``suggested``:
    every tuned knob within ``limit`` steps of it (effective values on both sides: a value the
    engine takes by default equals that default); the nearest when several do. None: launch
    it."""
    space = book.space
    mine = book.effective(suggested)
    since = fresh_from(study)
    found: tuple[float, NearDuplicate] | None = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.number < since or not counted(t):
            continue
        theirs = book.effective(TrialRecord.from_trial(t).params_or(t.params))
        total, differences, near = 0.0, [], True
        for p in space.params:
            if not (space.is_active(p, mine) and space.is_active(p, theirs)):
                if space.is_active(p, mine) != space.is_active(p, theirs):
                    near = False
                    break
                continue
            a, b = mine.get(p.name), theirs.get(p.name)
            d = steps(p, a, b)
            if d >= limit:
                near = False
                break
            if d > 0:
                total += d
                differences.append(f"{p.name} {show_value(a)} (trial {t.number}: {show_value(b)})")
        if near and (found is None or total < found[0]):
            found = (total, NearDuplicate(t.number, tuple(differences)))
    return None if found is None else found[1]
