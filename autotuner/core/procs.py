"""Process-group helpers: start children that cannot outlive us, and reap them completely."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import psutil

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this (child) process when its parent dies (``preexec_fn``).

    Covers the tuner being killed with -9: the engine's server process goes with it, and
    the rest of its process group is reaped by the next start-up check or by the server's
    own children noticing their parent is gone.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# Stamps above this are wall-clock start times (psutil's create_time()) of older records, or
# of a system without /proc; start stamps after boot stay far below it (31 years of uptime).
_EPOCH_STAMPS = 1e9
_EPOCH_SLACK_S = 1.0  # create_time() is rounded differently across reads
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc/self/stat").exists()


def start_stamp(pid: int) -> float | None:
    """When process ``pid`` started, as seconds after boot; None when there is no such process.

    From the kernel's start time in clock ticks, which never changes during the process's life.
    Not psutil's ``create_time()``: that adds the boot time as the wall clock gives it now, in
    whole seconds, so an adjustment of the clock moves it by a second or more while the process
    runs: a live tuner looks 'restarted', and its engines' guards kill them (the likely cause of
    CI's engines killed mid-start and mid-profile). Without ``/proc``: the wall-clock time.
    """
    if not _PROC:
        try:
            return psutil.Process(pid).create_time()
        except (psutil.Error, ValueError):  # ValueError: a pid below 1
            return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name, in parentheses, may hold spaces
    if fields[0] == "Z":
        return None  # a zombie has ended: only its exit status is left
    return int(fields[19]) / _TICKS  # field 22 of stat(5); the list starts at field 3


def same_process(pid: int, stamp: float) -> bool:
    """Whether ``pid`` is still the live process whose :func:`start_stamp` was ``stamp`` (pids
    are reused). A wall-clock stamp of an older record is compared as it was, to the second.
    Both come from record files too: a pid that names no process (0, negative) is no process."""
    if pid <= 0:
        return False
    if stamp > _EPOCH_STAMPS:
        try:
            proc = psutil.Process(pid)
            return (
                abs(proc.create_time() - stamp) < _EPOCH_SLACK_S
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False
    return start_stamp(pid) == stamp


def own_start_stamp() -> float:
    """This process's :func:`start_stamp`."""
    stamp = start_stamp(os.getpid())
    if stamp is None:  # cannot happen for a live process; never record a stamp nothing matches
        raise RuntimeError("this process's start time cannot be read")
    return stamp


def start_guard(pgid: int, log: Path | None = None) -> subprocess.Popen[bytes]:
    """Start :mod:`autotuner.core.guard` to reap group ``pgid`` if this process dies first (and
    say so in ``log``, the engine's)."""
    me, stamp = os.getpid(), own_start_stamp()
    argv = [sys.executable, "-m", "autotuner.core.guard", str(me), repr(stamp), str(pgid)]
    return subprocess.Popen(
        [*argv, str(log)] if log is not None else argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and all its descendants that are still alive."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def group_members(pgid: int) -> list[psutil.Process]:
    """Live processes whose process group is ``pgid``."""
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
    return members


def kill_group(pgid: int, extra: list[psutil.Process], grace_s: float = 15.0) -> bool:
    """SIGTERM the group (and ``extra`` processes that left it), SIGKILL what remains.

    Returns True when nothing is left. Blocks for at most about ``grace_s`` + 5 seconds.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    for proc in extra:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _alive(pgid, extra):
            return True
        time.sleep(0.1)
    logger.info("process group %d still running %.0f s after SIGTERM: SIGKILL", pgid, grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    for proc in [*extra, *group_members(pgid)]:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if not _alive(pgid, extra):
            return True
        time.sleep(0.1)
    if not _alive(pgid, extra):
        return True
    left = sorted({p.pid for p in [*extra, *group_members(pgid)] if _running(p)})
    logger.warning("process group %d: processes %s still alive after SIGKILL", pgid, left)
    return False


def _alive(pgid: int, extra: list[psutil.Process]) -> bool:
    return bool(group_members(pgid)) or any(_running(p) for p in extra)


def _running(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False


def sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into the same path as Ctrl-C: engines are stopped in `finally` blocks.
    raise KeyboardInterrupt
