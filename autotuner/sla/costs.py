"""What a run costs, in the numbers the whole-SLA checks and their messages use: the requests a
percentile needs, the points of a grid, durations and counts as text."""

from __future__ import annotations

import math

from autotuner.space import SearchSpec

_TIE = 1e-12  # as autotuner.measure.quantile: a sum this close to the confidence reaches it


def percentile_requests(p: float, confidence: float) -> int:
    """The fewest requests with which a level can show its p-quantile (0 < p < 1) met at
    ``confidence``: the least n with 1 - p**n >= confidence (the level's maximum is then the
    quantile's upper confidence bound). The closed form of
    ``autotuner.measure.quantile.requests_needed`` without exceedances (a test keeps the two
    equal), here so that the schema knows how many requests a level sends."""
    target = 1 - confidence + _TIE
    n = max(1, math.ceil(math.log(target) / math.log(p)))
    while n > 1 and p ** (n - 1) <= target:
        n -= 1
    while p**n > target:
        n += 1
    return n


def span(seconds: float) -> str:
    """A duration for messages: ``299000`` -> ``83.1 h (299,000 s)``, ``90`` -> ``90 s``."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    unit, size = ("min", 60) if seconds < 3600 else ("h", 3600)
    if seconds >= 3 * 86400:
        unit, size = "days", 86400
    head = f"{seconds / size:.3g} {unit}"
    return f"{head} ({seconds:,.0f} s)" if seconds < 1e9 else head


def show_count(n: int) -> str:
    """A count for messages, without writing out a number of thousands of digits."""
    return f"{n:,}" if n < 10**15 else f"about 10^{math.floor(math.log10(n))}"


def grid_points(search: SearchSpec) -> int:
    """Points of a grid study over ``search.params``: the product of the sizes of their
    ``values`` lists, counted without listing the points (the baseline is one launch more)."""
    return math.prod(len(o.values) for o in search.params.values() if o.values is not None)
