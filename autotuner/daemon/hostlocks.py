"""Host-wide device locks: one lock file per device in a directory every daemon shares.

Two daemons with different state directories on one host must not both lease the CPU or a
GPU: each takes ``flock(LOCK_EX | LOCK_NB)`` on ``<dir>/<device>.lock`` while a job holds
the device. A daemon that dies (even by kill -9) releases its locks with its file
descriptors, so a stale file never blocks anyone. The holder writes its pid and state
directory into the file, for the "waiting for" line of the other daemon's status.

The directory is ``lease_dir`` from the daemon's config, else ``$AUTOTUNER_LEASE_DIR``, else
``/run/lock/autotuner`` (shared by every user; created mode 1777 like /run/lock), else
``$XDG_RUNTIME_DIR/autotuner-leases`` (this user's daemons only).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
from pathlib import Path

from autotuner.core.errors import AutotunerError
from autotuner.core.text import printable

LEASE_DIR_VAR = "AUTOTUNER_LEASE_DIR"
SYSTEM_DIR = Path("/run/lock/autotuner")
_DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # whole names: fullmatch


class DeviceBusy(AutotunerError):
    """Another daemon on this host holds the device: the job waits, it does not fail."""


def default_lock_dir() -> Path:
    env = os.environ.get(LEASE_DIR_VAR)
    if env:
        return Path(env).expanduser().resolve()
    usable = (
        os.access(SYSTEM_DIR, os.W_OK | os.X_OK)
        if SYSTEM_DIR.exists()
        else os.access(SYSTEM_DIR.parent, os.W_OK | os.X_OK)
    )
    if usable:
        return SYSTEM_DIR
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "autotuner-leases"
    return Path.home() / ".cache" / "autotuner" / "leases"


class HostLocks:
    """The lock files of one daemon. Not thread-safe: the daemon's event loop uses it."""

    def __init__(self, directory: Path, owner: str = "") -> None:
        self.dir = directory
        self.owner = owner  # written into the files we hold (e.g. our state directory)
        self._held: dict[str, int] = {}  # device -> open fd holding its lock
        self.dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # shared by every user, like /run/lock itself
            if self.dir.stat().st_uid == os.getuid():
                os.chmod(self.dir, 0o1777)
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise PermissionError(f"{self.dir} is not writable by this user")

    def _path(self, device: str) -> Path:
        if not _DEVICE.fullmatch(device):
            raise ValueError(f"not a device name: {device!r}")
        return self.dir / f"{device}.lock"

    def _open(self, device: str) -> int:
        # O_NOFOLLOW: in a directory everyone writes to, a planted link must not make us
        # create or truncate a file elsewhere.
        path = self._path(device)
        flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, os.O_RDWR | flags, 0o666)
        except PermissionError:  # another user's file: a read-only fd can hold flock too
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise OSError(f"{path} is not a regular file")
        if st.st_uid == os.getuid():
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o666)  # other users' daemons must open it too
        return fd

    def holds(self, device: str) -> bool:
        return device in self._held

    def take(self, device: str) -> bool:
        """Lock ``device`` for this daemon; False if another process holds it. OSError when
        its lock file can't be opened (e.g. another user's, unreadable)."""
        if device in self._held:
            return True
        fd = self._open(device)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._held[device] = fd
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} {self.owner}\n".encode(), 0)
        return True

    def drop(self, device: str) -> None:
        fd = self._held.pop(device, None)
        if fd is not None:
            os.close(fd)  # closing releases the flock

    def free(self, device: str) -> bool:
        """Whether ``device`` could be locked now (ours counts as free)."""
        if device in self._held:
            return True
        if not self.take(device):
            return False
        self.drop(device)
        return True

    def holder(self, device: str) -> str:
        """What the holder wrote into the lock file ("pid N STATE_DIR"), or ''. Anyone may
        write to that file: it is read without following a link or waiting on a FIFO, at most
        300 bytes, and its control characters are escaped (it is shown in `status`)."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        with contextlib.suppress(OSError, ValueError):
            fd = os.open(self._path(device), flags)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return ""
                raw = os.read(fd, 300)
            finally:
                os.close(fd)
            return printable(raw.decode("utf-8", "replace").strip())
        return ""

    def close(self) -> None:
        for device in list(self._held):
            self.drop(device)
