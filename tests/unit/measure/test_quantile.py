"""Order-statistic confidence bounds for percentiles, and the three-way verdict."""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pytest

from autotuner.measure.quantile import (
    Ranks,
    combine,
    order_statistic_ranks,
    percentile_verdict,
    quantile_interval,
    requests_needed,
)


def exact_ranks(n: int, p: Fraction, c: Fraction) -> Ranks:
    """The rank definitions, in exact rational arithmetic."""
    cdf = []
    total = Fraction(0)
    for k in range(n + 1):
        total += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        cdf.append(total)  # P(B <= k)
    upper = next((u for u in range(1, n + 1) if cdf[u - 1] >= c), None)
    lower = max((ell for ell in range(1, n + 1) if 1 - cdf[ell - 1] >= c), default=None)
    return Ranks(lower, upper)


@pytest.mark.parametrize("p", ["1/2", "9/10", "19/20", "99/100"])
@pytest.mark.parametrize("c", ["9/10", "19/20", "99/100"])
def test_ranks_match_exact_rational_binomial_sums(p: str, c: str) -> None:
    pf, cf = Fraction(p), Fraction(c)
    for n in [*range(1, 41), 57, 80, 123]:
        assert order_statistic_ranks(n, float(pf), float(cf)) == exact_ranks(n, pf, cf), n


def test_p99_from_30_requests_has_no_upper_bound() -> None:
    r = order_statistic_ranks(30, 0.99, 0.95)
    # P(B >= 29) = 0.99^30 + 30 * 0.01 * 0.99^29 = 0.964 >= 0.95; P(B = 30) = 0.740 < 0.95
    assert r == Ranks(lower=29, upper=None)


def test_thirty_requests_one_slow_is_undecided_two_slow_misses() -> None:
    fast = [100.0 + i for i in range(28)]
    assert percentile_verdict([*fast, 150.0, 190.0], 0.99, 200.0) == "undecided"  # none over
    assert percentile_verdict([*fast, 150.0, 900.0], 0.99, 200.0) == "undecided"  # 1 in 30
    assert percentile_verdict([*fast, 800.0, 900.0], 0.99, 200.0) == "misses"  # 2 in 30
    assert percentile_verdict([*fast[:25], *[500.0] * 5], 0.99, 200.0) == "misses"


def test_p99_needs_299_requests_for_a_meets_at_95_percent() -> None:
    assert requests_needed(0.99, 0.95) == 299
    assert order_statistic_ranks(299, 0.99, 0.95).upper == 299  # the maximum itself
    assert order_statistic_ranks(298, 0.99, 0.95).upper is None
    xs = [float(i) for i in range(299)]
    assert quantile_interval(xs, 0.99).verdict(298.0) == "meets"
    assert quantile_interval(xs, 0.99).verdict(297.9) == "undecided"
    assert quantile_interval(xs[:-1], 0.99).verdict(1e9) == "undecided"  # 298: never meets


def test_median_of_ten_is_bounded_by_the_second_and_ninth() -> None:
    # Binomial(10, 1/2): P(B <= 7) = 0.945 < 0.95 <= P(B <= 8) = 0.989; symmetric below.
    assert order_statistic_ranks(10, 0.5, 0.95) == Ranks(2, 9)
    iv = quantile_interval([10.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0, 5.0], 0.5)
    assert (iv.lower, iv.upper) == (2.0, 9.0)  # unsorted input is sorted first


@pytest.mark.parametrize("p", [0.9, 0.95, 0.99, 0.999])
@pytest.mark.parametrize("exceedances", [0, 1, 3])
def test_requests_needed_is_the_smallest_n_that_can_meet(p: float, exceedances: int) -> None:
    n = requests_needed(p, 0.95, exceedances)
    upper = order_statistic_ranks(n, p, 0.95).upper
    assert upper is not None and upper <= n - exceedances
    before = order_statistic_ranks(n - 1, p, 0.95).upper
    assert before is None or before > n - 1 - exceedances


def test_requests_needed_known_values() -> None:
    assert requests_needed(0.5, 0.95) == 5  # 1 - 0.5^5 = 0.969; 0.5^4 = 0.0625 > 0.05
    assert requests_needed(0.9, 0.95) == 29  # ln 0.05 / ln 0.9 = 28.4
    assert requests_needed(0.99, 0.95, exceedances=1) == 473


def test_large_n_is_fast_and_close_to_the_normal_approximation() -> None:
    started = time.perf_counter()
    r = order_statistic_ranks(100_000, 0.9899, 0.95)  # a p not cached by another test
    assert time.perf_counter() - started < 0.2
    mean, sd = 100_000 * 0.9899, math.sqrt(100_000 * 0.9899 * 0.0101)
    assert r.upper is not None and r.lower is not None
    assert abs(r.upper - (mean + 1.645 * sd)) < 3
    assert abs(r.lower - (mean - 1.645 * sd)) < 3
    started = time.perf_counter()
    assert requests_needed(0.9999, 0.99, exceedances=20) > 100_000
    assert time.perf_counter() - started < 0.5


