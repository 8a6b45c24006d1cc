"""The daemon: one state directory, its store and its job queue, on one asyncio loop.

``Daemon`` holds the state and runs the loop; what it does is in modules of their own:
validating submissions (submissions), starting and watching jobs (workers) and acting on
their ends (exits, kinds, outcomes), the re-check schedules (schedules), engine watching
(watch), the spool (spool), a full disk (diskguard), an operator's requests (actions) and
the status (status).

Jobs are child processes in their own sessions (so a signal to them reaches their whole
tree) that die with the daemon (parent-death signal) and whose engines have their own
guards. State lives in the store, so a restart picks up where the last process stopped:
running jobs whose process is gone go back to the queue, and a ``tune`` job resumes its
Optuna study (the interrupted trial is failed and re-queued there).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import aiohttp

from autotuner.core.paths import atomic_write_text
from autotuner.daemon import (
    alerts,
    diskfull,
    engine_checks,
    schedules,
    spool,
    status,
    tokens,
    watch,
    workers,
)
from autotuner.daemon.config import ConfigError, DaemonConfig
from autotuner.daemon.diskguard import DiskGuard
from autotuner.daemon.errors import AlreadyRunning, SubmitError
from autotuner.daemon.forgotten import refuse_forgotten
from autotuner.daemon.hostlocks import HostLocks, default_lock_dir
from autotuner.daemon.jobs import Layout
from autotuner.daemon.leases import GpuView, Leases, our_pids
from autotuner.daemon.metrics import StoreCollector
from autotuner.daemon.offload import ParseSlots
from autotuner.daemon.store import Store
from autotuner.daemon.submissions import Submission, check_priority, prepare
from autotuner.daemon.workers import STOP_GRACE_S as STOP_GRACE_S
from autotuner.daemon.workers import Running
from autotuner.records.daemon import DaemonInfo

logger = logging.getLogger(__name__)
# Validations at once (CPU-bound under the GIL: more would only share one core and the memory
# of a parsed 1 MiB SLA) and callers that may wait for one.
PARSE_SLOTS = 2
MAX_WAITING_PARSES = 128
DISK_PROBE_S = 10.0  # while the state disk is full: how often a probe write tries again


class Daemon:
    def __init__(self, config: DaemonConfig, *, gpus: GpuView | None = None) -> None:
        self.config = config
        self.root = config.state_dir
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # the token, SLAs and logs are the operator's business
        self.layout = Layout(self.root)
        lock_dir = config.lease_dir or default_lock_dir()
        try:
            host_locks = HostLocks(lock_dir, owner=str(self.root))
        except OSError as exc:
            raise ConfigError(f"lease_dir {lock_dir}: cannot use it: {exc}") from None
        self._lock = _take_lock(self.root)
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
        # SLA -> (its text, its target): the devices dispatch leases, parsed once per text
        self.targets: dict[str, tuple[str, tuple[str, list[str]]]] = {}
        self.stopping = False
        self.wake = asyncio.Event()
        self.url = ""
        self.parses = ParseSlots(PARSE_SLOTS, MAX_WAITING_PARSES)  # the API's and the spool's
        self.disk = DiskGuard(self.root, self.store, self.alert, self.wake)
        self.deliverer: alerts.Deliverer | None = None  # while run_loops runs
        self.bad_schedules: dict[str, str] = {}  # SLA -> schedule already reported broken
        self._loop_error = ""  # the last error a step of the loop survived (logged once)
        for sub in ("logs", "slas", "studies", "runs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        if self.leases.host is not None:
            self.leases.host.close()
        self.store.close()
        self._lock.close()

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
            if not self.disk.note(exc, "writing daemon.json"):
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
        sub = prepare(self.config, text, source=source, base_dir=base_dir, schedule=schedule)
        return self.register(sub, priority=priority)

    def register(self, sub: Submission, *, priority: int = 0) -> dict[str, Any]:
        """Register a prepared submission and queue its first tune (on the event loop)."""
        check_priority(priority)
        self.disk.refuse_if_full()
        try:
            return self._register(sub, priority)
        except Exception as exc:
            if self.disk.note(exc, f"registering {sub.sla.name}"):
                raise SubmitError(507, [self.disk.message()]) from None
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
        self.targets[sla.name] = (text, (sla.target.kind, list(sla.target.devices)))
        job_id = self.enqueue_tune(sla.name, engine, priority=priority)
        logger.info("submitted %s (engine %s): job %d", sla.name, engine, job_id)
        return {"sla": sla.name, "job": job_id, "engine": engine, "created": True}

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
            # Sent from memory meanwhile, stored once there is space (DiskGuard.probe).
            alerts.memory_alert(self.disk.held, kind, sla, severity, summary, details)
            self.disk.note(exc, "recording an alert")
        self.wake.set()

    def list_alerts(self, limit: int = 100) -> list[dict[str, Any]]:
        """Newest first: alerts held in memory (the disk is full) before the stored ones."""
        held = sorted(self.disk.held.values(), key=lambda a: a["id"])[:limit]
        return held + self.store.alerts(limit=limit - len(held)) if limit > len(held) else held

    def collector(self) -> StoreCollector:
        """The Prometheus collector of this daemon's state (read at scrape time)."""
        return StoreCollector(
            self.store, self.leases.snapshot, self.started, lambda: self.disk.full is not None
        )

    def status(self) -> dict[str, Any]:
        return status.status(self)  # the API, the pages and the CLI read it from here

    # ------------------------------------------------------------------ the job loop
    async def dispatch(self) -> None:
        """Start every queued job whose devices are free (highest priority first)."""
        if self.stopping:
            return
        self.waiting.clear()
        ours = our_pids() if self.leases.gpus is not None else set()
        for job in self.store.queued(time.time()):
            if self.disk.full is not None:
                break
            try:
                await workers.start_queued(self, job, ours)
            except Exception as exc:  # this job's bookkeeping failed: the job, not the loop
                if not self.disk.note(exc, f"starting job {job.id}"):
                    logger.exception("job %d: could not be started", job.id)
                    workers.fail(self, job, f"could not be started: internal error: {exc!r}")
        if self.disk.full is not None:  # a job's log, study and outcome need the disk
            for job in self.store.queued(time.time()):
                self.waiting[job.id] = self.disk.message()

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
                unstored=self.disk.held,
            )
            try:
                while not self.stopping:
                    now = time.monotonic()
                    if self.disk.full is not None and now - last_probe >= DISK_PROBE_S:
                        last_probe = now
                        self._survive("probing the disk", self.disk.probe)
                    if now - last_engines >= self.config.engine_poll_s:
                        last_engines = now
                        await self._scan_engines_safely()
                    idle = self._spool_scan is None or self._spool_scan.done()
                    room = self.disk.full is None  # a full disk: files wait in the spool
                    if now - last_spool >= self.config.spool_poll_s and idle and room:
                        last_spool = now  # a task: its parses never hold up dispatch or alerts
                        self._spool_scan = asyncio.create_task(self._scan_spool_safely())
                    if now - last_sched >= 15.0 and room:
                        last_sched = now
                        self._survive(
                            "planning re-checks", lambda: schedules.tick(self, time.time())
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
        if self.disk.note(exc, what):
            return
        seen = f"{what}: {exc!r}"
        if seen != self._loop_error:
            self._loop_error = seen
            logger.error("%s failed (the daemon goes on): %r", what, exc, exc_info=exc)

    async def _scan_spool_safely(self) -> list[tuple[str, bool]]:
        try:
            return await spool.scan_spool_async(self)
        except Exception as exc:  # e.g. an unreadable spool folder: try again next time
            logger.warning("spool scan failed: %r", exc)
            return []

    async def _scan_engines_safely(self) -> None:
        try:
            probed = await asyncio.to_thread(watch.probe_engines)
            watch.scan_engines(self, probed)
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
        await workers.stop_all(self)


def _take_lock(root: Path) -> IO[str]:
    """One daemon per state directory (two would run every job twice)."""
    f = (root / "daemon.lock").open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise AlreadyRunning(f"another daemon is running on {root}") from None
    return f


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False
