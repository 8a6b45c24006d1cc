"""The load generator never reuses a connection, so none is written to as the server's
keep-alive closes it.

A connection reused just as the server closes it fails the request ("Connection reset by peer");
benchmarks/keepalive_race.py reproduces that with aiohttp's default connector.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from autotuner.measure import loadgen
from autotuner.measure.loadgen import LoadResult, run_load
from autotuner.testing.standin import StandinConfig, StandinServer

from .test_loadgen import plan


def test_every_request_has_its_own_connection() -> None:
    ports: list[int] = []

    async def answer(request: web.Request) -> web.Response:
        assert request.transport is not None
        _host, port = request.transport.get_extra_info("peername")
        ports.append(int(port))
        return web.Response(text="ok")

    async def go() -> None:
        app = web.Application()
        app.router.add_get("/", answer)
        runner = web.AppRunner(app, keepalive_timeout=60)  # the server would keep them
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
                await get()  # at once: a pool would have carried it on the first connection
                await asyncio.gather(get(), get(), get())
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert len(ports) == 5 and len(set(ports)) == 5, ports


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
