"""The daemon's server loop (`autotuner daemon` runs it: :mod:`autotuner.cli.daemon`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator

from autotuner.daemon.config import DaemonConfig

logger = logging.getLogger(__name__)


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
