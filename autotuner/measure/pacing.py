"""Whether the load generator sent a level on schedule.

Every request records how late it left against its scheduled send time (``lag_s``). A client
that falls behind offers less load than the level claims, and reads its streams late, which
adds its own delay to every latency it measures: such a level says nothing about the engine
either way. On 2 CPU cores the engine competes with the client for the cores: a 40-request
level scheduled at 64 req/s left at 24.7 req/s (sends up to 1.07 s late, p90 0.29 s), and a
level on random 128-token prompts at 25.6 req/s showed sends up to 0.47 s late while its
"capacity" looked three times that of the same engine without prefix caching.

A send is late when it left more than :data:`LATE_FLOOR_S` or one mean scheduled inter-arrival
time after its schedule, whichever is longer (a Poisson schedule already strays by that much;
asyncio timers and a busy event loop stray by a few milliseconds). The generator was behind when
more than :data:`LATE_SHARE` of the level's sends were late: a single stall of the client
delays every send due during it, so a share, not the worst send, is the test.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from autotuner.measure.loadgen import LoadResult

LATE_FLOOR_S = 0.05  # never call a send late below this lag
LATE_SHARE = 0.1  # the generator is behind when more than this share of sends is late


@dataclass(frozen=True)
class Pacing:
    """How one run's sends kept to their schedule."""

    sends: int
    late: int  # sends that left more than ``allowance_s`` after their schedule
    allowance_s: float
    max_lag_s: float

    @property
    def behind(self) -> bool:
        return self.late > LATE_SHARE * self.sends

    def describe(self) -> str:
        """``load generator behind: 78% of sends over 50 ms late (worst 1.1 s)``."""
        return describe(self.late / self.sends, self.allowance_s, self.max_lag_s)


def describe(late_share: float, allowance_s: float, max_lag_s: float) -> str:
    return (
        f"load generator behind: {late_share:.0%} of sends over {allowance_s * 1000:.0f} ms late "
        f"(worst {max_lag_s:.2g} s)"
    )


def pacing(result: LoadResult) -> Pacing | None:
    """The run's pacing; None when it sent fewer than two requests."""
    records = result.records
    if len(records) < 2:
        return None
    lags = np.array([r.lag_s for r in records], dtype=float)
    scheduled = np.array([r.sent_s for r in records], dtype=float) - lags
    gap = float(np.ptp(scheduled)) / (len(records) - 1)
    allowance = max(LATE_FLOOR_S, gap)
    return Pacing(len(records), int(np.sum(lags > allowance)), allowance, float(lags.max()))


def worst_pacing(runs: Iterable[LoadResult]) -> Pacing | None:
    """The run whose sends were late most often, of runs pooled into one level."""
    judged = [p for r in runs if (p := pacing(r)) is not None]
    return max(judged, key=lambda p: p.late / p.sends, default=None)
