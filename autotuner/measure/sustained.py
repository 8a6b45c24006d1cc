"""Whether the engine kept up with the load a level offered.

An open-loop level sends on schedule whatever the engine does; an engine that serves less than
it is sent builds a queue, and each request waits longer than the one before. A short level
can end before that wait reaches a loose latency limit: on 2 CPU cores a 40-request level
offered 17.1 req/s "met" a loose TTFT limit while the engine served 7.5-10 req/s. So a
level's verdict also asks whether the engine kept up.

The criterion is the slope of the successful requests' first-token times (send + TTFT)
against their send times, fitted by least squares: the rate at which the engine took requests
up, against the rate it was sent them. An engine that keeps up starts each request one
(stationary) TTFT after its send, whatever that TTFT is: slope 1, so neither a level's length
nor the latency of its last requests biases it. One that takes up ``mu`` req/s of ``lambda``
sent starts the i-th request near ``i / mu`` while sending it at ``i / lambda``: slope
``lambda / mu``. So the rate served is the rate sent divided by the slope, and the rate sent is
the one the level realised (its send span), not the nominal one: 30-40 Poisson arrivals stray
15-20 % from it. First tokens, not completions: vLLM batches every request it admits, and an
overloaded batch finishes together, the last-sent requests with the shortest end-to-end
latency (tiny model on 2 CPU cores, 40 requests at 64 req/s: every request done 2.7-3.1 s
after its send, completion slope below 1; its TTFT grew from 0.07 s to 1.6 s over the level).

The engine kept up when it served at least ``1 - SUSTAIN_TOLERANCE`` of what was sent.
Latency that grows while a healthy engine's batch fills at the start of a level tilts the
slope a little; the tolerance covers that. On the tiny model on 2 CPU cores (64-token
prompts, 16 tokens out, about 12 req/s at most) levels of 40 and 100 requests at 2-8 req/s
served 0.99-1.0 of what was sent, at 16 req/s 0.90, at 32 and 64 req/s 0.54 and 0.28.
Closed-loop levels are not judged: their sends wait for completions, so the engine sets the
rate. Fewer than ``MIN_REQUESTS`` successful requests are too few to fit
a slope: no judgement (the error-rate and latency limits still judge such a level).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from autotuner.measure.loadgen import LoadResult

SUSTAIN_TOLERANCE = 0.2  # served may fall this share short of sent before the level misses
MIN_REQUESTS = 5  # successful requests needed to fit the slope


@dataclass(frozen=True)
class Sustained:
    """The rates one level sent and served (req/s), and whether the engine kept up."""

    sent_rate: float
    served_rate: float

    @property
    def ratio(self) -> float:
        """Served over sent (1: kept up exactly)."""
        return self.served_rate / self.sent_rate

    @property
    def ok(self) -> bool:
        return self.ratio >= 1 - SUSTAIN_TOLERANCE

    @property
    def margin(self) -> float:
        """Relative margin like an SLA limit's (> 0: not sustained): the shortfall of the
        served/sent ratio against its lower limit ``1 - SUSTAIN_TOLERANCE``."""
        limit = 1 - SUSTAIN_TOLERANCE
        return (limit - self.ratio) / limit

    def describe(self) -> str:
        return describe(self.sent_rate, self.served_rate, self.ok)


def describe(sent_rate: float, served_rate: float, ok: bool) -> str:
    """``not sustained: served 8.1 of 17.1 req/s sent`` (or ``sustained: ...``)."""
    kept = "sustained" if ok else "not sustained"
    return f"{kept}: served {served_rate:.3g} of {sent_rate:.3g} req/s sent"


def sustained(result: LoadResult) -> Sustained | None:
    """The level's sent and served rates (see the module docstring); None for a closed-loop
    level or one with too few successful requests to tell. A pooled level: its run that kept
    up least (:func:`least_sustained`)."""
    return least_sustained((result,))


def _run_sustained(result: LoadResult) -> Sustained | None:
    """:func:`sustained` of one run (its send times from its own start)."""
    if result.plan.get("arrival", {}).get("process") == "concurrency":
        return None
    sends = np.array([r.sent_s for r in result.records], dtype=float)
    done = [r for r in result.ok if r.ttft_s is not None]
    if len(done) < MIN_REQUESTS:
        return None
    span = float(sends.max() - sends.min())
    x = np.array([r.sent_s for r in done], dtype=float)
    if span <= 0 or float(np.ptp(x)) <= 0:
        return None
    y = x + np.array([r.ttft_s for r in done], dtype=float)
    slope = float(np.polyfit(x, y, 1)[0])
    sent = (len(sends) - 1) / span
    # A slope at or below 1 (TTFT falling over the level): served all it was sent.
    return Sustained(sent, sent / max(slope, 1.0))


def least_sustained(runs: Iterable[LoadResult]) -> Sustained | None:
    """The run that kept up least, of runs at one load pooled into one level (each run is
    judged on its own: their send times all start at 0; a pooled result counts as its runs)."""
    judged = [k for r in runs for p in r.parts() if (k := _run_sustained(p)) is not None]
    return min(judged, key=lambda k: k.ratio, default=None)
