"""Distribution-free confidence bounds for a percentile, from order statistics.

A load level's p99 is one order statistic of n request latencies; whether the engine's *true*
p99 at that load is under the SLA's limit is a question about the population, and with few
requests the sample cannot answer it (a p99 from 30 requests is the sample's maximum). This
module says how far the sample does answer it, without assuming a latency distribution.

Theory. Let q be the p-quantile of the latency distribution and X_(1) <= ... <= X_(n) the
sorted samples. The number B of samples below q is Binomial(n, p) (for a discrete
distribution it is stochastically smaller, which only makes the bounds below conservative).
X_(u) >= q unless at least u samples fall below q, so P(X_(u) >= q) >= P(B <= u - 1): the
upper bound at confidence c is X_(u) for the smallest u with P(B <= u - 1) >= c. It does not
exist when even u = n falls short, P(B <= n - 1) = 1 - p^n < c: for p99 at 95 % that is n < 299
(:func:`requests_needed`). The lower bound mirrors it: X_(l) for the largest l with
P(B >= l) >= c, which needs 1 - (1 - p)^n >= c.

Each bound is one-sided at ``confidence``, because each verdict is a one-sided test: ``meets``
(upper bound <= limit) is wrong with probability at most 1 - confidence, and so is ``misses``
(lower bound > limit). Together the bounds form a two-sided interval at 2 * confidence - 1;
``two_sided=True`` gives each side (1 + confidence) / 2 instead, for an interval to report.

Binomial sums are exact sums of log-space terms (``math.lgamma``), taken over the window where
the mass lies; Bernstein's inequality bounds the mass outside it by 1e-18, so n = 100 000 costs
a few hundred terms instead of 100 000. A sum within 1e-12 of the confidence counts as reaching
it, so that exact ties (p = confidence at n = 1) go the way exact arithmetic sends them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Outcome = Literal["meets", "misses", "undecided"]
Bound = Literal["max", "min"]

# Bernstein: P(|B - np| >= t) <= 2 exp(-t^2 / (2 (var + t / 3))); this t makes it <= 2e-18.
_TAIL_EXPONENT = 41.45  # -ln(1e-18)
_MAX_CONFIDENCE = 1 - 1e-9  # beyond this the window's neglected mass would matter
_TIE = 1e-12  # a sum within this of the confidence reaches it (exact ties such as p == c, n == 1)


@dataclass(frozen=True)
class Ranks:
    """1-based ranks of the order statistics that bound the p-quantile (None: no bound)."""

    lower: int | None
    upper: int | None


@dataclass(frozen=True)
class QuantileInterval:
    """Confidence bounds for the p-quantile of the population a sample came from.

    ``confidence`` is per bound (see the module docstring); ``lower``/``upper`` are None when
    ``n`` is too small for that bound to exist.
    """

    p: float
    confidence: float
    n: int
    lower: float | None
    upper: float | None
    lower_rank: int | None
    upper_rank: int | None

    def verdict(self, limit: float, bound: Bound = "max") -> Outcome:
        """``meets``/``misses`` only when the bounds are clear of ``limit``, else ``undecided``.

        ``bound="max"`` is a limit the percentile must stay at or under (latencies);
        ``bound="min"`` one it must reach.
        """
        if bound == "max":
            if self.upper is not None and self.upper <= limit:
                return "meets"
            if self.lower is not None and self.lower > limit:
                return "misses"
            return "undecided"
        if self.lower is not None and self.lower >= limit:
            return "meets"
        if self.upper is not None and self.upper < limit:
            return "misses"
        return "undecided"

    def exceedances_allowed(self) -> int | None:
        """How many samples may lie above a ``max`` limit for ``meets`` (None: none can)."""
        return None if self.upper_rank is None else self.n - self.upper_rank


def _check_p(p: float) -> None:
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be strictly between 0 and 1 (0.99 for p99), got {p!r}")


def _check_confidence(confidence: float) -> None:
    if not 0.5 <= confidence <= _MAX_CONFIDENCE:
        raise ValueError(f"confidence must be in [0.5, 1 - 1e-9], got {confidence!r}")


def _log_pmf(n: int, k: int, log_p: float, log_q: float, log_n_fact: float) -> float:
    return log_n_fact - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q


def _window(n: int, p: float) -> tuple[int, int]:
    """Ranks k outside [lo, hi] carry less than 1e-18 of Binomial(n, p)'s mass together."""
    mean = n * p
    var = n * p * (1 - p)
    t = _TAIL_EXPONENT / 3 + math.sqrt((_TAIL_EXPONENT / 3) ** 2 + 2 * _TAIL_EXPONENT * var)
    return max(0, math.floor(mean - t)), min(n, math.ceil(mean + t))


