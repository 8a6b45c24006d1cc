"""Whether a level's engine kept up with the rate sent (autotuner.measure.sustained), on
synthetic records: Poisson sends, and first tokens from an engine that keeps up (each request
one random TTFT after its send) or from one that serves fewer requests than it is sent."""

from __future__ import annotations

import numpy as np
import pytest

from autotuner.measure.loadgen import LoadResult, RequestRecord
from autotuner.measure.sustained import (
    SUSTAIN_TOLERANCE,
    Sustained,
    least_sustained,
    sustained,
)

POISSON = {"arrival": {"process": "poisson", "rate": 10.0}}


def sends(n: int, rate: float, seed: int) -> np.ndarray:
    """Poisson send times, the first at 0."""
    gaps = np.random.default_rng(seed).exponential(1 / rate, n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def level(
    sent: np.ndarray,
    ttft: np.ndarray,
    e2e: np.ndarray | None = None,
    plan: dict[str, object] = POISSON,
) -> LoadResult:
    e2e = ttft + 0.3 if e2e is None else e2e
    records = tuple(
        RequestRecord(i, float(s), 0.0, 16, ttft_s=float(t), e2e_s=float(e), output_tokens=16)
        for i, (s, t, e) in enumerate(zip(sent, ttft, e2e, strict=True))
    )
    return LoadResult(plan, records, float((sent + e2e).max()))


def healthy(n: int, rate: float, seed: int) -> LoadResult:
    """An engine that keeps up: TTFTs of 50-250 ms (random prompt lengths), rising by 0.1 s
    over the first half second while its batch fills."""
    sent = sends(n, rate, seed)
    rng = np.random.default_rng(seed + 1000)
    ttft = rng.uniform(0.05, 0.25, n) + 0.2 * np.minimum(sent, 0.5)
    return level(sent, ttft)


def behind(n: int, rate: float, served: float, seed: int) -> LoadResult:
    """A FIFO engine that takes up one request every 1/served s: a queue that keeps growing
    when ``rate`` is above ``served``."""
    sent = sends(n, rate, seed)
    started = np.empty(n)
    free = 0.0
    for i, s in enumerate(sent):
        started[i] = max(free, s)
        free = started[i] + 1 / served
    return level(sent, started - sent + 0.05)


@pytest.mark.parametrize("n", [30, 40, 100, 299])
def test_an_engine_that_keeps_up_is_sustained_at_every_level_length(n: int) -> None:
    # Well above one request per latency (10-20 req/s against 0.3-1.1 s): many in flight.
    for seed in range(20):
        for rate in (10.0, 20.0):
            kept = sustained(healthy(n, rate, seed))
            assert kept is not None and kept.ok, (n, rate, seed, kept)


@pytest.mark.parametrize("n", [30, 40, 299])
def test_the_sent_rate_is_the_realised_one_not_the_nominal(n: int) -> None:
    for seed in range(5):
        result = healthy(n, 10.0, seed)
        kept = sustained(result)
        assert kept is not None
        realised = (n - 1) / max(r.sent_s for r in result.records)
        assert kept.sent_rate == pytest.approx(realised)


def test_a_slow_last_request_does_not_make_a_level_unsustained() -> None:
    # The last completion comes one latency after the last send; here that latency is 5 times
    # the others', as when the last request asks for the longest output.
    sent = sends(40, 17.0, 3)
    e2e = np.full(40, 0.4)
    e2e[-1] = 2.0
    kept = sustained(level(sent, np.full(40, 0.05), e2e))
    assert kept is not None and kept.ok


def test_an_overloaded_batch_that_finishes_together_is_not_sustained() -> None:
    # Measured shape (tiny model, 2 CPU cores, 40 requests at 64 req/s): vLLM batched every
    # request, all finished within 0.2 s of each other (the last sent with the shortest
    # end-to-end latency), while TTFT grew from 0.07 s to 1.6 s over the level.
    sent = sends(40, 64.0, 4)
    ttft = 0.07 + 1.6 * sent / sent.max()
    e2e = 3.3 - sent
    kept = sustained(level(sent, ttft, e2e))
    assert kept is not None and not kept.ok and kept.ratio < 0.5


@pytest.mark.parametrize("n", [30, 40, 299])
def test_an_engine_that_falls_behind_is_not_sustained(n: int) -> None:
    served = []
    for seed in range(20):
        kept = sustained(behind(n, 17.1, 8.0, seed))
        assert kept is not None and not kept.ok, (n, seed, kept)
        assert kept.margin > 0
        assert kept.describe().startswith("not sustained: served ")
        assert f"of {kept.sent_rate:.3g} req/s sent" in kept.describe()
        served.append(kept.served_rate)
    # What it served is measured, not only the shortfall's sign.
    assert float(np.median(served)) == pytest.approx(8.0, rel=0.1)
    assert max(served) < 17.1 * (1 - SUSTAIN_TOLERANCE)


def test_the_margin_crosses_zero_at_the_tolerance() -> None:
    limit = 1 - SUSTAIN_TOLERANCE
    assert Sustained(10.0, 10.0 * limit).margin == pytest.approx(0.0)
    assert Sustained(10.0, 10.0).margin < 0 < Sustained(10.0, 5.0).margin
    assert Sustained(10.0, 5.0).margin == pytest.approx((limit - 0.5) / limit)


def test_failed_requests_are_sent_but_only_successes_are_fitted() -> None:
    ok = behind(40, 17.1, 8.0, 1)
    failed = tuple(RequestRecord(40 + i, 0.1 * i, 0.0, 16, error="timeout") for i in range(10))
    kept = sustained(LoadResult(POISSON, ok.records + failed, ok.duration_s))
    assert kept is not None and not kept.ok
    # Failures among an engine that keeps up do not tilt the fit.
    fine = healthy(40, 10.0, 2)
    kept = sustained(LoadResult(POISSON, fine.records + failed, fine.duration_s))
    assert kept is not None and kept.ok


def test_too_little_to_tell_gives_no_judgement() -> None:
    one = level(np.array([0.0]), np.array([0.1]))
    assert sustained(one) is None
    # No completion at all: every request failed.
    failed = tuple(RequestRecord(i, 0.1 * i, 0.0, 16, error="http_500") for i in range(40))
    assert sustained(LoadResult(POISSON, failed, 4.0)) is None
    # Every request sent at once (no send span to fit against).
    assert sustained(level(np.zeros(10), np.full(10, 0.1))) is None
    assert sustained(LoadResult(POISSON, (), 0.0)) is None


def test_closed_loop_levels_are_not_judged() -> None:
    closed = {"arrival": {"process": "concurrency", "concurrency": 4}}
    result = behind(40, 17.1, 8.0, 0)
    assert sustained(LoadResult(closed, result.records, result.duration_s)) is None


def test_pooled_runs_are_judged_run_by_run() -> None:
    good, bad = healthy(40, 10.0, 0), behind(40, 17.1, 8.0, 0)
    worst = least_sustained([good, bad])
    assert worst is not None and worst == sustained(bad)
    assert least_sustained([good]) == sustained(good)
    assert least_sustained([]) is None
