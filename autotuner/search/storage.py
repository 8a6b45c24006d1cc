"""Opening a study's storage: a damaged SQLite file is refused with what to do, and two
processes creating the same fresh storage at once both get the study.

Optuna creates its tables and schema version on first use; two processes doing that at once
on one new database (two tuners, or a tuner and `report`) collide: one gets an
``IntegrityError`` (the schema version row) or ``OperationalError: table ... already exists``.
Once the other has finished, loading works, so the loser retries.

What is refused before Optuna touches the file (exit 2, with what to do): a damaged file; an
empty one beside the files of the study it held (Optuna would start the study over and
overwrite its trials and bundle); a SQLite file of another program (Optuna would add its
tables to it); a directory or anything else that is not a file; a file or folder this user
can't write to (immutable, read-only).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import optuna
import sqlalchemy.engine
import sqlalchemy.exc

from autotuner.core.errors import BadInput
from autotuner.core.sqlite_check import damage, tables
from autotuner.search.lock import LOCK_NAME

SQLITE = "sqlite:///"
# What a collision of two first uses says (the last one: the other holds the write lock).
_RACE = ("already exists", "UNIQUE constraint failed", "database is locked")
ATTEMPTS = 8
# A table every Optuna storage has: a file with tables but not this one is another program's.
OPTUNA_TABLE = "version_info"
# Files in a study's folder that a fresh study has too: anything else was left by a study.
_FRESH = ("-journal", "-wal", "-shm")


class StudyDamaged(BadInput):
    """The study's database file is damaged (truncated, overwritten)."""


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (None for another database or an in-memory one)."""
    if not url.startswith(SQLITE):
        return None
    path = url[len(SQLITE) :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


class StudyStorageRefused(BadInput):
    """The study's storage is not a database Optuna may use: another program's SQLite file,
    a directory, or a file this user can't write to."""


def check_sqlite(url: str, *, study_dir: Path | None = None, write: bool = False) -> None:
    """Refuse a SQLite study database that can't be used as it is: :class:`StudyDamaged` for
    a damaged file, or an empty one beside the files of a study (``study_dir``, default the
    database's folder); :class:`StudyStorageRefused` for a directory, another program's
    database, or (``write``) one this user can't write to."""
    path = sqlite_path(url)
    if path is None:
        return
    try:
        st = path.stat()
    except FileNotFoundError:
        return  # a new study
    except OSError as exc:
        raise StudyStorageRefused(
            f"the study database {path} can't be read: {exc.strerror or exc}"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise StudyStorageRefused(
            f"the study database {path} is {what}, not a SQLite file; move it aside, or point "
            "tune.storage at a file"
        )
    if st.st_size == 0:
        left = _study_files(study_dir or path.parent, path)
        if left:
            raise StudyDamaged(
                f"the study database {path} is empty (0 bytes) while {study_dir or path.parent} "
                f"holds the files of the study it recorded ({', '.join(left)}); a new study "
                "would overwrite them: restore the database from a backup, or move the folder "
                "aside to start the study afresh"
            )
    else:
        why = damage(path)
        if why is not None:
            raise StudyDamaged(
                f"the study database {path} is damaged ({why}); move it aside to start the "
                "study afresh, or restore it from a backup"
            )
        found = tables(path)
        if found and OPTUNA_TABLE not in found:
            shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
            raise StudyStorageRefused(
                f"the study database {path} is not an Optuna storage (it holds the tables "
                f"{shown}): it belongs to another program and is left as it is; point "
                "tune.storage at another file"
            )
    if write:
        _check_writable(path)


def _study_files(folder: Path, db: Path) -> list[str]:
    """What in ``folder`` a study left there (trials, bundle, SLA copy), a few names."""
    fresh = {db.name, *(db.name + s for s in _FRESH), LOCK_NAME}
    try:
        names = sorted(n for n in os.listdir(folder) if n not in fresh and not n.startswith("."))
    except OSError:
        return []
    return names[:3] + (["..."] if len(names) > 3 else [])


def _check_writable(path: Path) -> None:
    """SQLite writes the file and a journal beside it; refuse now what would fail later."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = -1
    except OSError as exc:
        raise StudyStorageRefused(
            f"the study database {path} can't be written ({exc.strerror or exc}; immutable or "
            "read-only?): make it writable, or copy the study folder and tune the copy"
        ) from None
    if fd >= 0:
        os.close(fd)
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise StudyStorageRefused(
            f"the folder {path.parent} of the study database can't be written (SQLite keeps "
            "its journal there): make it writable"
        )


def create_or_load(
    name: str,
    url: str,
    sampler: optuna.samplers.BaseSampler,
    directions: Sequence[Literal["minimize", "maximize"]],
    *,
    study_dir: Path | None = None,
) -> optuna.Study:
    """``optuna.create_study(..., load_if_exists=True)``, after :func:`check_sqlite`, retried
    when another process is creating the same storage at the same moment."""
    check_sqlite(url, study_dir=study_dir, write=True)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return optuna.create_study(
                study_name=name,
                storage=url,
                sampler=sampler,
                directions=list(directions),
                load_if_exists=True,
            )
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as exc:
            if attempt < ATTEMPTS and any(s in str(exc) for s in _RACE):
                time.sleep(0.05 * attempt)
                continue
            if isinstance(exc, sqlalchemy.exc.OperationalError):  # can't open, can't write
                where = sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
                raise StudyStorageRefused(
                    f"the study storage {where} can't be used: {exc.orig or exc}"
                ) from None
            raise
    raise AssertionError("unreachable")
