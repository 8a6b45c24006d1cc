"""How far below the SLA's own load a launch that missed there still holds every limit.

A launch whose first level (the SLA's own load) missed has capacity 0, which says nothing of
how far off it is: 12 % over a p99 TPOT limit and ten times over look the same. When the miss
is on limits that less load relieves (:func:`relieved_by_less_load`: latency, errors, an
engine that fell behind; not peak memory, which the engine reserves at start, nor a minimum
throughput, which less load only lowers), the launch goes on downward, on the engine already
running, and finds the highest load at which every limit holds: the *sustainable* load. It is
no capacity (the capacity stays 0) but it tells how far short the config is and how many
data-parallel copies of it the SLA's load would take.

GPU minutes matter more than precision here, so the search is coarse and short: at most
:data:`SUSTAINABLE_LEVELS` levels (and never past the launch's ``tune.max_levels``), to a
relative resolution of :data:`SUSTAINABLE_RESOLUTION`. It is the capacity search of
:mod:`autotuner.measure.capacity` seeded with the first level's miss: it steps down by
``tune.rate_step`` until a level holds, then places the next level where the margins'
interpolation puts the edge (one or two levels): on synthetic linear and queueing margins a
config 12 % short is placed within 15 % under its edge in three levels
(tests/unit/measure/test_sustainable.py). An undecided level is not measured again
(it counts as a miss, as in the capacity search). A level that misses a limit less load cannot
fix ends the search (lower loads would miss it too), and so does one that misses by as much
as the level above it: the miss does not follow the load (requests that fail at any rate).
"""

from __future__ import annotations

from collections.abc import Mapping

from autotuner.measure.capacity import CapacitySearch
from autotuner.measure.levels import LOAD_INDEPENDENT
from autotuner.measure.quantile import Outcome
from autotuner.records.trial import SustainableRecord
from autotuner.sla.spec import Sla

SUSTAINABLE_LEVELS = 3  # most levels a launch spends below the SLA's own load
SUSTAINABLE_RESOLUTION = 0.10  # coarse: the answer is a shortfall and a replica count


def relieved_by_less_load(sla: Sla, verdicts: Mapping[str, Outcome]) -> bool:
    """Whether every limit a level missed is one that less load can bring within its limit:
    an upper bound on a latency or the error rate (not on peak memory), never a lower bound
    (a minimum goodput or token rate falls with the load). A level that missed only because
    the engine fell behind its load (every constraint met) is relieved by less load too."""
    by_key = {c.key: c for c in sla.constraints}
    for key, verdict in verdicts.items():
        if verdict != "misses":
            continue
        c = by_key.get(key)
        if c is None or c.bound != "max" or c.metric in LOAD_INDEPENDENT:
            return False
    return True


class SustainableSearch:
    """The highest load below ``target`` that meets every limit (see the module docstring).

    Same protocol as :class:`~autotuner.measure.capacity.CapacitySearch`: ``next_rate()``,
    ``record(rate, verdict, margin, relieved, missed_by)`` until ``next_rate()`` is None,
    then ``result()``. ``margin`` is the first level's search margin at ``target`` (None:
    unknown), ``missed_by`` the largest point margin of the limits it missed (what shows
    whether less load shrinks the miss; the search margin where not given).
    """

    def __init__(
        self,
        target: float,
        margin: float | None,
        *,
        missed_by: float | None = None,
        step: float = 1.5,
        max_levels: int = SUSTAINABLE_LEVELS,
        resolution: float = SUSTAINABLE_RESOLUTION,
        quantum: float | None = None,
        unit: str = "req/s",
    ) -> None:
        if max_levels < 1:
            raise ValueError(f"max_levels must be >= 1, got {max_levels}")
        self.target = target
        self.unit = unit
        self.budget = max_levels
        self._search = CapacitySearch(
            target,
            resolution=resolution,
            max_levels=max_levels + 1,  # the first level, already measured, counts as one
            step=step,
            min_rate=0.0,
            quantum=quantum,
            remeasure_undecided=0,
            unit=unit,
        )
        self._search.record(target, "misses", margin)
        self._blocked = False  # a level showed that less load does not fix the miss
        self._by_points = missed_by is not None
        # how much the lowest level that missed so far missed by
        self._last_miss = missed_by if self._by_points else margin

    @property
    def extending(self) -> bool:
        return False  # undecided levels are not measured again here

    def next_rate(self) -> float | None:
        """The next load to measure, or None when the search is over."""
        if self._blocked:
            return None
        return self._search.next_rate()

    def record(
        self,
        rate: float,
        verdict: Outcome,
        margin: float | None,
        relieved: bool = True,
        missed_by: float | None = None,
    ) -> None:
        """Feed back one level; ``relieved``: whether less load could fix what it missed."""
        self._search.record(rate, verdict, margin)
        if verdict != "misses" or rate > self.target:
            return
        by = missed_by if self._by_points else margin
        if not relieved:
            self._blocked = True
        elif self._below_all(rate) and by is not None and self._last_miss is not None:
            # Missing by as much at less load: the miss does not follow the load (requests
            # that fail whatever the rate): lower loads would tell no more.
            self._blocked = by >= self._last_miss
        if self._below_all(rate):
            self._last_miss = by

    def _below_all(self, rate: float) -> bool:
        return all(rate <= lv.rate for lv in self._search.levels)

    def result(self) -> SustainableRecord:
        """What was found: the highest load shown to hold, the load above it that missed."""
        cap = self._search.result()
        below = [lv.rate for lv in cap.levels[1:]]  # the first level is the SLA's own load
        # resolution, budget, infeasible (missed down to the lowest load there is: one
        # request in flight), undecided, or not_by_load
        stopped = "not_by_load" if self._blocked else str(cap.stopped_by)
        return SustainableRecord(
            value=cap.low,
            high=cap.high if cap.low > 0 else None,
            target=self.target,
            unit=self.unit,
            lowest=min(below, default=self.target),
            levels=len(below),
            stopped_by=stopped,
        )
