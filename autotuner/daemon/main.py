"""`autotuner daemon`, `autotuner submit` and `autotuner status`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from autotuner.daemon.config import ConfigError, DaemonConfig, load_config

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _log_to_stdout() -> Iterator[None]:
    """The daemon's log (every ``autotuner.daemon`` logger) on stdout while it serves, one
    timestamped line per event: what a service manager keeps."""
    daemon_log = logging.getLogger("autotuner.daemon")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S%z"))
    level = daemon_log.level
    daemon_log.addHandler(handler)
    daemon_log.setLevel(logging.INFO)
    try:
        yield
    finally:
        daemon_log.removeHandler(handler)
        daemon_log.setLevel(level)


async def serve(config: DaemonConfig, *, ready: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT, logging to stdout. Returns the exit code."""
    with _log_to_stdout():
        return await _serve(config, ready)


async def _serve(config: DaemonConfig, ready: asyncio.Event | None) -> int:
    from aiohttp import web

    from autotuner.daemon.api import make_app
    from autotuner.daemon.leases import open_gpu_view
    from autotuner.daemon.service import Daemon

    daemon = Daemon(config, gpus=open_gpu_view())
    try:
        daemon.recover()
        runner = web.AppRunner(make_app(daemon), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else config.port
        daemon.write_address(config.host, port)
        logger.info("autotuner daemon listening on %s (state: %s)", daemon.url, daemon.root)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loops = asyncio.create_task(daemon.run_loops())
        if ready is not None:
            ready.set()
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({loops, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if loops in done and loops.exception() is not None:
            logger.error("daemon loop crashed: %r", loops.exception())
        logger.info("stopping: interrupting running jobs (they resume at the next start)")
        await daemon.stop()
        loops.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loops
        waiter.cancel()
        await runner.cleanup()
        logger.info("stopped")
        return 0
    finally:
        daemon.close()


def main_daemon(
    config_path: str | None, state_dir: str | None, host: str | None, port: int | None
) -> int:
    from autotuner.daemon.errors import AlreadyRunning

    try:
        config = load_config(config_path, state_dir=state_dir, host=host, port=port)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(config))
    except AlreadyRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- client side


def _endpoint(state_dir: str | None, url: str | None, token_file: str | None) -> tuple[str, str]:
    root = Path(state_dir).expanduser() if state_dir else DaemonConfig().state_dir
    if url is None:
        try:
            url = str(json.loads((root / "daemon.json").read_text())["url"])
        except (OSError, ValueError, KeyError):
            raise ConfigError(
                f"no running daemon found in {root} (start `autotuner daemon`, or pass --url)"
            ) from None
    token_path = Path(token_file).expanduser() if token_file else root / "token"
    try:
        token = token_path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the API token {token_path}: {exc.strerror}") from None
    return url.rstrip("/"), token


def call(
    base: str, token: str, method: str, path: str, body: bytes | None = None
) -> tuple[int, Any]:
    req = urllib.request.Request(
        base + path,
        data=body,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/yaml"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"null")
        except ValueError:
            return exc.code, {"error": exc.reason, "errors": [str(exc.reason)]}


def main_submit(
    files: list[str],
    priority: int,
    schedule: str | None,
    state_dir: str | None,
    url: str | None,
    token_file: str | None,
) -> int:
    from urllib.parse import urlencode

    try:
        base, token = _endpoint(state_dir, url, token_file)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ok = True
    for f in files:
        try:
            body = Path(f).read_bytes()
        except OSError as exc:
            print(f"{f}: cannot read: {exc.strerror}", file=sys.stderr)
            ok = False
            continue
        query = {"priority": str(priority), "source": Path(f).name}
        if schedule:
            query["schedule"] = schedule
        try:
            code, data = call(base, token, "POST", f"/v1/studies?{urlencode(query)}", body)
        except OSError as exc:
            print(f"error: cannot reach the daemon at {base}: {exc}", file=sys.stderr)
            return 2
        if code in (200, 201):
            verb = "queued" if data["created"] else "already registered; queued"
            print(f"{f}: {verb} as {data['sla']} on {data['engine']} (job {data['job']})")
        else:
            ok = False
            for msg in (data or {}).get("errors") or [str(data)]:
                print(msg, file=sys.stderr)
    return 0 if ok else 2


def _age(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M")


def main_status(
    state_dir: str | None, url: str | None, token_file: str | None, as_json: bool
) -> int:
    try:
        base, token = _endpoint(state_dir, url, token_file)
        code, data = call(base, token, "GET", "/v1/status")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot reach the daemon: {exc}", file=sys.stderr)
        return 2
    if code != 200:
        print(f"error: HTTP {code}: {data}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(data, indent=2))
        return 0
    d = data["daemon"]
    print(
        f"daemon pid {d['pid']} at {d['url']}, up since {_age(d['started'])}, "
        f"state {d['state_dir']}"
    )
    print(f"\nrunning ({len(data['running'])}):")
    for j in data["running"]:
        print(
            f"  job {j['id']} {j['kind']} {j['sla']} on {j['engine']} "
            f"[{', '.join(j['devices'])}] since {_age(j['started'])}"
        )
        for line in j.get("log_tail", []):
            print(f"      {line}")
    print(f"\nqueue ({len(data['queue'])}):")
    for j in data["queue"]:
        why = f" - waiting: {j['waiting_for']}" if j.get("waiting_for") else ""
        print(
            f"  job {j['id']} {j['kind']} {j['sla']} on {j['engine']} "
            f"(priority {j['priority']}){why}"
        )
    leases = data["leases"]
    print(f"\ndevices: leased {leases['held'] or 'none'}; draining {leases['draining'] or 'none'}")
    print("\nSLAs:")
    for s in data["slas"]:
        p = s.get("promotion")
        prom = (
            f"{p['label']} on {p['engine']}, goodput {p['goodput'] or 0:.2f}, "
            f"{'meets' if p['meets_sla'] else 'MISSES'} the SLA ({_age(p['time'])})"
            if p
            else "nothing promoted yet"
        )
        print(f"  {s['name']}: {prom}; next check {_age(s['next_check'])} ({s['schedule']})")
    print("\nlast alerts:")
    for a in data["alerts"][:5]:
        sent = "sent" if a["delivered"] == 1 else ("gave up" if a["delivered"] < 0 else "pending")
        print(f"  {_age(a['time'])} {a['severity']} {a['kind']}: {a['summary']} [{sent}]")
    if not data["alerts"]:
        print("  none")
    return 0
