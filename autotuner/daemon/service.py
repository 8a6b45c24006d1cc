"""The daemon's core: submissions, the job loop, schedules, engine watching, alerts.

Everything runs on one asyncio loop; jobs are child processes in their own sessions (so a
signal to them reaches their whole tree) that die with the daemon (parent-death signal) and
whose engines have their own guards. State lives in the store, so a restart picks up where
the last process stopped: running jobs whose process is gone go back to the queue, and a
``tune`` job resumes its Optuna study (the interrupted trial is failed and re-queued there).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import ipaddress
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import aiohttp
import psutil
from annotated_types import Le

from autotuner.core import confined
from autotuner.core.paths import atomic_write_text
from autotuner.core.procs import set_parent_death_signal
from autotuner.core.text import printable
from autotuner.daemon import (
    alerts,
    confine,
    diskfull,
    ending,
    engine_checks,
    jobs,
    kinds,
    spool,
    tokens,
    watch,
)
from autotuner.daemon.config import ConfigError, DaemonConfig, check_cron, next_run
from autotuner.daemon.diskfull import DiskFull
from autotuner.daemon.errors import AlreadyRunning, SubmitError, UnknownJobKind
from autotuner.daemon.forgotten import refuse_forgotten
from autotuner.daemon.hostlocks import DeviceBusy, HostLocks, default_lock_dir
from autotuner.daemon.leases import GpuView, LeaseError, Leases, our_pids
from autotuner.daemon.metrics import StoreCollector
from autotuner.daemon.offload import ParseSlots
from autotuner.daemon.store import Job, SlaRow, Store
from autotuner.engines import envs
from autotuner.records.daemon import DaemonInfo
from autotuner.records.promotion import Promotion
from autotuner.sla.spec import Sla, SlaError, TuneSpec, parse_sla

logger = logging.getLogger(__name__)
STOP_GRACE_S = 90.0  # a job's engines need ~10 s to stop; tune writes its state on the way
# Validations at once (CPU-bound under the GIL: more would only share one core and the memory
# of a parsed 1 MiB SLA) and callers that may wait for one.
PARSE_SLOTS = 2
MAX_WAITING_PARSES = 128
DISK_PROBE_S = 10.0  # while the state disk is full: how often a probe write tries again
DISK_ALERT_EVERY_S = 3600.0  # a disk that fills again within this raises no new alert


@dataclass
class Running:
    job: Job
    proc: asyncio.subprocess.Process
    devices: list[str]
    log: IO[bytes]
    stopping: bool = False  # the daemon interrupted it (not the job's own failure)


# Bounds of the numbers a submission carries (checked before anything is written).
MAX_PRIORITY = 1_000_000


def _schema_max_trials() -> int:
    """A re-tune adds at most what an SLA's ``tune.trials`` may ask for."""
    for m in TuneSpec.model_fields["trials"].metadata:
        if isinstance(m, Le) and isinstance(m.le, int):
            return m.le
    raise AssertionError("TuneSpec.trials has no upper bound")


MAX_EXTRA_TRIALS = _schema_max_trials()


@dataclass(frozen=True)
class Submission:
    """A submission validated without touching the store (see ``Daemon.prepare``)."""

    sla: Sla
    text: str
    source: str
    engine: str
    pinned: str
    schedule: str | None


