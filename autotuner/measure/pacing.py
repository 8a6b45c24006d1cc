"""Whether the load generator offered a level the rate it was scheduled to.

Every request records how late it left against its scheduled send time (``lag_s``). A client
that cannot keep up sends the level over a longer span than its schedule: the engine is
offered less than the level claims, and a level that meets the SLA then claims a rate that was
never shown. On 2 CPU cores the engine competes with the client for the cores: a 40-request
level scheduled at 64 req/s left at 24.7 req/s (34 % of its schedule's rate over the level,
sends up to 1.07 s late), and a level of random 128-token prompts scheduled at 25.6 req/s left
at 18.6 while its launch's "capacity" looked three times that of the same engine without
prefix caching.

The test is the rate kept: the schedule's span over the span the sends took, for the same
requests. Sends that leave late and catch up (a client stalled for 0.1-0.3 s, then sending the
requests due meanwhile at once: seen on 2 cores at 11-17 req/s) keep the rate; they make the
arrivals burstier, which makes a level harder to meet, not easier, so such a level stands. A
level whose rate kept fell more than :data:`PACE_TOLERANCE` short is undecided.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from autotuner.measure.loadgen import LoadResult

PACE_TOLERANCE = 0.05  # the sends may take this much longer than scheduled before it counts


@dataclass(frozen=True)
class Pacing:
    """How one run's sends kept to their schedule."""

    kept: float  # the schedule's span over the span the sends took (1: on schedule)
    max_lag_s: float  # the latest send's lag behind its schedule

    @property
    def behind(self) -> bool:
        return self.kept < 1 - PACE_TOLERANCE

    def describe(self) -> str:
        """``load generator behind: sent at 34% of the scheduled rate (sends up to 1.1 s late)``."""
        return describe(self.kept, self.max_lag_s)


def describe(kept: float, max_lag_s: float) -> str:
    return (
        f"load generator behind: sent at {kept:.0%} of the scheduled rate "
        f"(sends up to {max_lag_s:.2g} s late)"
    )


def pacing(result: LoadResult) -> Pacing | None:
    """The run's pacing; None when fewer than two requests were sent, or all at once. A
    pooled level: its run that kept its schedule least (:func:`worst_pacing`)."""
    return worst_pacing((result,))


def _run_pacing(result: LoadResult) -> Pacing | None:
    """:func:`pacing` of one run (its send times from its own start)."""
    records = result.records
    if len(records) < 2:
        return None
    lags = np.array([r.lag_s for r in records], dtype=float)
    sent = np.array([r.sent_s for r in records], dtype=float)
    scheduled, took = float(np.ptp(sent - lags)), float(np.ptp(sent))
    if scheduled <= 0 or took <= 0:
        return None
    return Pacing(min(1.0, scheduled / took), float(lags.max()))


def worst_pacing(runs: Iterable[LoadResult]) -> Pacing | None:
    """The run that kept its schedule least, of runs pooled into one level (a pooled result
    counts as its runs)."""
    judged = [p for r in runs for part in r.parts() if (p := _run_pacing(part)) is not None]
    return min(judged, key=lambda p: p.kept, default=None)
