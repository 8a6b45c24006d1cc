"""Whether an open-loop level lasted long enough to show the engine under a steady load.

A level of N requests sent at a high rate can be over before its first request is: every
request is then in flight at once, none waits for a slot, and the level shows a burst, not
the rate. The quick start (32 output tokens, 30 requests per level, 2 CPU cores with the
load generator on a core of its own) "met" the SLA at 537 req/s with 32 request slots:
the 30 requests left within 0.06 s and each took about 0.25 s, while 32 slots of 0.2 s
requests serve about 160 req/s at most.

The test: the run's send span against the median end-to-end time of its successful requests.
A span shorter than :data:`STEADY_LIFETIMES` lifetimes cannot show the level met (it is
undecided), while a miss stands: a queue that grows within a short level is real. Closed-loop
levels are not judged (their sends wait for completions). A pooled level counts as its
shortest run.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from autotuner.measure.loadgen import LoadResult

# The send span must cover this many request lifetimes: after one lifetime the requests in
# flight stop growing, so at least half of a level is at its steady load.
STEADY_LIFETIMES = 2.0
MIN_REQUESTS = 5  # successful requests needed to tell


@dataclass(frozen=True)
class Span:
    """One run's send span and its requests' median end-to-end time (s)."""

    sent_s: float
    lifetime_s: float

    @property
    def short(self) -> bool:
        return self.sent_s < STEADY_LIFETIMES * self.lifetime_s

    def describe(self) -> str:
        return describe(self.sent_s, self.lifetime_s)


def describe(sent_s: float, lifetime_s: float) -> str:
    """``too short for a steady load: sent over 0.06 s, a request took 0.25 s``."""
    return (
        f"too short for a steady load: sent over {sent_s:.2g} s, a request took "
        f"{lifetime_s:.2g} s (more requests per level: workload.requests)"
    )


def _run_span(result: LoadResult) -> Span | None:
    if result.plan.get("arrival", {}).get("process") == "concurrency":
        return None
    lives = [r.e2e_s for r in result.ok if r.e2e_s is not None]
    if len(lives) < MIN_REQUESTS or len(result.records) < 2:
        return None
    sends = [r.sent_s for r in result.records]
    return Span(max(sends) - min(sends), statistics.median(lives))


def shortest_span(runs: Iterable[LoadResult]) -> Span | None:
    """The run with the fewest lifetimes in its span, of runs pooled into one level."""
    judged = [s for r in runs for part in r.parts() if (s := _run_span(part)) is not None]
    return min(judged, key=lambda s: s.sent_s / max(s.lifetime_s, 1e-9), default=None)
