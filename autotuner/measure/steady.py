"""Warm-up to steady state before a launch's first measured level (issue 28, section 1).

A freshly started engine may serve its first requests slower (the issue's H200 report; on
the measured H200 workload, docs/benchmarks/warmup.md, the first 50 requests' TTFT was
1.2-1.4 x the warm engine's and their TPOT 1.02-1.04 x, steady after that). So before the
first measured level of a launch (a confirmation replicate is a launch too) the load
generator sends warm-up requests at that level's own load (its arrival rate, or its
concurrency) with prompts of their own, until latency is steady, within a bound.

The rule. Warm-up requests are cut, in send order, into windows of ``window`` requests
(25); a window counts once all of its requests have ended. The engine is steady once the
median TPOT and the median TTFT of the latest window are each no more than ``tolerance``
(10 %) below those of the window before, after at least ``min_windows`` windows (2: 50
requests, what the H200 measurement took at most) and at least the workload's
``warmup_requests`` (the floor). A cold engine gets faster; latency that still falls means it
is still warming up. Latency that rises, or moves within the tolerance, does not prolong the
warm-up: near capacity random arrivals alone move a 50-request window's mean TPOT by up to
30 % either way (10.6 to 21.5 ms at one rate on the H200, identically on a fresh and a warm
engine), so a two-sided rule would rarely end before its bound; medians are used because one
slow request moves a window's mean. A window whose requests all failed, or gave no latency,
is not steady; one whose requests all failed ends the warm-up (``failed``): the engine is not
serving (it may have exited), and the first level will say what happened.

The bound: at most ``max_requests`` (200) requests and ``max_s`` (60 s) of sending, from the
SLA's ``tune.warmup``; then the measured level starts anyway, and the record says the bound
ended the warm-up (``steady: false``). Requests still running when the sending stops are
waited for, so that the first measured level starts from the same state as the later ones,
until ``2 x max_s`` after the warm-up began (at least ``max_s / 2`` more): on an engine far
behind the rate they are cut there (the engine aborts a request its client dropped) instead
of holding the launch for a request time-out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from autotuner.sla.spec import Sla

StopReason = Literal["steady", "max_requests", "max_s", "failed"]


@dataclass(frozen=True)
class SteadyRule:
    """When a warm-up may end (see the module docstring)."""

    floor: int = 0  # the workload's warmup_requests: at least this many
    window: int = 25
    min_windows: int = 2
    tolerance: float = 0.10
    max_requests: int = 200
    max_s: float = 60.0

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_windows < 1 or self.floor < 0:
            raise ValueError("window and min_windows must be >= 1, floor >= 0")
        if not 0 <= self.tolerance < 1 or self.max_requests < 0 or not self.max_s > 0:
            raise ValueError("tolerance in [0, 1), max_requests >= 0, max_s > 0")

    @property
    def least(self) -> int:
        """The fewest warm-up requests: the floor, and the windows the rule compares."""
        return max(self.floor, self.window * self.min_windows)

    @property
    def most(self) -> int:
        """The most warm-up requests: the bound, never below the floor."""
        return max(self.floor, self.max_requests)


def rule_of(sla: Sla, requests: int | None = None) -> SteadyRule | None:
    """The SLA's warm-up rule (``tune.warmup``, ``workload.warmup_requests`` as the floor);
    None when ``tune.warmup.max_requests`` is 0 (only the floor's requests, as before).
    ``requests``: the level's size; a window is at most a quarter of it (at least 5), so
    that a small level (a smoke test of 16 requests) is not preceded by a warm-up three
    times its size; levels sized for a p99 (299 requests and more) use the full window."""
    w = sla.tune.warmup
    if w.max_requests <= 0:
        return None
    window = w.window if requests is None else min(w.window, max(5, requests // 4))
    return SteadyRule(
        floor=sla.workload.warmup_requests,
        window=window,
        tolerance=w.tolerance,
        max_requests=w.max_requests,
        max_s=w.max_s,
    )


@dataclass(frozen=True)
class Window:
    """One window of warm-up requests: medians in ms (None: no request gave one)."""

    tpot_ms: float | None
    ttft_ms: float | None
    failed: int = 0


def window_of(samples: Sequence[tuple[float | None, float | None, bool]]) -> Window:
    """A window from its requests' ``(tpot_s, ttft_s, ok)``."""
    tpots = [t * 1000 for t, _, ok in samples if ok and t is not None]
    ttfts = [f * 1000 for _, f, ok in samples if ok and f is not None]
    return Window(
        statistics.median(tpots) if tpots else None,
        statistics.median(ttfts) if ttfts else None,
        sum(1 for *_, ok in samples if not ok),
    )


def _not_falling(before: float | None, now: float | None, tolerance: float) -> bool:
    if now is None:
        return before is None  # a metric neither window has (one output token) says nothing
    return before is not None and now >= before * (1 - tolerance)


def settled(windows: Sequence[Window], rule: SteadyRule) -> bool:
    """Whether the latest window says the engine is steady (the module docstring's rule)."""
    if len(windows) < max(2, rule.min_windows):
        return False
    before, now = windows[-2], windows[-1]
    if now.tpot_ms is None and now.ttft_ms is None:
        return False
    return _not_falling(before.tpot_ms, now.tpot_ms, rule.tolerance) and _not_falling(
        before.ttft_ms, now.ttft_ms, rule.tolerance
    )


@dataclass(frozen=True)
class WarmupRecord:
    """What a warm-up took: requests sent, wall seconds (sending and the requests still
    running), whether it reached steady state or a bound ended it, at what load."""

    requests: int
    seconds: float
    steady: bool
    stopped_by: StopReason
    load: str  # the load it ran at ("poisson 2.5 req/s", "concurrency 8")
    failed: int = 0
    windows: list[Window] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WarmupRecord:
        windows = [Window(**w) for w in data.get("windows", [])]
        return cls(**{**data, "windows": windows})


def describe(data: dict[str, Any]) -> str:
    """``62 requests, 14.2 s at poisson 4 req/s: steady`` or ``... : not steady (bound: 200
    requests)`` from a recorded warm-up (a trial record's dict)."""
    head = (
        f"{data.get('requests', '?')} requests, {float(data.get('seconds', 0.0)):.1f} s"
        f" at {data.get('load', '?')}"
    )
    if data.get("steady"):
        return f"{head}: steady"
    if data.get("stopped_by") == "failed":
        return f"{head}: not steady (a whole window of its requests failed)"
    bound = {"max_requests": "the request bound", "max_s": "the time bound"}.get(
        str(data.get("stopped_by")), str(data.get("stopped_by"))
    )
    return f"{head}: not steady ({bound} ended it)"