class Daemon:
    def __init__(self, config: DaemonConfig, *, gpus: GpuView | None = None) -> None:
        self.config = config
        self.root = config.state_dir
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # the token, SLAs and logs are the operator's business
        self.layout = jobs.Layout(self.root)
        lock_dir = config.lease_dir or default_lock_dir()
        try:
            host_locks = HostLocks(lock_dir, owner=str(self.root))
        except OSError as exc:
            raise ConfigError(f"lease_dir {lock_dir}: cannot use it: {exc}") from None
        self._lock = self._take_lock()
        try:
            self.spool = spool.Spool(self.root / "spool", config.max_request_bytes)
            self.spool.ensure_dirs()  # its own folders, never links (spool.SpoolTreeError)
            refuse_forgotten(self.root, self.root / "daemon.db")
            self.store = Store(self.root / "daemon.db")
        except BaseException:  # e.g. a database of a newer autotuner: free the state dir
            self._lock.close()
            raise
        try:  # a token file no request can match (tokens.TokenFileError) stops the start
            self.token = tokens.read_or_create(self.root / tokens.ADMIN_FILE)
            self.metrics_token = tokens.read_or_create(self.root / tokens.METRICS_FILE)
        except BaseException:
            self.store.close()
            self._lock.close()
            raise
        self.leases = Leases(
            gpus,
            exclude=config.exclude_gpus,
            idle_mib=config.gpu_idle_mib,
            free_timeout_s=config.gpu_free_timeout_s,
            host=host_locks,
        )
        self.spool_refusals: deque[dict[str, Any]] = deque(maxlen=20)  # since this start
        self.engine_checks = engine_checks.load(self.root)  # the doctor's, per engine
        self._spool_scan: asyncio.Task[list[tuple[str, bool]]] | None = None
        self.bind = ""
        self.started = time.time()
        self.running: dict[int, Running] = {}
        self.waiting: dict[int, str] = {}  # job id -> why it cannot start yet
        self._targets: dict[str, tuple[str, tuple[str, list[str]]]] = {}  # SLA -> text, target
        self.stopping = False
        self.wake = asyncio.Event()
        self.url = ""
        self.parses = ParseSlots(PARSE_SLOTS, MAX_WAITING_PARSES)  # the API's and the spool's
        self.disk_full: DiskFull | None = None  # writes under the state dir fail for space
        self._disk_alerted = float("-inf")
        # Writes that failed for lack of space, redone in order once a probe write succeeds.
        self._deferred: list[tuple[str, Callable[[], object]]] = []
        self.memory_alerts: dict[int, dict[str, Any]] = {}  # alerts the store could not take
        self.deliverer: alerts.Deliverer | None = None  # while run_loops runs
        self._bad_schedules: dict[str, str] = {}  # SLA -> schedule already reported broken
        self._loop_error = ""  # the last error a step of the loop survived (logged once)
        for sub in ("logs", "slas", "studies", "runs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def _take_lock(self) -> IO[str]:
        """One daemon per state directory (two would run every job twice)."""
        f = (self.root / "daemon.lock").open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise AlreadyRunning(f"another daemon is running on {self.root}") from None
        return f

    def close(self) -> None:
        if self.leases.host is not None:
            self.leases.host.close()
        self.store.close()
        self._lock.close()

    # ------------------------------------------------------------------ start-up
    def recover(self) -> list[int]:
        """Jobs left ``running`` by a previous daemon: kill what survives, queue them again."""
        back = []
        for job in self.store.jobs(states=("running",)):
            if job.pid is not None and _same_process(job.pid, job.pid_start):
                logger.info("job %d: process %d outlived its daemon; stopping it", job.id, job.pid)
                _kill_session(job.pid, grace_s=STOP_GRACE_S)
            try:
                if self._recover_one(job):
                    back.append(job.id)
            except Exception as exc:
                if not self.note_disk_error(exc, f"re-queueing job {job.id}"):
                    raise
                self._defer(f"re-queue job {job.id}", functools.partial(self._recover_one, job))
        if back:
            logger.info("re-queued interrupted jobs: %s", back)
        return back

    def _recover_one(self, job: Job) -> bool:
        """Re-queue one job a previous daemon left running; False when it failed instead."""
        if job.attempts >= self.config.max_attempts:
            self.store.finish(job.id, "failed", error="interrupted by daemon crashes too often")
            self.alert(
                "job_failed",
                job.sla,
                "warning",
                f"job {job.id} ({job.kind}) was interrupted by daemon crashes too often",
                {"job": job.id},
            )
            return False
        self.store.requeue(job.id, error="interrupted: the daemon stopped while it ran")
        return True

    def write_address(self, host: str, port: int) -> None:
        """Record where the API listens: ``bind`` is the address it is bound to, ``url`` the
        one local clients use (loopback when bound to every interface). A bind beyond
        loopback gets a warning: the bearer token then crosses the network in clear text."""
        wildcard = host in ("0.0.0.0", "::", "")
        self.bind = _host_port(host or "0.0.0.0", port)
        self.url = f"http://{_host_port('127.0.0.1' if wildcard else host, port)}"
        info = DaemonInfo(url=self.url, bind=self.bind, pid=os.getpid(), started=self.started)
        try:
            atomic_write_text(self.root / "daemon.json", info.to_json(indent=None) + "\n")
        except OSError as exc:  # a full disk: serve anyway (clients may pass --url)
            if not self.note_disk_error(exc, "writing daemon.json"):
                raise
        where = " (every interface)" if wildcard else ""
        logger.info("autotuner daemon listening on %s%s (state: %s)", self.bind, where, self.root)
        if not _loopback(host):
            logger.warning(
                "the API listens on %s%s, beyond loopback, without TLS: the bearer token "
                "crosses the network in clear text; put a TLS proxy in front of it or bind "
                "127.0.0.1",
                self.bind,
                where,
            )

    # ------------------------------------------------------------------ submissions
    def submit(
        self,
        text: str,
        *,
        source: str,
        base_dir: Path | None,
        priority: int = 0,
        schedule: str | None = None,
    ) -> dict[str, Any]:
        """Validate and register an SLA, queue its first tune. Raises SubmitError."""
        check_priority(priority)
        return self.register(
            self.prepare(text, source=source, base_dir=base_dir, schedule=schedule),
            priority=priority,
        )

    def prepare(
        self, text: str, *, source: str, base_dir: Path | None, schedule: str | None = None
    ) -> Submission:
        """Validate a submission without touching the store, so the API and the spool run it
        on a thread of its own (a slow parse must not stall the event loop). Raises
        SubmitError: 413 over the size cap, 400 for a bad SLA, path, storage, schedule or
        engine.

        ``base_dir`` is where relative paths resolve (the spool); None for HTTP, where paths
        must be absolute. Either way the SLA came from outside: ``tune.storage`` and the
        files it names are confined (:mod:`autotuner.daemon.confine`)."""
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.config.max_request_bytes:
            raise SubmitError(
                413,
                [
                    f"{source}: {size} bytes is over the daemon's limit of "
                    f"{self.config.max_request_bytes} bytes (max_request_bytes)"
                ],
            )
        try:
            sla = parse_sla(text, source, base_dir)
        except SlaError as exc:
            raise SubmitError(400, [p.render(source) for p in exc.problems]) from None
        bad = _relative_paths(sla) if base_dir is None else []
        bad = bad or confine.problems(sla, self.root, self.config.allowed_paths)
        if bad:
            raise SubmitError(400, [f"{source}: {b}" for b in bad])
        if base_dir is not None:  # the files are confined: now they may be read
            roots = confine.path_roots(self.root, self.config.allowed_paths)
            try:  # and again as they are opened: a link may have been swapped in since
                with confined.confined_to(roots):
                    sla = parse_sla(text, source, base_dir, check_files=True)
            except SlaError as exc:
                raise SubmitError(400, [p.render(source) for p in exc.problems]) from None
        if schedule is not None:
            try:
                check_cron(schedule)
            except ValueError as exc:
                raise SubmitError(400, [f"schedule: {exc}"]) from None
        engine = self._engine_for(sla, source)
        return Submission(sla, text, source, engine, jobs.pinned_yaml(sla, engine), schedule)

    def register(self, sub: Submission, *, priority: int = 0) -> dict[str, Any]:
        """Register a prepared submission and queue its first tune (on the event loop)."""
        check_priority(priority)
        self.refuse_if_full()
        try:
            return self._register(sub, priority)
        except Exception as exc:
            if self.note_disk_error(exc, f"registering {sub.sla.name}"):
                raise SubmitError(507, [self.full_message()]) from None
            raise

    def _register(self, sub: Submission, priority: int) -> dict[str, Any]:
        sla, text, source, engine, pinned = sub.sla, sub.text, sub.source, sub.engine, sub.pinned
        schedule = sub.schedule
        existing = self.store.get_sla(sla.name)
        if existing is not None:
            if existing.yaml != text:
                raise SubmitError(
                    409,
                    [
                        f"{source}: an SLA named {sla.name!r} is registered with other "
                        "content; submit it under another name, or delete the old one first"
                    ],
                )
            job = self.store.pending(sla.name, "tune")
            job_id = job.id if job else self.enqueue_tune(sla.name, engine, priority=priority)
            return {"sla": sla.name, "job": job_id, "engine": engine, "created": False}
        atomic_write_text(self.layout.sla_dir(sla.name) / "source.yaml", text)
        atomic_write_text(self.layout.sla_file(sla.name, engine), pinned)
        if not self.store.add_sla(sla.name, text, schedule or self.config.schedule, engine):
            # a racing submission of the same name won
            raise SubmitError(409, [f"{source}: {sla.name!r} was just submitted"])
        # dispatch needs the SLA's devices: from this parse, not another on the event loop
        self._targets[sla.name] = (text, (sla.target.kind, list(sla.target.devices)))
        job_id = self.enqueue_tune(sla.name, engine, priority=priority)
        logger.info("submitted %s (engine %s): job %d", sla.name, engine, job_id)
        return {"sla": sla.name, "job": job_id, "engine": engine, "created": True}

    def _engine_for(self, sla: Sla, source: str) -> str:
        """The registered engine environment the SLA runs on (its name)."""
        registered = envs.list_envs()
        if sla.engine.name:
            if not any(e.name == sla.engine.name for e in registered):
                names = ", ".join(e.name for e in registered) or "none"
                raise SubmitError(
                    400,
                    [
                        f"{source}: engine.name: no engine environment {sla.engine.name!r} "
                        f"(registered: {names}; see `autotuner engine list`)"
                    ],
                )
            return sla.engine.name
        if sla.engine.python:
            want = Path(sla.engine.python).expanduser()
            for e in registered:
                if e.python == want:
                    return e.name
            raise SubmitError(
                400,
                [
                    f"{source}: engine.python: the daemon runs registered engines only; register "
                    f"it with `autotuner engine add NAME --python {want}` and name it in the SLA"
                ],
            )
        of_kind = [e for e in registered if e.kind == sla.engine.kind]
        if len(of_kind) == 1:
            return of_kind[0].name
        names = ", ".join(e.name for e in of_kind) or "none registered"
        raise SubmitError(
            400, [f"{source}: engine: name the engine environment to use (engine.name: {names})"]
        )

    def enqueue_tune(self, sla: str, engine: str, *, priority: int = 0, extra: int = 0) -> int:
        job_id = self.store.enqueue(
            "tune", sla, engine, args={"extra_trials": extra}, priority=priority
        )
        self.wake.set()
        return job_id

    def enqueue_recheck(self, sla: str, engine: str, *, priority: int = 0) -> int:
        job_id = self.store.enqueue("recheck", sla, engine, priority=priority)
        self.wake.set()
        return job_id

    def enqueue_regression(self, sla: str, old: str, new: str, *, priority: int = 0) -> int:
        """Compare the promoted config of ``sla`` on engine ``old`` with engine ``new``."""
        job_id = self.store.enqueue(
            "regression", sla, new, args={"old": old, "new": new}, priority=priority
        )
        self.wake.set()
        return job_id

    def delete_sla(self, name: str) -> bool:
        row = self.store.get_sla(name)
        if row is None:
            return False
        for job in self.store.jobs(states=("queued", "running"), sla=name):
            self.cancel(job.id)
        self.store.delete_sla(name)
        return True

    def cancel(self, job_id: int) -> str | None:
        state = self.store.request_cancel(job_id)
        run = self.running.get(job_id)
        if state == "running" and run is not None:
            _signal_session(run.proc.pid, signal.SIGTERM)
        return state

    # ------------------------------------------------------------------ requests (the API)
    def study(self, name: str) -> dict[str, Any] | None:
        """One SLA with its newest jobs and its verdicts; None if there is no such SLA."""
        row = self.store.get_sla(name)
        if row is None:
            return None
        return {
            **row.to_dict(),
            "jobs": [j.to_dict() for j in self.store.jobs(sla=name, limit=50)],
            "verdicts": [v for v in self.store.verdicts() if v["sla"] == name],
        }

    def tune_now(self, name: str, extra: int = 0) -> int:
        """Queue a re-tune of SLA ``name`` adding ``extra`` launches; SubmitError 404 if none,
        400 if ``extra`` is out of bounds."""
        check_extra_trials(extra)
        row = self.store.get_sla(name)
        if row is None:
            raise SubmitError(404, [f"no SLA named {name!r}"])
        return self.enqueue_tune(name, row.engine, extra=extra)

    def check_now(self, name: str) -> int:
        """Queue a re-check of the promoted config of ``name`` ahead of the queue; SubmitError
        404 if there is no such SLA, 409 if nothing is promoted yet."""
        row = self.store.get_sla(name)
        if row is None:
            raise SubmitError(404, [f"no SLA named {name!r}"])
        if row.promotion is None:
            raise SubmitError(409, [f"{name}: nothing promoted yet to re-check"])
        return self.enqueue_recheck(name, row.promotion.engine or row.engine, priority=1)

    def list_jobs(self, states: tuple[str, ...] = (), limit: int = 200) -> list[Job]:
        return self.store.jobs(states=states, limit=limit)

    def get_job(self, job_id: int) -> Job | None:
        return self.store.job(job_id)

    def list_alerts(self, limit: int = 100) -> list[dict[str, Any]]:
        """Newest first: alerts kept in memory (the disk is full) before the stored ones."""
        held = sorted(self.memory_alerts.values(), key=lambda a: a["id"])[:limit]
        return held + self.store.alerts(limit=limit - len(held)) if limit > len(held) else held

    def list_engines(self) -> dict[str, dict[str, Any]]:
        return self.store.engines()

    def collector(self) -> StoreCollector:
        """The Prometheus collector of this daemon's state (read at scrape time)."""
        return StoreCollector(
            self.store, self.leases.snapshot, self.started, lambda: self.disk_full is not None
        )

    # ------------------------------------------------------------------ the job loop
    async def dispatch(self) -> None:
        """Start every queued job whose devices are free (highest priority first)."""
        if self.stopping:
            return
        self.waiting.clear()
        ours = our_pids() if self.leases.gpus is not None else set()
        for job in self.store.queued(time.time()):
            if self.disk_full is not None:
                break
            try:
                await self._dispatch_one(job, ours)
            except Exception as exc:  # this job's bookkeeping failed: the job, not the loop
                if not self.note_disk_error(exc, f"starting job {job.id}"):
                    logger.exception("job %d: could not be started", job.id)
                    self._fail_job(job, f"could not be started: internal error: {exc!r}")
        if self.disk_full is not None:  # a job's log, study and outcome need the disk
            for job in self.store.queued(time.time()):
                self.waiting[job.id] = self.full_message()

    async def _dispatch_one(self, job: Job, ours: set[int]) -> None:
        row = self.store.get_sla(job.sla)
        if row is None:
            self.store.finish(job.id, "cancelled", error="its SLA was deleted")
            return
        try:
            kind = kinds.get(job.kind)
        except UnknownJobKind as exc:
            self.store.finish(job.id, "failed", error=str(exc))
            return
        try:
            wanted = self._devices(row) if kind.leases_devices(self.config) else []
        except (SlaError, LeaseError) as exc:
            self.store.finish(job.id, "failed", error=str(exc))
            self.alert("job_failed", job.sla, "warning", f"job {job.id}: {exc}", {})
            return
        why = self.leases.available(wanted, ours)
        if why is not None:
            self.waiting[job.id] = why
            return
        why_not = kind.cannot_run(row)
        if why_not is not None:
            self.store.finish(job.id, "cancelled", error=why_not)
            return
        argv = kind.argv(self, job, row)
        try:  # before the claim: another daemon on the host may have taken a device
            self.leases.acquire(wanted, job.id)
        except DeviceBusy as exc:
            self.waiting[job.id] = str(exc)
            return
        try:
            claimed = self.store.claim(job.id)
        except BaseException:
            self.leases.release(job.id, used=False)
            raise
        if not claimed:
            self.leases.release(job.id, used=False)
            return
        try:
            await self._start(job, argv, wanted)
        except Exception as exc:
            self.leases.release(job.id)
            if self.note_disk_error(exc, f"starting job {job.id}"):
                # claimed but never started: back to the queue once there is space again
                self._defer(f"re-queue job {job.id}", lambda: self._unclaim(job.id))
                return
            if not isinstance(exc, OSError):
                logger.exception("job %d: could not be started", job.id)
            self._fail_job(job, f"could not start: {exc}")

    def _unclaim(self, job_id: int) -> None:
        self.store.undo_attempt(job_id)
        self.store.requeue(job_id, error="not started: the state directory's disk was full")

    def _fail_job(self, job: Job, why: str) -> None:
        """Fail one job whose own handling went wrong, and say so (job_failed)."""
        self.leases.release(job.id, used=False)
        self.store.finish(job.id, "failed", error=why)
        self.alert(
            "job_failed", job.sla, "warning", f"job {job.id} ({job.kind}) {why}", {"job": job.id}
        )

    def _devices(self, row: SlaRow) -> list[str]:
        """The devices an SLA's jobs lease; parsed once per SLA text (dispatch runs every
        second over the whole queue)."""
        cached = self._targets.get(row.name)
        if cached is None or cached[0] != row.yaml:
            sla = parse_sla(row.yaml, row.name)
            cached = (row.yaml, (sla.target.kind, list(sla.target.devices)))
            self._targets[row.name] = cached
        kind, devices = cached[1]
        return self.leases.devices_for(kind, devices)

    def _pin(self, row: SlaRow, engine: str) -> None:
        jobs.pin(self.layout, row, engine)

    async def _start(self, job: Job, argv: list[str], devices: list[str]) -> None:
        # An earlier attempt's outcome file must not vouch for this one.
        self.layout.outcome(job.sla, job.id).unlink(missing_ok=True)
        log_path = self.layout.log(job.id)
        log = log_path.open("ab")
        log.write(
            f"--- {datetime.now().astimezone().isoformat()} attempt {job.attempts + 1}: "
            f"{' '.join(argv)}\n".encode()
        )
        log.flush()
        env = jobs.job_env(os.environ, confine.path_roots(self.root, self.config.allowed_paths))
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=str(self.root),
            start_new_session=True,
            preexec_fn=set_parent_death_signal,
        )
        # From here on the process runs: it is watched whatever the bookkeeping below does.
        run = Running(job, proc, devices, log)
        self.running[job.id] = run
        asyncio.get_running_loop().create_task(self._watch(run))
        logger.info(
            "job %d (%s %s on %s) started: pid %d", job.id, job.kind, job.sla, job.engine, proc.pid
        )
        try:
            born = psutil.Process(proc.pid).create_time()
        except psutil.Error:  # already gone (it failed at once): its exit is handled below
            born = time.time()
        try:
            self.store.set_pid(job.id, proc.pid, born)
            run.job = self.store.job(job.id) or job
        except Exception as exc:  # unrecorded, the PID only matters to a restart's clean-up
            if not self.note_disk_error(exc, f"recording job {job.id}'s process"):
                logger.exception("job %d: its process could not be recorded", job.id)

    async def _watch(self, run: Running) -> None:
        code = await run.proc.wait()
        with contextlib.suppress(OSError):
            run.log.close()
        self.running.pop(run.job.id, None)
        self.leases.release(run.job.id)
        self._record_end(run, code)
        self.wake.set()

    def _record_end(self, run: Running, code: int) -> None:
        """Act on a job's end; a failure here fails that job (never the loop), and one for
        lack of space is done again once there is space."""
        job_id = run.job.id
        try:
            self._finished(run, code)
            return
        except Exception as exc:
            if self.note_disk_error(exc, f"recording how job {job_id} ended"):
                self._defer(f"record how job {job_id} ended", lambda: self._finished(run, code))
                return
            logger.exception("job %d: handling its end failed", job_id)
            error = f"internal: {exc!r}"
        try:  # a bug in handling must not leave the job "running"
            self.store.finish(job_id, "failed", exit_code=code, error=error)
            self.alert(
                "job_failed",
                run.job.sla,
                "warning",
                f"job {job_id} ({run.job.kind}): handling its end failed: {error}",
                {"job": job_id, "exit_code": code},
            )
        except Exception as exc:
            if not self.note_disk_error(exc, f"recording how job {job_id} ended"):
                logger.exception("job %d: could not be marked failed", job_id)

    def _finished(self, run: Running, code: int) -> None:
        job = self.store.job(run.job.id)
        assert job is not None
        logger.info("job %d (%s %s) exited with %d", job.id, job.kind, job.sla, code)
        if job.cancel_requested:
            self.store.finish(job.id, "cancelled", exit_code=code)
            return
        if run.stopping:
            self.store.undo_attempt(job.id)
            self.store.requeue(job.id, error="interrupted: the daemon was stopped")
            return
        interrupted = code in (130, -signal.SIGTERM, -signal.SIGKILL)
        kind = kinds.get(job.kind)
        end = ending.judge(code, kind.results, self.layout.outcome(job.sla, job.id))
        if end.verdict == "failed":  # bad input, a crash, or a result nothing vouches for
            error = "\n".join(filter(None, [end.why, self._tail(job.id)]))
            self.store.finish(job.id, "failed", exit_code=code, error=error)
            self.alert(
                "job_failed",
                job.sla,
                "warning",
                f"job {job.id} ({job.kind}) {end.why}",
                {"job": job.id, "exit_code": code},
            )
            return
        if end.verdict == "retry":
            if job.attempts < self.config.max_attempts:
                delay = 30.0 * 2 ** (job.attempts - 1)
                self.store.requeue(
                    job.id, delay_s=delay, error=f"exit {code}: {self._tail(job.id)}"
                )
                return
            self.store.finish(job.id, "failed", exit_code=code, error=self._tail(job.id))
            self.alert(
                "job_failed",
                job.sla,
                "warning",
                f"job {job.id} ({job.kind}) failed {job.attempts} times "
                f"({'interrupted' if interrupted else f'exit {code}'})",
                {"job": job.id},
            )
            return
        outcome = kind.finished(self, job, code)
        self.store.finish(job.id, "done", exit_code=code, outcome=outcome)

    def _tail(self, job_id: int, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            text = self.layout.log(job_id).read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    # ------------------------------------------------------------------ schedules
    def tick_schedules(self, now: float) -> list[int]:
        """Queue the nightly re-check (or tune, if nothing is promoted) of every SLA due."""
        queued = []
        for row in self.store.slas():
            try:
                job = self._tick_one(row, now)
            except Exception as exc:  # this SLA's schedule fails, not the loop
                if self.note_disk_error(exc, f"planning the re-check of {row.name}"):
                    break
                self._schedule_failed(row, exc)
                continue
            self._bad_schedules.pop(row.name, None)
            if job is not None:
                queued.append(job)
        return queued

    def _tick_one(self, row: SlaRow, now: float) -> int | None:
        if row.next_check is None:
            if row.promotion is not None:
                self.store.update_sla(row.name, next_check=next_run(row.schedule, now))
            return None
        if row.next_check > now:
            return None
        self.store.update_sla(row.name, next_check=next_run(row.schedule, now))
        if self.store.jobs(states=("queued", "running"), sla=row.name):
            return None  # already busy: the next night will check again
        if row.promotion is None:
            return self.enqueue_tune(row.name, row.engine)
        return self.enqueue_recheck(row.name, row.promotion.engine or row.engine)

    def _schedule_failed(self, row: SlaRow, exc: Exception) -> None:
        """Say once per schedule that an SLA's re-checks can't be planned (a schedule that
        never fires, stored by an older daemon; a damaged row)."""
        if self._bad_schedules.get(row.name) == row.schedule:
            return
        self._bad_schedules[row.name] = row.schedule
        why = str(exc) or type(exc).__name__
        if isinstance(exc, ValueError):
            why = f"schedule {row.schedule!r}: {why}"
        self.alert(
            "schedule_failed",
            row.name,
            "warning",
            f"{row.name}: its re-checks can't be planned ({why}); none is queued until it is "
            "fixed: delete the SLA and submit it again with a valid schedule",
            {"schedule": row.schedule, "error": why},
        )

    # ------------------------------------------------------------------ delegated
    def _tune_done(self, job: Job, code: int) -> dict[str, Any]:
        return kinds.get("tune").finished(self, job, code)

    def _recheck_done(self, job: Job, code: int) -> dict[str, Any]:
        return kinds.get("recheck").finished(self, job, code)

    def _regression_done(self, job: Job, code: int) -> dict[str, Any]:
        return kinds.get("regression").finished(self, job, code)

    probe_engines = staticmethod(watch.probe_engines)

    def scan_engines(
        self, probed: list[envs.EngineEnv | str] | None = None
    ) -> list[tuple[str, str | None, str]]:
        return watch.scan_engines(self, probed)

    def scan_spool(self, min_age_s: float = 1.0) -> list[tuple[str, bool]]:
        return spool.scan_spool(self, min_age_s)

    async def scan_spool_async(self, min_age_s: float = 1.0) -> list[tuple[str, bool]]:
        return await spool.scan_spool_async(self, min_age_s)

    def spool_rejected(self, name: str, messages: list[str], moved_to: Path | None) -> None:
        """Report a refused spool file everywhere a user looks: the log, an alert
        (``spool_rejected``, which /metrics counts) and ``status``."""
        shown = printable(str(moved_to)) if moved_to is not None else None  # names from outside
        where = f"moved to {shown}" if shown is not None else "left where it is"
        logger.warning("spool: %s refused (%s): %s", name, where, " | ".join(messages[:5]))
        details = {
            "file": name,
            "moved_to": shown,
            "errors": messages[:20],
        }
        self.spool_refusals.appendleft({"time": time.time(), **details})
        first = messages[0] if messages else "refused"
        self.alert("spool_rejected", "", "warning", f"spool file {name} refused: {first}", details)

    # ------------------------------------------------------------------ alerts
    def alert(
        self, kind: str, sla: str, severity: str, summary: str, details: dict[str, Any]
    ) -> None:
        level = logging.INFO if severity == "info" else logging.WARNING
        logger.log(level, "ALERT %s %s: %s", severity, kind, summary)
        try:
            self.store.add_alert(kind, sla, severity, summary, details)
        except Exception as exc:
            if not diskfull.is_full(exc):
                raise
            # Sent from memory meanwhile, stored once there is space (see _disk_back).
            alerts.memory_alert(self.memory_alerts, kind, sla, severity, summary, details)
            self.note_disk_error(exc, "recording an alert")
        self.wake.set()

    # ------------------------------------------------------------------ a full disk
    def full_message(self) -> str:
        full = self.disk_full
        why = f" ({full.why})" if full is not None else ""
        return (
            f"the disk of the daemon's state directory {self.root} is full{why}: new work is "
            "refused until space is freed"
        )

    def refuse_if_full(self) -> None:
        """SubmitError 507 while writes under the state directory fail for lack of space."""
        if self.disk_full is not None:
            raise SubmitError(507, [self.full_message()])

    def note_disk_error(self, exc: BaseException, doing: str) -> bool:
        """Whether ``exc`` says the state directory's disk is full. The first time: the
        daemon notes it (new work is refused, no job starts), logs it and raises a
        ``disk_full`` alert (critical), which is sent even though the store can't keep it."""
        if not diskfull.is_full(exc):
            return False
        if self.disk_full is not None:
            return True
        self.disk_full = DiskFull(f"{doing}: {diskfull.describe(exc)}", time.time())
        logger.error("%s", self.full_message())
        if time.time() - self._disk_alerted >= DISK_ALERT_EVERY_S:
            self._disk_alerted = time.time()
            self.alert(
                "disk_full",
                "",
                "critical",
                f"the disk of the daemon's state directory {self.root} is full ({doing}: "
                f"{diskfull.describe(exc)}); new submissions are refused (HTTP 507) and no "
                "job starts until space is freed",
                {"state_dir": str(self.root), "error": diskfull.describe(exc)},
            )
        self.wake.set()
        return True

    def _defer(self, what: str, redo: Callable[[], object]) -> None:
        self._deferred.append((what, redo))

    def probe_disk(self) -> bool:
        """While the disk is full: True (and what waited is done) once a probe write fits."""
        if self.disk_full is None:
            return True
        try:
            diskfull.probe(self.root)
        except OSError as exc:
            if not diskfull.is_full(exc):
                logger.warning("disk probe in %s failed: %s", self.root, exc)
            return False
        logger.info("the disk of %s has space again", self.root)
        self.disk_full = None
        self._disk_back()
        return self.disk_full is None

    def _disk_back(self) -> None:
        """Do the writes that waited for space, in order, then store the alerts kept in
        memory (with their delivery state); stops where the disk is full again."""
        while self._deferred:
            what, redo = self._deferred[0]
            try:
                redo()
            except Exception as exc:
                if self.note_disk_error(exc, what):
                    return
                logger.exception("%s failed", what)
            self._deferred.pop(0)
        for key in sorted(self.memory_alerts, reverse=True):  # oldest first
            a = self.memory_alerts[key]
            try:
                stored = self.store.add_alert(
                    a["kind"], a["sla"], a["severity"], a["summary"], a["details"]
                )
                if a["delivered"] == 1:
                    self.store.alert_sent(stored, True, next_try=0.0, error=None)
                elif a["delivered"] == -1:
                    self.store.give_up_alert(stored, str(a["last_error"]))
            except Exception as exc:
                if self.note_disk_error(exc, "storing the alerts kept in memory"):
                    return
                raise
            del self.memory_alerts[key]

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        running = []
        for job_id, run in self.running.items():
            d = self.store.job(job_id)
            running.append(
                {
                    **(d.to_dict() if d else {}),
                    "devices": run.devices,
                    "log": str(self.layout.log(job_id)),
                    "log_tail": self._tail(job_id, 3).splitlines(),
                }
            )
        return {
            "daemon": {
                "pid": os.getpid(),
                "url": self.url,
                "bind": self.bind,
                "started": self.started,
                "state_dir": str(self.root),
                "stopping": self.stopping,
            },
            "running": running,
            "queue": [
                {**j.to_dict(), "waiting_for": self.waiting.get(j.id)}
                for j in reversed(self.store.jobs(states=("queued",)))
            ],
            "leases": self.leases.snapshot(),
            "slas": [
                {
                    "name": r.name,
                    "engine": r.engine,
                    "schedule": r.schedule,
                    "next_check": r.next_check,
                    "promotion": _brief(r.promotion),
                    "fallback": _brief(r.fallback),
                    "summary": r.summary,
                }
                for r in self.store.slas()
            ],
            "alerts": self.list_alerts(limit=10),
            "disk": {
                "full": self.disk_full is not None,
                "why": self.disk_full.why if self.disk_full else None,
                "since": self.disk_full.since if self.disk_full else None,
            },
            "engines": self.store.engines(),
            "engine_checks": {n: engine_checks.summary(r) for n, r in self.engine_checks.items()},
            "spool": {
                "rejected": self.store.alert_counts().get("spool_rejected", 0),
                "recent": list(self.spool_refusals)[:5],
            },
        }

    # ------------------------------------------------------------------ main loop
    async def run_loops(self) -> None:
        """Dispatch, schedules, engines, spool and alerts until ``stop()``."""
        last_engines = last_spool = last_sched = last_probe = 0.0
        async with aiohttp.ClientSession() as session:
            # Webhooks are posted beside the loop: one that never answers delays only alerts.
            self.deliverer = alerts.Deliverer(
                self.store,
                self.config.webhooks,
                session,
                lambda: self.config.external_url or self.url,
                unstored=self.memory_alerts,
            )
            try:
                while not self.stopping:
                    now = time.monotonic()
                    if self.disk_full is not None and now - last_probe >= DISK_PROBE_S:
                        last_probe = now
                        self._survive("probing the disk", self.probe_disk)
                    if now - last_engines >= self.config.engine_poll_s:
                        last_engines = now
                        await self._scan_engines_safely()
                    idle = self._spool_scan is None or self._spool_scan.done()
                    room = self.disk_full is None  # a full disk: files wait in the spool
                    if now - last_spool >= self.config.spool_poll_s and idle and room:
                        last_spool = now  # a task: its parses never hold up dispatch or alerts
                        self._spool_scan = asyncio.create_task(self._scan_spool_safely())
                    if now - last_sched >= 15.0 and room:
                        last_sched = now
                        self._survive(
                            "planning re-checks", lambda: self.tick_schedules(time.time())
                        )
                    try:
                        await self.dispatch()
                    except Exception as exc:
                        self._survived("starting jobs", exc)
                    self._survive("queueing alerts", self.deliverer.kick)
                    self.wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            finally:
                await self.deliverer.close()
                self.deliverer = None

    def _survive(self, what: str, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception as exc:
            self._survived(what, exc)

    def _survived(self, what: str, exc: Exception) -> None:
        """A step of the loop failed: noted (the same error once, not every second), and
        the loop goes on; a full disk is handled as such."""
        if self.note_disk_error(exc, what):
            return
        seen = f"{what}: {exc!r}"
        if seen != self._loop_error:
            self._loop_error = seen
            logger.error("%s failed (the daemon goes on): %r", what, exc, exc_info=exc)

    async def _scan_spool_safely(self) -> list[tuple[str, bool]]:
        try:
            return await self.scan_spool_async()
        except Exception as exc:  # e.g. an unreadable spool folder: try again next time
            logger.warning("spool scan failed: %r", exc)
            return []

    async def _scan_engines_safely(self) -> None:
        try:
            probed = await asyncio.to_thread(self.probe_engines)
            self.scan_engines(probed)
            # the doctor's checks of new and changed environments (interpreters: off the loop)
            self.engine_checks, _ = await asyncio.to_thread(
                engine_checks.check_engines, self.root, probed, self.engine_checks
            )
        except Exception as exc:  # a broken registry must not stop the daemon
            logger.warning("engine scan failed: %r", exc)

    async def stop(self) -> None:
        """SIGTERM every job (they stop their engines and save their state), then return."""
        self.stopping = True
        if self._spool_scan is not None:
            self._spool_scan.cancel()  # a file it was reading goes back into the spool
        for run in self.running.values():
            run.stopping = True
            _signal_session(run.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        for run in list(self.running.values()):
            _kill_session(run.proc.pid, grace_s=1.0)
        while self.running and time.monotonic() < deadline + 10:
            await asyncio.sleep(0.1)


def _brief(p: Promotion | None) -> dict[str, Any] | None:
    if p is None:
        return None
    keys = ("engine", "engine_version", "label", "meets_sla", "goodput", "time", "bundle")
    data = p.to_json()
    return {k: data[k] for k in keys}


def check_priority(priority: int) -> None:
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise SubmitError(
            400, [f"priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}, got {priority}"]
        )


def check_extra_trials(extra: int) -> None:
    if not 0 <= extra <= MAX_EXTRA_TRIALS:
        raise SubmitError(400, [f"trials must be between 0 and {MAX_EXTRA_TRIALS}, got {extra}"])


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def _relative_paths(sla: Sla) -> list[str]:
    bad = []
    if sla.model.path is not None and not Path(sla.model.path).expanduser().is_absolute():
        bad.append("model.path: must be absolute in a submission over HTTP")
    if sla.workload.dataset is not None and not Path(sla.workload.dataset).is_absolute():
        bad.append("workload.dataset: must be absolute in a submission over HTTP")
    if sla.workload.trace is not None and not Path(sla.workload.trace).is_absolute():
        bad.append("workload.trace: must be absolute in a submission over HTTP")
    return bad


def _same_process(pid: int, start: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
        return start is None or abs(proc.create_time() - start) < 1.0
    except psutil.Error:
        return False


def _signal_session(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # jobs lead their own session: pgid == pid


def _kill_session(pid: int, grace_s: float) -> None:
    from autotuner.core.procs import kill_group

    kill_group(pid, [], grace_s=grace_s)
