"""Unit tests of the OpenAI-compatible stand-in server (autotuner.testing.standin)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from autotuner.testing.standin import StandinConfig, StandinServer, main

REPO_ROOT = Path(__file__).resolve().parents[3]
FAST = StandinConfig(ttft_s=0.01, itl_s=0.002)


def run_with_server(
    config: StandinConfig,
    body: Callable[[StandinServer, aiohttp.ClientSession], Awaitable[None]],
) -> StandinServer:
    """Run ``body`` against a fresh server in its own event loop (no pytest-asyncio)."""

    async def go() -> StandinServer:
        async with StandinServer(config) as server, aiohttp.ClientSession() as session:
            await asyncio.wait_for(body(server, session), timeout=20)
        return server

    return asyncio.run(go())


@dataclass
class Stream:
    """What a client saw on one SSE response."""

    status: int
    content_type: str
    events: list[str] = field(default_factory=list)  # raw payloads after "data: "
    chunk_times: list[float] = field(default_factory=list)  # monotonic, per event
    complete: bool = False  # the body ended cleanly
    error: str | None = None

    @property
    def json_chunks(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"


async def read_stream(session: aiohttp.ClientSession, url: str, payload: dict[str, Any]) -> Stream:
    """POST and parse SSE strictly: every event is one ``data: ...`` line plus a blank line."""
    async with session.post(url, json=payload) as resp:
        out = Stream(resp.status, resp.headers.get("Content-Type", ""))
        pending: str | None = None
        try:
            async for raw in resp.content:
                line = raw.decode()
                if pending is None:
                    assert line.startswith("data: ") and line.endswith("\n"), repr(line)
                    pending = line[len("data: ") : -1]
                else:
                    assert line == "\n", repr(line)
                    out.events.append(pending)
                    out.chunk_times.append(time.monotonic())
                    pending = None
            out.complete = pending is None
        except aiohttp.ClientPayloadError as e:
            out.error = repr(e)
        return out


def content_chunks(stream: Stream) -> list[dict[str, Any]]:
    return [c for c in stream.json_chunks if c["choices"]]


def test_streaming_completions_wire_format() -> None:
    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        s = await read_stream(
            session,
            f"{server.base_url}/v1/completions",
            {
                "model": "standin-model",
                "prompt": "one two three four",
                "max_tokens": 7,
                "stream": True,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert s.status == 200 and s.content_type.startswith("text/event-stream")
        assert s.complete and s.done and s.error is None
        chunks = s.json_chunks
        content = content_chunks(s)
        assert len(content) == 7
        for c in content:
            assert c["object"] == "text_completion"
            assert c["model"] == "standin-model"
            assert c["id"].startswith("cmpl-") and c["id"] == chunks[0]["id"]
            assert c["usage"] is None
            assert set(c["choices"][0]) >= {"index", "text", "logprobs", "finish_reason"}
        assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 6 + ["length"]
        text = "".join(c["choices"][0]["text"] for c in content)
        assert len(text.split()) == 7
        usage_chunk = chunks[-1]
        assert usage_chunk["choices"] == []
        assert usage_chunk["usage"] == {
            "prompt_tokens": 4,
            "completion_tokens": 7,
            "total_tokens": 11,
        }
        # Without stream_options there is no usage chunk.
        s2 = await read_stream(
            session,
            f"{server.base_url}/v1/completions",
            {"prompt": [1, 2, 3], "max_tokens": 2, "stream": True},
        )
        assert s2.done and len(s2.json_chunks) == 2 and all(c["choices"] for c in s2.json_chunks)

    server = run_with_server(FAST, body)
    assert server.stats.received == 2 and server.stats.completed == 2
    assert server.stats.failed == server.stats.dropped == 0


def test_streaming_chat_wire_format() -> None:
    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        s = await read_stream(
            session,
            f"{server.base_url}/v1/chat/completions",
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "hello there you"}]},
                ],
                "max_completion_tokens": 4,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert s.done and s.complete
        chunks = s.json_chunks
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert all(c["id"].startswith("chatcmpl-") for c in chunks)
        first = chunks[0]["choices"][0]
        assert first["delta"] == {"role": "assistant", "content": ""}
        assert first["finish_reason"] is None
        deltas = [c["choices"][0] for c in chunks[1:-1]]
        assert len(deltas) == 4
        assert all(set(d["delta"]) == {"content"} for d in deltas)
        assert [d["finish_reason"] for d in deltas] == [None, None, None, "length"]
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"] == {
            "prompt_tokens": 5,
            "completion_tokens": 4,
            "total_tokens": 9,
        }

    run_with_server(FAST, body)


def test_non_streaming_both_endpoints_and_default_max_tokens() -> None:
    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        async with session.post(
            f"{server.base_url}/v1/completions", json={"prompt": "a b"}
        ) as resp:
            assert resp.status == 200
            data = await resp.json()
        assert data["object"] == "text_completion"
        assert len(data["choices"][0]["text"].split()) == 16  # OpenAI/vLLM default
        assert data["choices"][0]["finish_reason"] == "length"
        assert data["usage"] == {"prompt_tokens": 2, "completion_tokens": 16, "total_tokens": 18}

        async with session.post(
            f"{server.base_url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x y z"}], "max_tokens": 3},
        ) as resp:
            data = await resp.json()
        assert data["object"] == "chat.completion"
        msg = data["choices"][0]["message"]
        assert msg["role"] == "assistant" and len(msg["content"].split()) == 3
        assert data["usage"]["prompt_tokens"] == 3 and data["usage"]["completion_tokens"] == 3

    run_with_server(FAST, body)


def test_natural_stop_unless_ignore_eos() -> None:
    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        url = f"{server.base_url}/v1/completions"
        async with session.post(url, json={"prompt": "a", "max_tokens": 10}) as resp:
            data = await resp.json()
        assert data["choices"][0]["finish_reason"] == "stop"
        assert data["usage"]["completion_tokens"] == 3
        payload = {"prompt": "a", "max_tokens": 10, "ignore_eos": True}
        async with session.post(url, json=payload) as resp:
            data = await resp.json()
        assert data["choices"][0]["finish_reason"] == "length"
        assert data["usage"]["completion_tokens"] == 10

    run_with_server(StandinConfig(ttft_s=0.0, itl_s=0.0, natural_stop_tokens=3), body)


@pytest.mark.parametrize(
    ("path", "payload", "status"),
    [
        ("/v1/completions", b"{not json", 400),
        ("/v1/completions", b"[1, 2]", 400),
        ("/v1/completions", b'{"max_tokens": 4}', 400),
        ("/v1/completions", b'{"prompt": "a", "max_tokens": 0}', 400),
        ("/v1/completions", b'{"prompt": "a", "max_tokens": "4"}', 400),
        ("/v1/completions", b'{"prompt": {"x": 1}}', 400),
        ("/v1/completions", b'{"prompt": "a", "stream_options": {"include_usage": true}}', 400),
        ("/v1/completions", b'{"prompt": "a", "max_tokens": 5000}', 400),
        ("/v1/chat/completions", b'{"messages": "hi"}', 400),
        ("/v1/completions", b'{"prompt": "a", "model": "other"}', 404),
    ],
)
def test_malformed_requests_get_openai_errors(path: str, payload: bytes, status: int) -> None:
    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        async with session.post(
            server.base_url + path, data=payload, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == status
            data = await resp.json()
        err = data["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert err["code"] == status
        assert err["type"] == ("BadRequestError" if status == 400 else "NotFoundError")

    server = run_with_server(FAST, body)
    assert server.stats.failed == 1 and server.stats.completed == 0


def test_fail_every_injects_500() -> None:
    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        statuses = []
        for _ in range(6):
            async with session.post(
                f"{server.base_url}/v1/completions",
                json={"prompt": "a", "max_tokens": 2, "stream": True},
            ) as resp:
                statuses.append(resp.status)
                if resp.status == 500:
                    err = (await resp.json())["error"]
                    assert err["type"] == "InternalServerError" and err["code"] == 500
                else:
                    await resp.read()
        assert statuses == [200, 200, 500, 200, 200, 500]

    server = run_with_server(StandinConfig(ttft_s=0.0, itl_s=0.0, fail_every=3), body)
    assert (server.stats.received, server.stats.completed, server.stats.failed) == (6, 4, 2)


def test_drop_mid_stream_leaves_incomplete_stream() -> None:
    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        payload = {
            "prompt": "a b",
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        url = f"{server.base_url}/v1/completions"
        ok = await read_stream(session, url, payload)
        dropped = await read_stream(session, url, payload)
        assert ok.done and len(content_chunks(ok)) == 8
        assert not dropped.done and "[DONE]" not in dropped.events
        assert dropped.error is not None  # the chunked body never terminated
        assert len(content_chunks(dropped)) == 3
        assert all(c["usage"] is None for c in dropped.json_chunks)
        # Non-streaming requests selected for a drop see the connection close.
        with pytest.raises(aiohttp.ClientError):
            for _ in range(2):
                async with session.post(url, json={"prompt": "a", "max_tokens": 4}) as resp:
                    await resp.read()

    server = run_with_server(
        StandinConfig(ttft_s=0.0, itl_s=0.001, drop_after_tokens=3, drop_every=2), body
    )
    assert server.stats.dropped == 2 and server.stats.completed == 2


def test_max_concurrency_serializes_requests() -> None:
    config = StandinConfig(ttft_s=0.05, itl_s=0.005, max_concurrency=1)
    payload = {"prompt": "a", "max_tokens": 10, "stream": True}

    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        url = f"{server.base_url}/v1/completions"
        t0 = time.monotonic()
        a, b = await asyncio.gather(
            read_stream(session, url, payload), read_stream(session, url, payload)
        )
        assert a.done and b.done
        first, second = sorted((a, b), key=lambda s: s.chunk_times[-1])
        first_total = first.chunk_times[-1] - t0
        second_ttft = second.chunk_times[0] - t0
        # The queued request gets its first token only after the other finished, plus prefill.
        assert second_ttft >= first_total
        assert second_ttft >= 0.95 * (2 * config.ttft_s + 9 * config.itl_s)

    server = run_with_server(config, body)
    assert server.stats.max_running_seen == 1

    async def unlimited(server: StandinServer, session: aiohttp.ClientSession) -> None:
        url = f"{server.base_url}/v1/completions"
        streams = await asyncio.gather(*(read_stream(session, url, payload) for _ in range(3)))
        assert all(s.done for s in streams)

    server = run_with_server(StandinConfig(ttft_s=0.05, itl_s=0.005), unlimited)
    assert server.stats.max_running_seen == 3


def test_client_disconnect_frees_the_slot() -> None:
    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        url = f"{server.base_url}/v1/completions"
        payload = {"prompt": "a", "max_tokens": 50, "stream": True}
        resp = await session.post(url, json=payload)
        await resp.content.readline()
        resp.close()  # walk away mid-stream
        # With one slot, this only completes if the abandoned request gave its slot back.
        s = await read_stream(session, url, {**payload, "max_tokens": 2})
        assert s.done
        assert server.stats.aborted == 1 and server.stats.running == 0

    server = run_with_server(StandinConfig(ttft_s=0.0, itl_s=0.002, max_concurrency=1), body)
    assert server.stats.completed == 1


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_parse_and_move() -> None:
    labels = (("engine", "0"), ("model_name", "m1"))

    async def scrape(server: StandinServer, session: aiohttp.ClientSession) -> dict[Any, float]:
        async with session.get(f"{server.base_url}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            return _samples(await resp.text())

    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        before = await scrape(server, session)
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:time_to_first_token_seconds_count",
            "vllm:request_queue_time_seconds_count",
            "vllm:request_prefill_time_seconds_count",
            "vllm:request_decode_time_seconds_count",
        ):
            assert before[(name, labels)] == 0.0, name

        url = f"{server.base_url}/v1/completions"
        payload = {"model": "m1", "prompt": "p q r", "max_tokens": 5, "stream": True}
        assert (await read_stream(session, url, payload)).done

        # Hold one long request in the only slot and queue another; watch the gauges.
        # The held one would take ~20 s, so the scrape cannot race its end.
        held = await session.post(url, json={**payload, "max_tokens": 2000})
        await held.content.readline()  # first token: this request is running
        queued = asyncio.create_task(read_stream(session, url, payload))
        deadline = time.monotonic() + 5
        while server.stats.waiting < 1:  # bounded wait for the server to see it
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        during = await scrape(server, session)
        assert during[("vllm:num_requests_running", labels)] == 1.0
        assert during[("vllm:num_requests_waiting", labels)] == 1.0
        assert 0.0 < during[("vllm:kv_cache_usage_perc", labels)] <= 1.0
        held.close()  # abandon it; the queued request then gets the slot
        assert (await queued).done

        after = await scrape(server, session)
        assert after[("vllm:prompt_tokens_total", labels)] == 9.0
        assert after[("vllm:generation_tokens_total", labels)] >= 11.0
        assert after[("vllm:time_to_first_token_seconds_count", labels)] == 3.0
        assert after[("vllm:request_decode_time_seconds_count", labels)] == 2.0
        assert after[("vllm:request_queue_time_seconds_sum", labels)] > 0.0
        assert after[("vllm:num_requests_running", labels)] == 0.0
        assert after[("vllm:num_requests_waiting", labels)] == 0.0
        assert after[("vllm:kv_cache_usage_perc", labels)] == 0.0
        success_labels = tuple(sorted((*labels, ("finished_reason", "length"))))
        success = ("vllm:request_success_total", success_labels)
        assert after[success] == 2.0

    run_with_server(StandinConfig(model="m1", ttft_s=0.02, itl_s=0.01, max_concurrency=1), body)


def test_health_models_and_loopback_binding() -> None:
    async def body(server: StandinServer, session: aiohttp.ClientSession) -> None:
        assert server.port > 0
        assert server.base_url == f"http://127.0.0.1:{server.port}"
        assert server.addresses == [("127.0.0.1", server.port)]
        async with session.get(f"{server.base_url}/health") as resp:
            assert resp.status == 503
        async with session.post(f"{server.base_url}/v1/completions", json={"prompt": "a"}) as resp:
            assert resp.status == 503
        deadline = time.monotonic() + 5
        while True:
            async with session.get(f"{server.base_url}/health") as resp:
                if resp.status == 200:
                    break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        async with session.get(f"{server.base_url}/v1/models") as resp:
            models = await resp.json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["standin-model"]

    run_with_server(StandinConfig(startup_delay_s=0.1), body)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        StandinConfig(ttft_s=-1)
    with pytest.raises(ValueError):
        StandinConfig(max_concurrency=0)
    with pytest.raises(ValueError):
        StandinConfig(drop_every=0)


def test_main_rejects_bad_args() -> None:
    with pytest.raises(SystemExit):
        main(["--itl-s", "-1"])


def test_module_runs_until_sigterm() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with subprocess.Popen(
        [sys.executable, "-m", "autotuner.testing.standin", "--port", "0", "--itl-s", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line.startswith("listening on http://127.0.0.1:"), line
            base_url = line.removeprefix("listening on ")

            async def probe() -> None:
                async with aiohttp.ClientSession() as session:
                    async with session.get(f"{base_url}/health") as resp:
                        assert resp.status == 200
                    async with session.post(
                        f"{base_url}/v1/completions", json={"prompt": "a", "max_tokens": 2}
                    ) as resp:
                        assert resp.status == 200

            asyncio.run(probe())
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=10)
            assert proc.returncode == 0, err
            assert "Warning" not in err and "Traceback" not in err, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
