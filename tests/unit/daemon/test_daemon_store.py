"""The daemon store's schema version and migrations, and its duplicate-name path."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from autotuner.core.errors import BadInput
from autotuner.daemon import store as store_mod
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.errors import StoreSchemaError
from autotuner.daemon.service import Daemon
from autotuner.daemon.store import MIGRATIONS, SCHEMA_VERSION, Store


def _user_version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def _tables(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        return {str(r[0]) for r in rows if not str(r[0]).startswith("sqlite_")}
    finally:
        db.close()


def _legacy_db(path: Path) -> None:
    """A database as the daemon wrote it before versioning: the tables, user_version 0."""
    db = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        db.execute(statement)
    db.execute(
        "INSERT INTO slas(name, yaml, schedule, engine, submitted) "
        "VALUES ('old', 'name: old', '0 2 * * *', 'eng-a', 1.0)"
    )
    db.execute("INSERT INTO jobs(kind, sla, engine, created) VALUES ('tune', 'old', 'eng-a', 1.0)")
    db.commit()
    db.close()


def test_a_fresh_database_is_created_at_the_newest_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "d.db"
    with caplog.at_level(logging.INFO, logger="autotuner.daemon.store"):
        s = Store(path)
    assert caplog.messages == [f"{path}: created (schema version {SCHEMA_VERSION})"]
    assert s.version() == SCHEMA_VERSION >= 1
    s.close()
    assert _user_version(path) == SCHEMA_VERSION
    assert _tables(path) == {"slas", "jobs", "alerts", "engines", "verdicts"}


def test_a_database_from_before_versioning_is_stamped_and_keeps_its_rows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "d.db"
    _legacy_db(path)
    assert _user_version(path) == 0
    with caplog.at_level(logging.INFO, logger="autotuner.daemon.store"):
        s = Store(path)
    assert caplog.messages == [f"{path}: schema version 0 -> {SCHEMA_VERSION}"]
    assert s.version() == SCHEMA_VERSION
    row = s.get_sla("old")
    assert row is not None and row.engine == "eng-a"
    assert [(j.kind, j.sla, j.state) for j in s.jobs()] == [("tune", "old", "queued")]
    s.close()
    assert _user_version(path) == SCHEMA_VERSION
    Store(path).close()  # opening it again changes nothing
    assert _user_version(path) == SCHEMA_VERSION


def test_a_database_of_a_newer_autotuner_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreSchemaError, match=r"schema version \d+, newer than") as err:
        Store(path)
    assert isinstance(err.value, BadInput) and err.value.exit_code == 2
    assert _user_version(path) == SCHEMA_VERSION + 1


def test_a_foreign_database_at_version_0_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, something_else TEXT)")
    db.commit()
    db.close()
    with pytest.raises(StoreSchemaError, match=r"not a daemon database.*jobs"):
        Store(path)
    assert _user_version(path) == 0 and _tables(path) == {"jobs"}


def test_migrations_run_in_order_and_a_failing_one_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "d.db"
    Store(path).close()  # version 1
    v2 = ("ALTER TABLE jobs ADD COLUMN note TEXT",)
    v3 = ("UPDATE jobs SET note = 'from v3'", "ALTER TABLE slas ADD COLUMN owner TEXT")
    monkeypatch.setattr(store_mod, "MIGRATIONS", (*MIGRATIONS, v2, ("SELECT nonsense(",)))
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", SCHEMA_VERSION + 2)
    with pytest.raises(sqlite3.OperationalError):
        Store(path)
    db = sqlite3.connect(path)
    columns = [r[1] for r in db.execute("PRAGMA table_info(jobs)")]
    db.close()
    assert "note" not in columns and _user_version(path) == SCHEMA_VERSION  # rolled back

    monkeypatch.setattr(store_mod, "MIGRATIONS", (*MIGRATIONS, v2, v3))
    s = Store(path)  # v3 needs v2's column: it only works in order
    assert s.version() == SCHEMA_VERSION + 2
    s.close()


def test_a_duplicate_sla_name_is_reported_not_raised(tmp_path: Path) -> None:
    s = Store(tmp_path / "d.db")
    assert s.add_sla("a", "name: a", "0 2 * * *", "eng-a") is True
    assert s.add_sla("a", "name: a, other", "0 3 * * *", "eng-b") is False
    row = s.get_sla("a")
    assert row is not None and (row.schedule, row.engine) == ("0 2 * * *", "eng-a")
    with pytest.raises(sqlite3.IntegrityError):  # other constraint failures still raise
        s._db.execute("INSERT INTO jobs(kind, sla, engine, created) VALUES (NULL, 'a', 'e', 0)")
    s.close()


def test_the_daemon_refuses_a_newer_database_and_frees_its_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    Daemon(DaemonConfig(state_dir=state)).close()
    db = sqlite3.connect(state / "daemon.db")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    db.close()
    for _ in range(2):  # the second try meets the same error, not "already running"
        with pytest.raises(StoreSchemaError):
            Daemon(DaemonConfig(state_dir=state))
