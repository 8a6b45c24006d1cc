"""The engine-neutral half of an engine process: start, wait for health, reap.

:class:`ServerProcess` implements :class:`~autotuner.engines.base.EngineProcess` for any
HTTP server started from an argv list: its own session (process group), a guard process
that reaps the group if the tuner dies, a parent-death signal, the log captured to a file,
``GET /health`` polled until 200. A subclass supplies :meth:`ServerProcess.argv`,
:meth:`ServerProcess.child_env` and :meth:`ServerProcess.classify_failure`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import aiohttp
import psutil

from autotuner.core import procs
from autotuner.core.text import log_text
from autotuner.engines.base import Endpoint, EngineLaunchError, EngineProcess, LaunchCause

HEALTH_POLL_S = 0.5
# How often a start still under way is reported: a start takes up to minutes (97 s measured on
# a CPU target) and nothing else is printed meanwhile.
START_PROGRESS_S = 15.0


async def launch_saying(
    engine: EngineProcess,
    say: Callable[[str], None],
    *,
    indent: str = "",
    every_s: float = START_PROGRESS_S,
) -> Endpoint:
    """``engine.launch()``, saying ``engine starting, 30 s ...`` every ``every_s`` seconds
    until the engine is healthy or its start failed."""
    started = time.monotonic()

    async def report() -> None:
        while True:
            await asyncio.sleep(every_s)
            say(f"{indent}engine starting, {time.monotonic() - started:.0f} s ...")

    reporter = asyncio.create_task(report())
    try:
        return await engine.launch()
    finally:
        reporter.cancel()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A launch whose port another process took first (between picking it and binding it) is
# launched again on a new port, at most this many times in all.
PORT_ATTEMPTS = 3
# What the OS says when the port is taken (EADDRINUSE), in any server's traceback.
_PORT_TAKEN = "Address already in use"


class _PortTaken(Exception):
    """Another process holds the port the engine was told to bind."""


# How much of the end of a failed engine's log is searched for the root cause: enough for the
# tracebacks of every process that printed one.
ROOT_CAUSE_WINDOW_BYTES = 1024 * 1024


def tail(path: Path, lines: int = 40, *, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of a text file, read from its last ``max_bytes`` (empty when
    it does not exist). An engine's log is printed on terminals and stored in records: its
    colour sequences are dropped and other control characters escaped (core.text)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = data.replace("\r\n", "\n").rstrip("\n").split("\n")[-lines:]
    return "\n".join(log_text(line) for line in kept)


def _in_child(cpus: tuple[int, ...] | None) -> None:
    """Run in the server's process before it starts: the parent-death signal, and its CPU
    cores (inherited by every process it starts; where they cannot be set, the engine runs on
    the tuner's, and the log says which it got)."""
    procs.set_parent_death_signal()
    if cpus is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)


