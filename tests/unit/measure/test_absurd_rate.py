"""An open loop scheduled far faster than any load generator sends (issue 40): at 1e8 req/s
the warm-up created send tasks for its whole 60 s bound without yielding, and the host ran out
of memory and open files. The generator holds at most what its open-file limit allows in
flight, yields between due sends, stops sending at its deadline and says how much of the
schedule it sent. Rates here bypass the SLA's bound (``check`` refuses them) on purpose."""

from __future__ import annotations

import asyncio
import math
import resource
import time
from collections.abc import Iterator

import pytest

from autotuner.measure.loadgen import OVERRUN, LoadResult, client_session, warm_to_steady
from autotuner.measure.pacing import PACE_TOLERANCE
from autotuner.measure.sendpool import FD_RESERVE, in_flight_limit
from autotuner.measure.steady import SteadyRule
from autotuner.testing.standin import StandinConfig, StandinServer
from autotuner.workload.requests import Arrival

from .test_loadgen import plan, run

ABSURD = 1e30  # req/s
HELD = 40  # requests the generator may hold under the open-file limit below


@pytest.fixture
def few_files() -> Iterator[None]:
    """An open-file limit that leaves the generator ``HELD`` requests in flight (the stand-in
    in this process takes a descriptor per connection too: 2 x HELD stay well within it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_RESERVE + HELD, hard))
    try:
        assert in_flight_limit() == HELD
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_open_loop_never_holds_more_requests_than_its_pool(few_files: None) -> None:
    # 300 requests all due at once: without the pool each took a connection at once and the
    # ones past the open-file limit failed ("Too many open files").
    cfg = StandinConfig(ttft_s=0.05, itl_s=0.005)
    p = plan(arrival=Arrival("constant", rate=ABSURD), requests=300, out=4)
    result, server = run(cfg, p)
    assert result.errors() == {} and len(result.ok) == 300
    assert server.stats.max_running_seen <= HELD
    assert result.schedule_sent() is None  # every scheduled request was sent
    # Sends waited for a slot: they left late, and the lag says so.
    assert max(r.lag_s for r in result.records) > 0.05


def test_a_warmup_at_an_absurd_rate_stops_at_its_request_bound() -> None:
    # Was: tasks created for the whole time bound (none of them started, so the rule never
    # saw a request sent), hundreds of thousands of requests in 0.5 s.
    rule = SteadyRule(window=5, min_windows=2, tolerance=0.1, max_requests=50, max_s=5.0)
    p = plan(arrival=Arrival("poisson", rate=ABSURD), requests=50, out=4)

    async def go() -> tuple[int, str, int]:
        async with StandinServer(StandinConfig(ttft_s=0.02, itl_s=0.005)) as server:
            async with client_session() as session:
                warmed = await warm_to_steady(
                    session, server.base_url, server.config.model, p, rule
                )
            return warmed.requests, warmed.stopped_by, server.stats.received

    started = time.monotonic()
    sent, stopped_by, received = asyncio.run(go())
    assert time.monotonic() - started < 30  # a bound against a hang only
    assert stopped_by in ("max_requests", "steady")
    assert sent <= rule.most and received == sent


def test_sending_stops_at_its_deadline_and_says_how_much_of_the_schedule_went(
    few_files: None,
) -> None:
    # A minute's schedule at 1e30 req/s holds 6e31 requests; the run sends what its pool
    # lets through until its duration (and the overrun) is over, then waits for those sent.
    cfg = StandinConfig(ttft_s=0.3, itl_s=0.01)
    p = plan(
        arrival=Arrival("constant", rate=ABSURD), requests=None, duration_s=1.0, out=4,
        request_timeout_s=5.0,
    )  # fmt: skip
    started = time.monotonic()
    result, server = run(cfg, p)
    assert time.monotonic() - started < 15  # a bound against a hang only
    assert server.stats.max_running_seen <= HELD
    assert result.scheduled == math.ceil(ABSURD * 1.0) > len(result.records) > 0
    share = result.schedule_sent()
    assert share is not None and share < 1e-20
    assert all(r.sent_s <= 1.0 * (1 + OVERRUN) + 0.5 for r in result.records)
    again = LoadResult.from_dict(result.to_dict())
    assert again.scheduled == result.scheduled


def test_the_send_overrun_is_the_pacing_tolerance() -> None:
    # A run stopped for its overrun is one pacing calls behind: undecided, never "met".
    assert OVERRUN == PACE_TOLERANCE
