"""The job queue's workers: start a queued job as a child process on its devices, watch it
until it exits, cancel or stop it; re-queue what a previous daemon left running.

A job runs in a session of its own (a signal to it reaches its whole tree) and dies with the
daemon (parent-death signal); what its end means is :mod:`autotuner.daemon.exits`'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from typing import IO, TYPE_CHECKING

import psutil

from autotuner.core.procs import kill_group, same_process, set_parent_death_signal, start_stamp
from autotuner.daemon import confine, exits, jobs, kinds
from autotuner.daemon.errors import UnknownJobKind
from autotuner.daemon.hostlocks import DeviceBusy
from autotuner.daemon.leases import LeaseError
from autotuner.daemon.store import Job, SlaRow
from autotuner.sla.spec import SlaError, parse_sla

if TYPE_CHECKING:
    from autotuner.daemon.service import Daemon

logger = logging.getLogger(__name__)
STOP_GRACE_S = 90.0  # a job's engines need ~10 s to stop; tune writes its state on the way
# A cancelled job gets the same grace as at a stop, then SIGKILL: a job that does not end on
# SIGTERM must not hold its devices until someone notices.
CANCEL_GRACE_S = STOP_GRACE_S


@dataclass
class Running:
    job: Job
    proc: asyncio.subprocess.Process
    devices: list[str]
    log: IO[bytes]
    stopping: bool = False  # the daemon interrupted it (not the job's own failure)
    killer: asyncio.Task[None] | None = None  # SIGKILL after a cancel's grace


# ---------------------------------------------------------------------------- start-up


def recover(d: Daemon) -> list[int]:
    """Jobs left ``running`` by a previous daemon: kill what survives, queue them again."""
    back = []
    for job in d.store.jobs(states=("running",)):
        if job.pid is not None and _same_process(job.pid, job.pid_start):
            logger.info("job %d: process %d outlived its daemon; stopping it", job.id, job.pid)
            kill_group(job.pid, [], grace_s=STOP_GRACE_S)
        try:
            if _recover_one(d, job):
                back.append(job.id)
        except Exception as exc:
            if not d.disk.note(exc, f"re-queueing job {job.id}"):
                raise
            d.disk.defer(f"re-queue job {job.id}", functools.partial(_recover_one, d, job))
    if back:
        logger.info("re-queued interrupted jobs: %s", back)
    return back


def _recover_one(d: Daemon, job: Job) -> bool:
    """Re-queue one job a previous daemon left running; False when it failed instead (or
    was cancelled: its cancel was asked for before the daemon stopped)."""
    if job.cancel_requested:
        d.store.finish(job.id, "cancelled", error="cancelled; the daemon stopped while it ended")
        return False
    if job.attempts >= d.config.max_attempts:
        d.store.finish(job.id, "failed", error="interrupted by daemon crashes too often")
        d.alert(
            "job_failed",
            job.sla,
            "warning",
            f"job {job.id} ({job.kind}) was interrupted by daemon crashes too often",
            {"job": job.id},
        )
        return False
    d.store.requeue(job.id, error="interrupted: the daemon stopped while it ran")
    return True


# ---------------------------------------------------------------------------- one queued job


async def start_queued(d: Daemon, job: Job, ours: set[int]) -> None:
    """Start ``job`` if its devices are free (else note in ``d.waiting`` why not yet)."""
    row = d.store.get_sla(job.sla)
    if row is None:
        d.store.finish(job.id, "cancelled", error="its SLA was deleted")
        return
    try:
        kind = kinds.get(job.kind)
    except UnknownJobKind as exc:
        d.store.finish(job.id, "failed", error=str(exc))
        return
    try:
        wanted = _devices(d, row) if kind.leases_devices(d.config) else []
    except (SlaError, LeaseError) as exc:
        d.store.finish(job.id, "failed", error=str(exc))
        d.alert("job_failed", job.sla, "warning", f"job {job.id}: {exc}", {})
        return
    why = d.leases.available(wanted, ours)
    if why is not None:
        d.waiting[job.id] = why
        return
    why_not = kind.cannot_run(row)
    if why_not is not None:
        d.store.finish(job.id, "cancelled", error=why_not)
        return
    argv = kind.argv(d, job, row)
    try:  # before the claim: another daemon on the host may have taken a device
        d.leases.acquire(wanted, job.id)
    except DeviceBusy as exc:
        d.waiting[job.id] = str(exc)
        return
    try:
        claimed = d.store.claim(job.id)
    except BaseException:
        d.leases.release(job.id, used=False)
        raise
    if not claimed:
        d.leases.release(job.id, used=False)
        return
    try:
        await _start(d, job, argv, wanted)
    except Exception as exc:
        d.leases.release(job.id)
        if d.disk.note(exc, f"starting job {job.id}"):
            # claimed but never started: back to the queue once there is space again
            d.disk.defer(f"re-queue job {job.id}", lambda: _unclaim(d, job.id))
            return
        if not isinstance(exc, OSError):
            logger.exception("job %d: could not be started", job.id)
        fail(d, job, f"could not start: {exc}")


def _unclaim(d: Daemon, job_id: int) -> None:
    d.store.undo_attempt(job_id)
    d.store.requeue(job_id, error="not started: the state directory's disk was full")


def fail(d: Daemon, job: Job, why: str) -> None:
    """Fail one job whose own handling went wrong, and say so (job_failed)."""
    d.leases.release(job.id, used=False)
    d.store.finish(job.id, "failed", error=why)
    d.alert("job_failed", job.sla, "warning", f"job {job.id} ({job.kind}) {why}", {"job": job.id})


def _devices(d: Daemon, row: SlaRow) -> list[str]:
    """The devices an SLA's jobs lease; parsed once per SLA text (dispatch runs every
    second over the whole queue)."""
    cached = d.targets.get(row.name)
    if cached is None or cached[0] != row.yaml:
        sla = parse_sla(row.yaml, row.name)
        cached = (row.yaml, (sla.target.kind, list(sla.target.devices)))
        d.targets[row.name] = cached
    kind, devices = cached[1]
    return d.leases.devices_for(kind, devices)


async def _start(d: Daemon, job: Job, argv: list[str], devices: list[str]) -> None:
    # An earlier attempt's outcome file must not vouch for this one.
    d.layout.outcome(job.sla, job.id).unlink(missing_ok=True)
    log_path = d.layout.log(job.id)
    log = log_path.open("ab")
    log.write(
        f"--- {datetime.now().astimezone().isoformat()} attempt {job.attempts + 1}: "
        f"{' '.join(argv)}\n".encode()
    )
    log.flush()
    env = jobs.job_env(os.environ, confine.path_roots(d.root, d.config.allowed_paths))
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        cwd=str(d.root),
        start_new_session=True,
        preexec_fn=set_parent_death_signal,
    )
    # From here on the process runs: it is watched whatever the bookkeeping below does.
    run = Running(job, proc, devices, log)
    d.running[job.id] = run
    asyncio.get_running_loop().create_task(_watch(d, run))
    logger.info(
        "job %d (%s %s on %s) started: pid %d", job.id, job.kind, job.sla, job.engine, proc.pid
    )
    born = start_stamp(proc.pid)
    try:
        if born is not None:  # else already gone (it failed at once): its exit is handled below
            d.store.set_pid(job.id, proc.pid, born)
        run.job = d.store.job(job.id) or job
    except Exception as exc:  # unrecorded, the PID only matters to a restart's clean-up
        if not d.disk.note(exc, f"recording job {job.id}'s process"):
            logger.exception("job %d: its process could not be recorded", job.id)


async def _watch(d: Daemon, run: Running) -> None:
    code = await run.proc.wait()
    with contextlib.suppress(OSError):
        run.log.close()
    d.running.pop(run.job.id, None)
    d.leases.release(run.job.id)
    exits.record(d, run, code)
    d.wake.set()


# ---------------------------------------------------------------------------- stopping


def cancel(d: Daemon, job_id: int) -> str | None:
    """Cancel a job (a running one is sent SIGTERM, and SIGKILL if it still runs
    ``CANCEL_GRACE_S`` later); its state before, None if no such job. Called in the event
    loop."""
    state = d.store.request_cancel(job_id)
    run = d.running.get(job_id)
    if state == "running" and run is not None:
        _signal_session(run.proc.pid, signal.SIGTERM)
        if run.killer is None:
            run.killer = asyncio.get_running_loop().create_task(_kill_after(run, CANCEL_GRACE_S))
    return state


async def _kill_after(run: Running, grace_s: float) -> None:
    """SIGKILL the job's process group unless it ended within ``grace_s``."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(run.proc.wait()), grace_s)
        return
    if run.proc.returncode is None:  # not reaped: the pid is still this job's
        logger.warning(
            "job %d still running %.0f s after it was cancelled: SIGKILL", run.job.id, grace_s
        )
        _signal_session(run.proc.pid, signal.SIGKILL)


async def stop_all(d: Daemon) -> None:
    """SIGTERM every job (they stop their engines and save their state); kill what is left
    after ``STOP_GRACE_S``."""
    for run in d.running.values():
        run.stopping = True
        _signal_session(run.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while d.running and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    for run in list(d.running.values()):
        kill_group(run.proc.pid, [], grace_s=1.0)
    while d.running and time.monotonic() < deadline + 10:
        await asyncio.sleep(0.1)


def _same_process(pid: int, start: float | None) -> bool:
    if start is None:  # recorded without its start: the pid is all there is
        return psutil.pid_exists(pid)
    return same_process(pid, start)


def _signal_session(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # jobs lead their own session: pgid == pid