def _exact_coverage_upper(n: int, p: float, u: int) -> float:
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(u))


@pytest.mark.parametrize(("n", "p"), [(300, 0.99), (500, 0.95), (60, 0.5)])
def test_monte_carlo_coverage_matches_the_binomial(n: int, p: float) -> None:
    rng = np.random.default_rng(20240601 + n)
    trials = 4000
    truth = -math.log(1 - p)  # the p-quantile of Exponential(1)
    samples = np.sort(rng.exponential(size=(trials, n)), axis=1)
    r = order_statistic_ranks(n, p, 0.95)
    assert r.upper is not None and r.lower is not None
    up_cover = float(np.mean(samples[:, r.upper - 1] >= truth))
    low_cover = float(np.mean(samples[:, r.lower - 1] <= truth))
    sigma = math.sqrt(0.05 * 0.95 / trials)
    assert up_cover >= 0.95 - 3 * sigma
    assert low_cover >= 0.95 - 3 * sigma
    # and not by luck: the observed coverage is the exact one, within Monte-Carlo noise
    exact_up = _exact_coverage_upper(n, p, r.upper)
    assert abs(up_cover - exact_up) < 4 * sigma
    both = float(np.mean((samples[:, r.lower - 1] <= truth) & (samples[:, r.upper - 1] >= truth)))
    assert both >= 0.90 - 3 * math.sqrt(0.1 * 0.9 / trials)


def test_two_sided_interval_covers_at_the_stated_confidence() -> None:
    rng = np.random.default_rng(7)
    n, p, trials = 400, 0.95, 3000
    truth = float(np.exp(1.6448536269514722))  # lognormal(0, 1) 95th percentile
    hits = 0
    for _ in range(trials):
        iv = quantile_interval(rng.lognormal(size=n).tolist(), p, 0.95, two_sided=True)
        assert iv.confidence == pytest.approx(0.975)
        assert iv.lower is not None and iv.upper is not None
        hits += iv.lower <= truth <= iv.upper
    assert hits / trials >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / trials)


def test_ties_of_a_discrete_distribution_stay_conservative() -> None:
    rng = np.random.default_rng(3)
    values, probs = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.6, 0.3, 0.08, 0.02])
    truth = 4.0  # P(X <= 3) = 0.98 < 0.99 <= P(X <= 4): the p99 is 4
    misses = 0
    for _ in range(1000):
        iv = quantile_interval(rng.choice(values, size=400, p=probs).tolist(), 0.99)
        misses += iv.verdict(truth - 0.5) == "meets"  # wrongly says p99 <= 3.5
    assert misses / 1000 <= 0.05


def test_verdict_for_a_lower_limit() -> None:
    xs = [float(i) for i in range(1, 101)]  # median bounds: ranks 42 and 59 at n=100
    iv = quantile_interval(xs, 0.5)
    assert (iv.lower_rank, iv.upper_rank) == (42, 59)
    assert iv.verdict(40.0, "min") == "meets"
    assert iv.verdict(60.0, "min") == "misses"
    assert iv.verdict(50.0, "min") == "undecided"
    assert iv.verdict(60.0) == "meets" and iv.verdict(40.0) == "misses"


def test_exceedances_allowed() -> None:
    assert quantile_interval([1.0] * 30, 0.99).exceedances_allowed() is None
    assert quantile_interval([1.0] * 299, 0.99).exceedances_allowed() == 0
    # n - B ~ Binomial(1000, 0.01): P(>= 5) = 0.971 >= 0.95 > P(>= 6) = 0.933, so u = 996
    assert quantile_interval([1.0] * 1000, 0.99).exceedances_allowed() == 4


def test_empty_sample_is_undecided() -> None:
    iv = quantile_interval([], 0.99)
    assert (iv.n, iv.lower, iv.upper) == (0, None, None)
    assert iv.verdict(1.0) == "undecided"


def test_combine() -> None:
    assert combine(["meets", "meets"]) == "meets"
    assert combine(["meets", "undecided"]) == "undecided"
    assert combine(["undecided", "misses", "meets"]) == "misses"
    assert combine([]) == "meets"


@pytest.mark.parametrize(
    "call",
    [
        lambda: order_statistic_ranks(10, 1.0, 0.95),
        lambda: order_statistic_ranks(10, 0.0, 0.95),
        lambda: order_statistic_ranks(10, 0.99, 1.0),
        lambda: order_statistic_ranks(10, 0.99, 0.4),
        lambda: quantile_interval([1.0, float("nan")], 0.5),
        lambda: requests_needed(0.99, 0.95, exceedances=-1),
    ],
)
def test_bad_arguments_raise(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]
