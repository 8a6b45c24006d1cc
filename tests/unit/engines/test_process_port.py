"""A port another process took between the tuner picking it and the engine binding it: the
engine is launched again on a new port, and nothing the other process answers is taken for the
engine's own answers (a daemon's re-check once measured another engine's server this way).
Runs the stand-in engine as a real server process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import pytest

from autotuner.engines.process import ServerProcess
from tests.unit.engines.standin_engine import ADAPTER
from tests.unit.engines.test_standin_engine import BOUND_S, _launch_spec


class _Healthy(BaseHTTPRequestHandler):
    """Another server: healthy, and it serves nothing else."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


async def _launch_on(port: int, tmp_path: Path) -> tuple[str, int]:
    proc = ADAPTER.process(_launch_spec(tmp_path))
    assert isinstance(proc, ServerProcess)
    proc.port = port  # as if the port had been free when it was picked
    try:
        endpoint = await asyncio.wait_for(proc.launch(), BOUND_S)
        timeout = aiohttp.ClientTimeout(total=BOUND_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            body = {"model": endpoint.model, "prompt": "one two", "max_tokens": 2}
            async with session.post(endpoint.base_url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                data = await resp.json()
        return endpoint.base_url, len(data["choices"][0]["text"].split())
    finally:
        await proc.stop()


def test_a_port_taken_by_another_server_is_replaced_by_a_new_one(
    other_server: int, tmp_path: Path
) -> None:
    base_url, tokens = asyncio.run(_launch_on(other_server, tmp_path))
    assert base_url != f"http://127.0.0.1:{other_server}" and tokens == 2
    log = (tmp_path / "engine.log").read_text()
    assert f"port {other_server} was taken by another process" in log
    assert log.count("# autotuner launch:") == 2
