"""The daemon's server loop (`autotuner daemon` runs it: :mod:`autotuner.cli.daemon`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Iterator

from autotuner.daemon.config import DaemonConfig

logger = logging.getLogger(__name__)
# The HTTP server's own log (requests it could not parse), through the filter below.
http_log = logging.getLogger("autotuner.daemon.http")
MALFORMED_EVERY_S = 60.0  # at most one line a minute about malformed requests


class _MalformedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (before any token is checked) with a traceback
    that quotes the request's bytes: anyone who reaches the port could write into the log.
    Such a record becomes one line without them, at most once a minute with a count."""

    def __init__(self) -> None:
        super().__init__()
        self.last = float("-inf")
        self.unsaid = 0

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        self.unsaid += 1
        now = time.monotonic()
        if now - self.last < MALFORMED_EVERY_S:
            return False
        record.msg = "refused %d malformed HTTP request(s) (last: %s, status %s), not logged"
        record.args = (self.unsaid, type(exc).__name__, exc.code)
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        self.last, self.unsaid = now, 0
        return True


http_log.addFilter(_MalformedRequests())


@contextlib.contextmanager
def _log_to_stdout() -> Iterator[None]:
    """The daemon's log (every ``autotuner.daemon`` logger) on stdout while it serves, one
    timestamped line per event: what a service manager keeps."""
    daemon_log = logging.getLogger("autotuner.daemon")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S%z"))
    level, propagate = daemon_log.level, daemon_log.propagate
    daemon_log.addHandler(handler)
    daemon_log.setLevel(logging.INFO)
    daemon_log.propagate = False  # the CLI's stderr handler on "autotuner" would repeat them
    try:
        yield
    finally:
        daemon_log.removeHandler(handler)
        daemon_log.setLevel(level)
        daemon_log.propagate = propagate


async def serve(config: DaemonConfig, *, ready: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT, logging to stdout. Returns the exit code."""
    with _log_to_stdout():
        return await _serve(config, ready)


async def _serve(config: DaemonConfig, ready: asyncio.Event | None) -> int:
    from aiohttp import web

    from autotuner.daemon import workers
    from autotuner.daemon.api import make_app
    from autotuner.daemon.leases import open_gpu_view
    from autotuner.daemon.service import Daemon

    daemon = Daemon(config, gpus=open_gpu_view())
    try:
        workers.recover(daemon)
        runner = web.AppRunner(make_app(daemon), access_log=None, logger=http_log)
        await runner.setup()
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else config.port
        daemon.write_address(config.host, port)  # logs the address, warns beyond loopback
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