class ServerProcess:
    """One server process on a free loopback port; see the module docstring."""

    kind = ""
    health_path = "/health"

    def __init__(
        self,
        *,
        served_name: str,
        cuda_devices: list[str] | None,
        log_path: Path,
        startup_timeout_s: float,
        cpus: Sequence[int] | None = None,
    ) -> None:
        self.served_name = served_name
        self.cuda_devices = cuda_devices
        self.cpus = None if cpus is None else tuple(cpus)
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self._log_from = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._tree: list[psutil.Process] = []
        self._guard: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        """The command line; must bind 127.0.0.1 on :attr:`port`."""
        raise NotImplementedError

    def child_env(self) -> dict[str, str]:
        """The server's whole environment."""
        raise NotImplementedError

    def classify_failure(self, log_tail: str) -> LaunchCause:
        """Why the server exited during start-up, from its log."""
        return LaunchCause.OTHER

    def root_cause(self, log: str) -> list[str]:
        """The lines of its log that say why the server failed (empty: none found)."""
        return []

    def _launch_error(self, code: int | None) -> EngineLaunchError:
        """What went wrong, from the log: the cause, its root-cause lines and the tail."""
        log = tail(self.log_path, 1_000_000, max_bytes=ROOT_CAUSE_WINDOW_BYTES)
        log_tail = "\n".join(log.splitlines()[-40:])
        root = self.root_cause(log)
        if code is None:
            cause = LaunchCause.TIMEOUT
            message = f"not healthy after {self.startup_timeout_s:.0f} s"
        else:
            cause = self.classify_failure("\n".join([*root, log_tail]))
            message = f"exited with status {code} during start-up"
        if root:
            message += f": {root[0]}"
        return EngineLaunchError(cause, message, log_tail, code, root_cause=root)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def launch(self) -> Endpoint:
        if self._proc is not None:
            raise RuntimeError("engine already launched")
        started = time.monotonic()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if attempt > 1:
                taken, self.port = self.port, free_port()
                self._note(f"port {taken} was taken by another process; launching on {self.port}")
            try:
                return await self._launch_once(started)
            except _PortTaken:  # that attempt's processes are already stopped
                self._proc, self._guard, self._tree = None, None, []
        raise EngineLaunchError(
            LaunchCause.OTHER,
            f"another process took the engine's port {PORT_ATTEMPTS} times in a row",
            tail(self.log_path),
            None,
        )

    def _note_cores(self, pid: int) -> None:
        """Say in the log which cores the server got (it may have exited already)."""
        try:
            got = sorted(os.sched_getaffinity(pid))
        except OSError:
            return
        cores = ",".join(map(str, got))
        asked = "" if self.cpus is None or tuple(got) == self.cpus else f" (asked for {self.cpus})"
        self._note(f"the engine runs on CPU cores {cores}{asked}")

    def _note(self, line: str) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"# autotuner: {line}\n".encode())

    async def _launch_once(self, started: float) -> Endpoint:
        argv = self.argv()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_from = log.tell()  # where this attempt's output starts
            log.write(f"# autotuner launch: {json.dumps(argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.child_env(),
                start_new_session=True,
                preexec_fn=partial(_in_child, self.cpus),
            )
        if self.cpus is not None:
            self._note_cores(self._proc.pid)
        self._guard = procs.start_guard(self._proc.pid, self.log_path)
        base_url = f"http://127.0.0.1:{self.port}"
        try:
            await self._wait_healthy(base_url, started)
        except BaseException:
            await self.stop()
            raise
        return Endpoint(
            base_url=base_url,
            model=self.served_name,
            pid=self._proc.pid,
            argv=tuple(argv),
            log_path=self.log_path,
            startup_s=time.monotonic() - started,
        )

    async def _wait_healthy(self, base_url: str, started: float) -> None:
        assert self._proc is not None
        deadline = started + self.startup_timeout_s
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                self._remember_tree()
                code = self._proc.poll()
                if code is not None:
                    if self._port_taken_in_log():
                        raise _PortTaken
                    raise self._launch_error(code)
                if time.monotonic() > deadline:
                    raise self._launch_error(None)
                try:
                    async with session.get(base_url + self.health_path) as resp:
                        healthy = resp.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    healthy = False
                if healthy:
                    owner = self._port_owner()
                    if owner is None:
                        return
                    # Another server answered on our port (it took the port first): ours
                    # cannot bind it, and its answers would be measured as ours.
                    self._note(f"port {self.port} answered by another process (pid {owner})")
                    raise _PortTaken
                await asyncio.sleep(HEALTH_POLL_S)

    def _port_taken_in_log(self) -> bool:
        """Whether this attempt's own output (not an earlier attempt's) says the port was
        taken."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_from)
                return _PORT_TAKEN.encode() in f.read()
        except OSError:
            return False

    def _port_owner(self) -> int | None:
        """None when the process listening on :attr:`port` is ours (or cannot be told), else
        the PID of the other process that listens there."""
        assert self._proc is not None
        ours = {p.pid for p in procs.tree(self._proc.pid)}
        try:
            listening = [
                c
                for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr[1] == self.port
            ]
        except psutil.Error:
            return None  # not allowed to look: trust the answer, as before
        pids = {c.pid for c in listening}
        if not listening or None in pids or pids & ours:
            return None
        return min(p for p in pids if p is not None)

    def _remember_tree(self) -> None:
        """Track descendants while alive, so children that leave the group are reaped too."""
        if self._proc is not None:
            known = {p.pid for p in self._tree}
            self._tree += [p for p in procs.tree(self._proc.pid) if p.pid not in known]

    def processes(self) -> list[psutil.Process]:
        """The engine's live process tree (for memory sampling)."""
        if self._proc is None:
            return []
        self._remember_tree()
        return procs.tree(self._proc.pid)

    def kill_now(self) -> None:
        """Synchronous reap, for signal handlers and ``atexit``."""
        if self._proc is None:
            return
        self._remember_tree()
        procs.kill_group(self._proc.pid, self._tree)
        self._proc.wait(timeout=10)
        if self._guard is not None:
            self._guard.terminate()
            self._guard.wait(timeout=10)

    async def stop(self) -> None:
        if self._proc is None:
            return
        await asyncio.to_thread(self.kill_now)

    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()
