"""The load generator drops pooled connections before the server's keep-alive closes them.

A connection reused just as the server closes it fails the request ("Connection reset by peer");
benchmarks/keepalive_race.py reproduces that with aiohttp's default connector.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from autotuner.measure import loadgen
from autotuner.measure.loadgen import KEEPALIVE_S, LoadResult, run_load
from autotuner.testing.standin import StandinConfig, StandinServer

from .test_loadgen import plan

# vLLM's API server (and uvicorn's default) closes a connection idle for 5 s.
SERVER_KEEPALIVE_S = 5.0


def test_idle_connections_are_dropped_well_before_the_servers_keepalive() -> None:
    # Loop lag on a busy client and the server's timer granularity need a margin.
    assert 0 < KEEPALIVE_S <= SERVER_KEEPALIVE_S / 2


def test_a_connection_idle_longer_than_the_keepalive_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loadgen, "KEEPALIVE_S", 0.2)
    ports: list[int] = []

    async def answer(request: web.Request) -> web.Response:
        assert request.transport is not None
        _host, port = request.transport.get_extra_info("peername")
        ports.append(int(port))
        return web.Response(text="ok")

    async def go() -> None:
        app = web.Application()
        app.router.add_get("/", answer)
        runner = web.AppRunner(app, keepalive_timeout=60)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with loadgen.client_session() as session:

                async def get() -> None:
                    async with session.get(f"http://127.0.0.1:{port}/") as r:
                        await r.read()

                await get()
                await get()  # at once: the pooled connection carries it
                await asyncio.sleep(0.5)  # the idle time under test, > 0.2 s
                await get()
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert ports[0] == ports[1], "a fresh idle connection should be reused"
    assert ports[2] != ports[1], "a connection idle past the keep-alive was reused"


def test_run_load_sends_through_the_load_generators_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[object] = []
    real = loadgen.client_session

    def counted() -> object:
        session = real()
        made.append(session)
        return session

    monkeypatch.setattr(loadgen, "client_session", counted)

    async def go() -> LoadResult:
        async with StandinServer(StandinConfig()) as server:
            return await run_load(server.base_url, StandinConfig().model, plan(requests=5))

    result = asyncio.run(go())
    assert len(made) == 1 and len(result.records) == 5 and not result.failed
