"""Requests lost to the keep-alive race: a pooled connection reused as the server closes it.

An HTTP server closes a connection that has been idle for its keep-alive time (vLLM's API
server, through uvicorn: 5 s). A client that keeps idle connections longer (aiohttp's default:
15 s, reusing the one idle longest first) can write a request on a connection at the moment the
server closes it. The request then fails with "Connection reset by peer", "Server disconnected"
or "Can not write request body", although the server was healthy. The window is the time the
server's event loop takes to notice the request, so it is wide on a busy server (one streaming
hundreds of answers) and almost closed on an idle one.

This sends bursts of requests whose connections are reused after an idle time that sweeps
across the server's keep-alive, once with aiohttp's default connector and once with the load
generator's (:func:`autotuner.measure.loadgen.client_session`), and counts the failures by kind.

The server is either a stand-in started here (``--busy-ms``: its event loop blocks that long
at a time, as a loop streaming many answers does; keep-alive ``--keepalive`` s), or a running
engine (``--url`` and ``--model``) with ``--background`` streaming requests kept in flight to
load its loop. Run::

    python3 benchmarks/keepalive_race.py                      # stand-in, busy loop
    python3 benchmarks/keepalive_race.py --busy-ms 0          # stand-in, idle loop
    python3 benchmarks/keepalive_race.py --url http://127.0.0.1:8000 --model M --background 48
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from autotuner.measure.loadgen import client_session


def serve(port: int, keepalive: float, busy_ms: float) -> None:
    """The stand-in server: answers every POST with a small body; with ``busy_ms`` > 0 its loop
    is blocked that long at a time, with a yield in between."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"choices": [{"text": "x"}]})

    async def busy(app: web.Application) -> AsyncIterator[None]:
        async def spin() -> None:
            while True:
                end = time.perf_counter() + busy_ms / 1000
                while time.perf_counter() < end:
                    pass
                await asyncio.sleep(0)

        task = asyncio.create_task(spin()) if busy_ms > 0 else None
        yield
        if task is not None:
            task.cancel()

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    app.cleanup_ctx.append(busy)
    web.run_app(app, host="127.0.0.1", port=port, keepalive_timeout=keepalive, print=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_up(url: str, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.post(url, json={}) as r:
                    await r.read()
                    return
            except aiohttp.ClientError:
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.2)


async def bursts(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    *,
    count: int,
    width: int,
    spread: float,
    keepalive: float,
) -> Counter[str]:
    """``count`` bursts of ``width`` requests sent over ``spread`` s; between bursts a pause
    that makes each connection's idle time sweep from 60 ms below the server's keep-alive to
    60 ms above it. Returns the requests' outcomes by kind."""
    outcomes: Counter[str] = Counter()

    async def one(delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            async with session.post(url, json=body) as r:
                await r.read()
                outcomes["ok" if r.status == 200 else f"http_{r.status}"] += 1
        except (aiohttp.ClientError, OSError) as exc:
            errno = f" {exc.errno}" if isinstance(exc, OSError) else ""
            outcomes[type(exc).__name__ + errno] += 1

    for k in range(count):
        await asyncio.gather(*(one(i * spread / width) for i in range(width)))
        offset = -0.06 + 0.12 * k / max(1, count - 1)
        await asyncio.sleep(max(0.0, keepalive - spread + offset))
    return outcomes


async def background_load(
    url: str, body: dict[str, object], streams: int, stop: asyncio.Event
) -> None:
    """``streams`` streaming requests kept in flight until ``stop`` (loads an engine's loop)."""

    async def stream(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.post(url, json=body) as r:
                    async for _ in r.content:
                        if stop.is_set():
                            break

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(stream(session) for _ in range(streams)))


async def run(args: argparse.Namespace, url: str) -> dict[str, dict[str, int]]:
    probe: dict[str, object] = {"prompt": "hi", "max_tokens": 1}
    if args.model:
        probe["model"] = args.model
    stop = asyncio.Event()
    loader = None
    if args.background:
        long = {**probe, "max_tokens": args.background_tokens, "stream": True, "ignore_eos": True}
        loader = asyncio.create_task(background_load(url, long, args.background, stop))
        await asyncio.sleep(5)  # let the streams fill the engine
    connectors: dict[str, Callable[[], aiohttp.ClientSession]] = {
        "aiohttp default (keepalive 15 s)": lambda: aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0)
        ),
        "load generator (a connection per request)": client_session,
    }
    results: dict[str, dict[str, int]] = {}
    try:
        for name, make in connectors.items():
            async with make() as session:
                found = await bursts(
                    session,
                    url,
                    probe,
                    count=args.bursts,
                    width=args.width,
                    spread=args.spread,
                    keepalive=args.keepalive,
                )
            results[name] = dict(found)
            failed = sum(n for kind, n in found.items() if kind != "ok")
            print(f"{name}: {failed} of {sum(found.values())} failed {dict(found)}", flush=True)
    finally:
        stop.set()
        if loader is not None:
            await asyncio.wait_for(loader, 60)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running engine's base URL (default: start a stand-in)")
    ap.add_argument("--model", help="the engine's model name (with --url)")
    ap.add_argument("--keepalive", type=float, default=5.0, help="the server's keep-alive, s")
    ap.add_argument("--busy-ms", type=float, default=5.0, help="stand-in loop blocks, ms")
    ap.add_argument("--bursts", type=int, default=18)
    ap.add_argument("--width", type=int, default=100, help="requests per burst")
    ap.add_argument("--spread", type=float, default=0.4, help="seconds each burst is sent over")
    ap.add_argument("--background", type=int, default=0, help="streams kept in flight (--url)")
    ap.add_argument("--background-tokens", type=int, default=256)
    ap.add_argument("--json", type=Path, help="write the counts here")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve, args.keepalive, args.busy_ms)
        return 0
    server = None
    base = args.url
    if base is None:
        port = free_port()
        argv = [sys.executable, __file__, "--serve", str(port)]
        argv += ["--keepalive", str(args.keepalive), "--busy-ms", str(args.busy_ms)]
        server = subprocess.Popen(argv)
        base = f"http://127.0.0.1:{port}"
    url = base.rstrip("/") + "/v1/completions"
    try:
        if server is not None:
            asyncio.run(wait_up(url))
        where = base if server is None else f"stand-in, loop busy {args.busy_ms:g} ms at a time"
        print(
            f"server: {where}; keep-alive {args.keepalive:g} s; {args.bursts} bursts of "
            f"{args.width} over {args.spread:g} s",
            flush=True,
        )
        results = asyncio.run(run(args, url))
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "results": results},
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
