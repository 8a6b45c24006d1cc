"""One tuner per study, and whether the owner of a running trial is still alive.

``tune`` holds an exclusive ``flock`` on ``<study>/tune.lock`` for its whole life: a second
``tune`` of the same study stops at once with :class:`StudyBusy` (exit 2) naming the holder,
instead of launching engines beside it. The kernel drops the lock when the holder exits, even
on ``kill -9``, so a stale file never blocks anything; its content (who holds it) is only for
the message.

The study lives in its storage, not in the trial folder: with ``tune.storage`` set, two trial
folders may name one storage, so ``tune`` also holds a lock of the storage and study name
(:func:`storage_lock_path`: beside the SQLite file, found by its real path; for a server
database, one per URL in the autotuner home, which covers this host only).

A path does not name a file: a hard link or a bind mount gives one SQLite file two real paths
(two lock files). So ``tune`` also locks the database file itself (:func:`_hold_file`): an
open-file-description lock (``F_OFD_SETLK``) on one byte far past anything SQLite locks, at an
offset drawn from the study name, so two studies in one file still tune side by side. Such a
lock belongs to the open file, not the process: SQLite opening and closing the same file in
this process does not drop it, and the kernel drops it on exit like the ``flock``. A database
that does not exist yet is created (empty, what SQLite would make) so that it can be locked
before anything else can reach it under another name.

Each trial records its owner (:class:`~autotuner.records.owner.ProcessOwner`); the start-up
sweep fails a RUNNING trial only when its owner is gone (:func:`owner_state`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import stat
import struct
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from autotuner.core import paths, procs
from autotuner.core.errors import BadInput
from autotuner.records.base import RecordError
from autotuner.records.owner import ProcessOwner, StudyLockFile

LOCK_NAME = "tune.lock"

OwnerState = Literal["alive", "gone", "unknown"]


class StudyBusy(BadInput):
    """Another process is tuning this study."""


def current_owner() -> ProcessOwner:
    """This process, as an owner, from now."""
    return ProcessOwner(
        pid=os.getpid(),
        host=socket.gethostname(),
        started=procs.own_start_stamp(),
        since=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def owner_state(owner: ProcessOwner | None) -> OwnerState:
    """Whether ``owner`` still runs: ``unknown`` for another host (its processes can't be
    seen from here); ``gone`` for no owner at all (a trial of an older tuner: failed, as it
    always was)."""
    if owner is None:
        return "gone"
    if owner.host != socket.gethostname():
        return "unknown"
    return "alive" if procs.same_process(owner.pid, owner.started) else "gone"


@contextlib.contextmanager
def study_lock(study_dir: Path, name: str, storage: str | None = None) -> Iterator[ProcessOwner]:
    """Hold the study in ``study_dir`` for the block, and with ``storage`` (``tune.storage``)
    the study ``name`` in that storage too; :class:`StudyBusy` if another process holds
    either."""
    from autotuner.search.study import storage_url  # study imports storage, which imports this

    study_dir.mkdir(parents=True, exist_ok=True)
    me = current_owner()
    with contextlib.ExitStack() as held:
        held.enter_context(_hold(study_dir / LOCK_NAME, name, me))
        if storage is not None:
            held.enter_context(_hold(storage_lock_path(storage, name), name, me))
        db = _sqlite_file(storage_url(study_dir, storage))
        if db is not None:
            held.enter_context(_hold_file(db, name))
        yield me


def storage_lock_path(storage: str, name: str) -> Path:
    """The lock file of study ``name`` in the storage at URL ``storage``: beside a SQLite
    file (by its real path, so two spellings of one file meet), else in the home."""
    from autotuner.search.storage import sqlite_path  # storage imports this module

    db = sqlite_path(storage)
    if db is not None:
        real = Path(os.path.realpath(db.expanduser()))
        return real.parent / f".{real.name}.{name}.tune.lock"
    key = hashlib.sha256(f"{storage}\0{name}".encode()).hexdigest()[:32]
    return paths.home() / "locks" / f"storage-{key}.lock"


def _sqlite_file(url: str) -> Path | None:
    from autotuner.search.storage import sqlite_path

    db = sqlite_path(url)
    return None if db is None else db.expanduser()


# One byte per study name, at 2**62 and up: SQLite's own locks sit at 1 GiB (its pending byte
# and the shared range after it), and no database grows near this far.
_FILE_LOCK_BASE = 1 << 62


_OPEN = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC


def _file_lock_offset(name: str) -> int:
    return _FILE_LOCK_BASE + int.from_bytes(hashlib.sha256(name.encode()).digest()[:6], "big")


@contextlib.contextmanager
def _hold_file(db: Path, name: str) -> Iterator[None]:
    """Hold study ``name`` in the SQLite file ``db`` itself, whatever path reaches it.

    Nothing is held where the file is not a regular one or can't be opened for writing (the
    storage checks refuse it before anything is launched; the path locks still stand), nor
    where the system has no open-file-description locks (not Linux)."""
    fd = _open_regular(db)
    if fd is None:
        yield
        return
    try:
        _lock_byte(fd, _file_lock_offset(name), name, db)
        yield
    finally:
        os.close(fd)  # the only descriptor of this open file: closing it releases the lock


def _open_regular(db: Path) -> int | None:
    """``db`` opened for writing (created empty if missing, as SQLite would make it), or None
    for anything but a regular file: never open a device or a FIFO to lock it."""
    if not hasattr(fcntl, "F_OFD_SETLK"):
        return None
    try:
        if not stat.S_ISREG(db.stat().st_mode):
            return None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        fd = os.open(db, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
        os.close(fd)
        return None
    return fd


def _lock_byte(fd: int, offset: int, name: str, db: Path) -> None:
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0, as OFD locks require)
    want = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, want)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        raise StudyBusy(_busy_file(name, db)) from None


def _busy_file(name: str, db: Path) -> str:
    try:
        st = db.stat()
        which = f"device {st.st_dev}, inode {st.st_ino}"
    except OSError:
        which = "the same device and inode"
    return (
        f"study {name} is being tuned by another process through another path to its database "
        f"{db} (the same file, {which}: a hard link or a bind mount); wait for that tuner to "
        "end or stop it, then run this again (it resumes the study)"
    )


@contextlib.contextmanager
def _hold(path: Path, name: str, me: ProcessOwner) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StudyBusy(_busy(name, path)) from None
        f.seek(0)
        f.truncate()
        f.write(StudyLockFile(owner=me, command=" ".join(sys.argv)).to_json() + "\n")
        f.flush()
        yield
    finally:
        f.close()  # closing the file releases the lock


def _busy(name: str, path: Path) -> str:
    try:
        holder = StudyLockFile.read(path)
    except (OSError, RecordError):  # it has the lock but has not written its name yet
        who = "another process"
    else:
        who = holder.owner.describe()
    return (
        f"study {name} is being tuned by {who} (lock: {path}); wait for that tuner to end or "
        "stop it, then run this again (it resumes the study)"
    )
