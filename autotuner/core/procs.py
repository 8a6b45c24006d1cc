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


def start_guard(pgid: int) -> subprocess.Popen[bytes]:
    """Start :mod:`autotuner.core.guard` to reap group ``pgid`` if this process dies first."""
    me = psutil.Process()
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotuner.core.guard",
            str(me.pid),
            repr(me.create_time()),
            str(pgid),
        ],
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
