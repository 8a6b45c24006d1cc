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

Each trial records its owner (:class:`~autotuner.records.owner.ProcessOwner`); the start-up
sweep fails a RUNNING trial only when its owner is gone (:func:`owner_state`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
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
    study_dir.mkdir(parents=True, exist_ok=True)
    me = current_owner()
    with contextlib.ExitStack() as held:
        held.enter_context(_hold(study_dir / LOCK_NAME, name, me))
        if storage is not None:
            held.enter_context(_hold(storage_lock_path(storage, name), name, me))
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
