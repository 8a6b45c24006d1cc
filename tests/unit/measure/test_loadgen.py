"""The load generator against the in-repo stand-in server (fast; wire format as vLLM's).

The real-vLLM evidence for the same code lives in tests/integration.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from autotuner.measure.evaluate import served_rate
from autotuner.measure.levels import pooled
from autotuner.measure.loadgen import LoadPlan, LoadResult, Progress, run_load
from autotuner.measure.sustained import sustained
from autotuner.testing.standin import StandinConfig, StandinServer
from autotuner.workload.requests import Arrival, LengthDist, PromptSource, RequestFactory


def plan(
    *,
    api: str = "completions",
    arrival: Arrival | None = None,
    requests: int | None = 20,
    duration_s: float | None = None,
    warmup: int = 0,
    out: int = 8,
    deadline_s: float | None = None,
    request_timeout_s: float = 30.0,
) -> LoadPlan:
    factory = RequestFactory(
        api,  # type: ignore[arg-type]
        PromptSource(vocab_size=500, words=("a", "b", "c")),
        LengthDist.fixed(16),
        LengthDist.fixed(out),
        seed=0,
    )
    return LoadPlan(
        api=api,  # type: ignore[arg-type]
        factory=factory,
        arrival=arrival or Arrival("constant", rate=50.0),
        requests=requests,
        duration_s=duration_s,
        warmup_requests=warmup,
        request_timeout_s=request_timeout_s,
        deadline_s=deadline_s,
    )


def run(config: StandinConfig, p: LoadPlan, **kw: Any) -> tuple[LoadResult, StandinServer]:
    async def go() -> tuple[LoadResult, StandinServer]:
        async with StandinServer(config) as server:
            result = await run_load(server.base_url, config.model, p, **kw)
        return result, server

    return asyncio.run(go())


def test_every_request_is_timed_token_by_token() -> None:
    cfg = StandinConfig(ttft_s=0.03, itl_s=0.01)
    result, server = run(cfg, plan(requests=10, out=8))
    assert len(result.records) == 10 and not result.failed
    for r in result.records:
        assert r.output_tokens == 8
        assert r.prompt_tokens == 16
        assert r.ttft_s is not None and r.ttft_s >= 0.03
        assert len(r.itl_s) == 7
        assert r.tpot_s is not None and 0.009 <= r.tpot_s < 0.1
        assert r.e2e_s is not None and r.e2e_s >= r.ttft_s + 7 * 0.009
    assert server.stats.completed == 10
    p50 = result.percentile_ms("itl", 50)
    assert p50 is not None and 9 <= p50 < 50


def test_chat_api() -> None:
    result, _ = run(StandinConfig(), plan(api="chat", requests=5, out=4))
    assert [r.output_tokens for r in result.records] == [4] * 5
    assert all(r.ok for r in result.records)


def test_http_errors_are_counted_not_dropped() -> None:
    result, server = run(StandinConfig(fail_every=5), plan(requests=20))
    assert len(result.records) == 20
    assert result.errors() == {"http_500": 4}
    assert len(result.ok) == 16 == server.stats.completed
    # Latency percentiles are over successful requests only.
    assert result.latencies_ms("ttft").size == 16


def test_stream_cut_mid_way_is_incomplete() -> None:
    cfg = StandinConfig(drop_after_tokens=3, drop_every=2)
    result, _ = run(cfg, plan(requests=10, out=8))
    assert result.errors() == {"incomplete": 5}


def test_open_loop_keeps_its_schedule_when_the_server_falls_behind() -> None:
    # One request at a time, each ~0.2 s, offered at 20 req/s: the server falls far behind,
    # yet the requests leave on schedule, not one per answer. A client that waited for each
    # answer would send the last one after ~1.9 s, not at 0.45 s. The bound leaves room for a
    # busy 2-core host stalling the client (0.26 s once, with the unit tests in 4 processes).
    cfg = StandinConfig(ttft_s=0.05, itl_s=0.02, max_concurrency=1)
    p = plan(arrival=Arrival("constant", rate=20.0), requests=10, out=8)
    result, server = run(cfg, p)
    sent = np.array([r.sent_s for r in result.records])
    assert np.all(np.abs(sent - np.arange(10) / 20.0) < 0.5)
    assert max(r.lag_s for r in result.records) < 0.5
    # Queueing shows up as growing TTFT, not as a slower client.
    ttfts = [r.ttft_s for r in result.records]
    assert ttfts[-1] is not None and ttfts[0] is not None and ttfts[-1] > 5 * ttfts[0]
    assert server.stats.max_running_seen == 1


def test_closed_loop_holds_the_concurrency() -> None:
    cfg = StandinConfig(ttft_s=0.02, itl_s=0.01)
    p = plan(arrival=Arrival("concurrency", concurrency=3), requests=12, out=6)
    result, server = run(cfg, p)
    assert len(result.ok) == 12
    assert server.stats.max_running_seen == 3


def test_warmup_requests_are_sent_but_not_measured() -> None:
    result, server = run(StandinConfig(), plan(requests=5, warmup=3))
    assert server.stats.received == 8
    assert len(result.records) == 5
    assert sorted(r.index for r in result.records) == list(range(5))


def test_duration_bounds_an_open_loop_run() -> None:
    p = plan(arrival=Arrival("constant", rate=20.0), requests=None, duration_s=0.5)
    result, _ = run(StandinConfig(), p)
    assert len(result.records) == 10


def test_hard_deadline_cuts_slow_requests_and_returns() -> None:
    cfg = StandinConfig(ttft_s=0.01, itl_s=0.5)
    p = plan(requests=4, out=100, deadline_s=1.0)
    started = time.monotonic()
    result, _ = run(cfg, p)
    assert time.monotonic() - started < 10  # bound against a hang only
    assert result.errors() == {"deadline": 4}
    assert len(result.records) == 4


def test_refused_connection_is_an_error_not_a_hang() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = plan(requests=5)
    result = asyncio.run(run_load(f"http://127.0.0.1:{port}", "m", p))
    assert result.errors() == {"connection": 5}


def test_progress_is_reported() -> None:
    seen: list[Progress] = []
    cfg = StandinConfig(itl_s=0.02)
    run(cfg, plan(requests=10, out=10), progress=seen.append, progress_every_s=0.05)
    assert seen and seen[-1].done == 10 and seen[-1].total == 10
    assert any(p.done < 10 for p in seen)


def test_two_runs_at_one_rate_pooled_serve_that_rate() -> None:
    # Each run's send times start at 0, so pooled their windows overlap: the level must still
    # serve the 20 req/s it was offered (read as one window it served 40), also read back
    # from a file written before pooled results kept their runs.
    cfg = StandinConfig(ttft_s=0.02, itl_s=0.005)
    p = plan(requests=30, arrival=Arrival("constant", rate=20.0), out=4)
    a, _ = run(cfg, p)
    b, _ = run(cfg, p)
    both = pooled(a, b)

    def check(level: LoadResult) -> None:
        rate = served_rate(level)
        assert rate is not None and 0.7 * 20 < rate <= 1.05 * 20
        kept = sustained(level)
        assert kept is not None and kept.ok and kept.sent_rate <= 1.05 * 20
        assert [len(part.records) for part in level.parts()] == [30, 30]

    check(both)
    old = both.to_dict()
    old.pop("runs", None)
    check(LoadResult.from_dict(old))


def test_result_round_trips_through_json() -> None:
    import json

    result, _ = run(StandinConfig(fail_every=3), plan(requests=6))
    again = LoadResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_usage_counts_come_from_the_server(api: str) -> None:
    result, _ = run(StandinConfig(), plan(api=api, requests=3, out=5))
    assert all(r.output_tokens == 5 for r in result.records)
