"""A cancelled job ends within its grace (issue 40): the daemon's cancel sends SIGTERM, and
SIGKILL when the job still runs ``CANCEL_GRACE_S`` later, as its shutdown does. A job whose
cancel was asked for is never queued again by the next start."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from autotuner.daemon import jobs, workers
from autotuner.daemon.service import Daemon

from .conftest import SLA, api_client, bearer, make_daemon

# A job that ignores SIGTERM (as a load generator that never yielded did), and says when it
# does.
DEAF = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(sys.argv[1], 'w').close()\n"
    "time.sleep(120)\n"
)


async def _until(what: str, done: Callable[[], bool], within_s: float) -> None:
    """Wait for ``done()``, polling; fail (not hang) after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s:.0f} s: {what}")
        await asyncio.sleep(0.05)


def test_a_job_deaf_to_sigterm_is_killed_after_the_cancel_grace(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready = tmp_path / "deaf-ready"
    argv = [sys.executable, "-c", DEAF, str(ready)]
    monkeypatch.setattr(jobs, "tune_argv", lambda *a: argv)
    monkeypatch.setattr(workers, "CANCEL_GRACE_S", 1.0, raising=False)

    async def go() -> None:
        job_id = daemon.submit(SLA.format(name="deaf"), source="deaf.yaml", base_dir=None)["job"]
        await daemon.dispatch()
        assert job_id in daemon.running
        await _until("the job ignores SIGTERM", ready.exists, 20)
        client = await api_client(daemon)
        try:
            asked = time.monotonic()
            r = await client.post(f"/v1/jobs/{job_id}/cancel", headers=bearer(daemon.token))
            assert (await r.json()) == {"was": "running", "now": "stopping"}
            await _until("the job ended", lambda: job_id not in daemon.running, 15)
            took = time.monotonic() - asked
        finally:
            await client.close()
        job = daemon.store.job(job_id)
        assert job is not None and (job.state, job.exit_code) == ("cancelled", -9)
        assert took >= 1.0  # the grace came first
        assert not daemon.leases.holders  # its devices are free again

    asyncio.run(go())


def test_a_job_cancelled_before_its_daemon_stopped_stays_cancelled(tmp_path: Path) -> None:
    """Was: re-queued by the next start, and run again."""
    d = make_daemon(tmp_path / "state")
    try:
        job_id = d.submit(SLA.format(name="gone"), source="gone.yaml", base_dir=None)["job"]
        assert d.store.claim(job_id)  # running, as the daemon that stopped left it
        assert d.store.request_cancel(job_id) == "running"
        assert workers.recover(d) == []
        job = d.store.job(job_id)
        assert job is not None and job.state == "cancelled"
    finally:
        d.close()
