"""A full disk under the daemon's state directory: recognised by the error a write raised.

SQLite says ``database or disk is full`` (SQLITE_FULL); a file write raises ``OSError`` with
ENOSPC (or EDQUOT, a quota). Neither is a bug: the daemon keeps running, refuses new work
(HTTP 507) and says so, and tries again once a probe write succeeds (see ``diskguard``).
"""

from __future__ import annotations

import errno
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

PROBE_NAME = ".disk-probe"
PROBE_BYTES = 64 * 1024  # room for a job's first log lines and a few rows, not one page
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


@dataclass(frozen=True)
class DiskFull:
    """Since when writes fail for lack of space, and the first failure."""

    why: str
    since: float


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) says the disk is full."""
    seen: BaseException | None = exc
    for _ in range(8):  # causes and contexts: an error re-raised as another
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in _FULL_ERRNOS:
            return True
        if isinstance(seen, sqlite3.Error) and (
            getattr(seen, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
            or "database or disk is full" in str(seen)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def describe(exc: BaseException) -> str:
    """The error in a few words, for the log, the alert and the HTTP answer."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f": {exc.filename}" if exc.filename else "")
    return str(exc) or type(exc).__name__


def probe(root: Path) -> None:
    """Write and sync ``PROBE_BYTES`` under ``root``, then remove them; raises ``OSError``
    (ENOSPC while the disk is still full)."""
    path = root / PROBE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
