"""Opening a study's storage: a damaged SQLite file is refused with what to do, and two
processes creating the same fresh storage at once both get the study.

Optuna creates its tables and schema version on first use; two processes doing that at once
on one new database (two tuners, or a tuner and `report`) collide: one gets an
``IntegrityError`` (the schema version row) or ``OperationalError: table ... already exists``.
Once the other has finished, loading works, so the loser retries.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import optuna
import sqlalchemy.exc

from autotuner.core.errors import BadInput
from autotuner.core.sqlite_check import damage

SQLITE = "sqlite:///"
# What a collision of two first uses says (the last one: the other holds the write lock).
_RACE = ("already exists", "UNIQUE constraint failed", "database is locked")
ATTEMPTS = 8


class StudyDamaged(BadInput):
    """The study's database file is damaged (truncated, overwritten)."""


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (None for another database or an in-memory one)."""
    if not url.startswith(SQLITE):
        return None
    path = url[len(SQLITE) :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def check_sqlite(url: str) -> None:
    """Refuse a damaged SQLite study database with :class:`StudyDamaged`."""
    path = sqlite_path(url)
    why = damage(path) if path is not None else None
    if why is not None:
        raise StudyDamaged(
            f"the study database {path} is damaged ({why}); move it aside to start the study "
            "afresh, or restore it from a backup"
        )


def create_or_load(
    name: str,
    url: str,
    sampler: optuna.samplers.BaseSampler,
    directions: Sequence[Literal["minimize", "maximize"]],
) -> optuna.Study:
    """``optuna.create_study(..., load_if_exists=True)``, after :func:`check_sqlite`, retried
    when another process is creating the same storage at the same moment."""
    check_sqlite(url)
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
            if attempt == ATTEMPTS or not any(s in str(exc) for s in _RACE):
                raise
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")