@lru_cache(maxsize=4096)
def order_statistic_ranks(n: int, p: float, confidence: float) -> Ranks:
    """Ranks of the one-sided ``confidence`` bounds for the p-quantile from ``n`` samples."""
    _check_p(p)
    _check_confidence(confidence)
    if n < 1:
        return Ranks(None, None)
    lo, hi = _window(n, p)
    log_p, log_q, log_n_fact = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    alpha = 1.0 - confidence
    cdf = 0.0  # P(B <= k); the mass below the window (< 1e-18) is left out
    last_low_ok = lo - 1  # largest k with P(B <= k) <= alpha: lower rank is k + 1
    upper: int | None = None
    for k in range(lo, hi + 1):
        cdf += math.exp(_log_pmf(n, k, log_p, log_q, log_n_fact))
        if cdf <= alpha + _TIE:
            last_low_ok = k
        if cdf >= confidence - _TIE:
            upper = k + 1
            break
    lower = last_low_ok + 1
    return Ranks(
        lower if lower >= 1 else None,
        upper if upper is not None and upper <= n else None,
    )


def quantile_interval(
    samples: Iterable[float],
    p: float,
    confidence: float = 0.95,
    *,
    two_sided: bool = False,
) -> QuantileInterval:
    """Order-statistic bounds for the p-quantile of the population ``samples`` came from.

    ``samples`` need not be sorted. ``two_sided=True`` puts (1 + confidence) / 2 on each side,
    so that the interval covers the quantile with probability ``confidence``.
    """
    _check_p(p)
    _check_confidence(confidence)
    xs = sorted(samples)
    if any(math.isnan(x) for x in xs):
        raise ValueError("samples contain NaN")
    per_side = (1 + confidence) / 2 if two_sided else confidence
    ranks = order_statistic_ranks(len(xs), p, per_side)
    return QuantileInterval(
        p=p,
        confidence=per_side,
        n=len(xs),
        lower=None if ranks.lower is None else xs[ranks.lower - 1],
        upper=None if ranks.upper is None else xs[ranks.upper - 1],
        lower_rank=ranks.lower,
        upper_rank=ranks.upper,
    )


def percentile_verdict(
    samples: Sequence[float],
    p: float,
    limit: float,
    *,
    confidence: float = 0.95,
    bound: Bound = "max",
) -> Outcome:
    """Whether the p-quantile of ``samples``' population meets ``limit`` (see the docstring)."""
    return quantile_interval(samples, p, confidence).verdict(limit, bound)


def combine(outcomes: Iterable[Outcome]) -> Outcome:
    """One level's verdict from its constraints': any miss misses, all meet meets.

    No constraints at all meets (nothing to violate).
    """
    seen = set(outcomes)
    if "misses" in seen:
        return "misses"
    if "undecided" in seen:
        return "undecided"
    return "meets"


def _tail_at_least(n: int, q: float, m: int) -> float:
    """P(Binomial(n, q) >= m), summing the m terms below it (m is small where it is used)."""
    if m <= 0:
        return 1.0
    if m > n:
        return 0.0
    log_q, log_r, log_n_fact = math.log(q), math.log1p(-q), math.lgamma(n + 1)
    below = math.fsum(math.exp(_log_pmf(n, k, log_q, log_r, log_n_fact)) for k in range(m))
    return max(0.0, 1.0 - below)


def requests_needed(p: float, confidence: float = 0.95, exceedances: int = 0) -> int:
    """The fewest samples for which ``meets`` is possible with ``exceedances`` samples above
    the limit (0: the sample's maximum itself must be the upper bound). p99 at 95 %: 299.

    ``meets`` needs the upper rank u <= n - exceedances, i.e. P(B <= n - exceedances - 1) >= c
    for B ~ Binomial(n, p), which is P(Binomial(n, 1 - p) >= exceedances + 1) >= c: it grows
    with n, so the smallest n is found by doubling and bisection.
    """
    _check_p(p)
    _check_confidence(confidence)
    if exceedances < 0:
        raise ValueError(f"exceedances must be >= 0, got {exceedances}")
    need = exceedances + 1

    def enough(n: int) -> bool:
        return _tail_at_least(n, 1 - p, need) >= confidence - _TIE

    hi = need
    while not enough(hi):
        hi *= 2
        if hi > 10**12:  # unreachable for confidence <= 1 - 1e-9 and p >= 1e-12
            raise ValueError(f"no sample size reaches confidence {confidence} for p={p}")
    lo = max(need - 1, hi // 2)  # enough(lo) is False (or lo < need)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi
