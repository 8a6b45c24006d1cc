"""The daemon's persistent state in one SQLite file: SLAs, the job queue, alerts, engines seen.

Every change is one short transaction, so a kill -9 at any point leaves a consistent file:
a job is ``queued``, ``running`` (with the PID of its process) or finished. On start-up the
daemon turns ``running`` jobs whose process is gone back into ``queued`` (see
:meth:`Daemon.recover`), which is how nothing queued is ever lost.

The schema is versioned: ``PRAGMA user_version`` holds the number of migrations applied, and
opening a store applies the missing ones, in order, in one transaction. A database written by a
newer tuner (a higher version than :data:`SCHEMA_VERSION`) is refused rather than guessed at.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from autotuner.core.sqlite_check import damage
from autotuner.daemon.errors import StoreDamaged, StoreSchemaError
from autotuner.records.base import RecordError
from autotuner.records.promotion import Promotion

JobKind = Literal["tune", "recheck", "regression"]
JobState = Literal["queued", "running", "done", "failed", "cancelled"]
JOB_STATES: tuple[JobState, ...] = ("queued", "running", "done", "failed", "cancelled")
JOB_KINDS: tuple[JobKind, ...] = ("tune", "recheck", "regression")

logger = logging.getLogger(__name__)

# Version 1: the schema as the daemon first shipped it (databases from before versioning have
# exactly these tables at user_version 0; see Store._check_unversioned).
_V1 = (
    """
CREATE TABLE IF NOT EXISTS slas (
    name TEXT PRIMARY KEY,
    yaml TEXT NOT NULL,
    schedule TEXT NOT NULL,
    engine TEXT NOT NULL,          -- engine the current study runs on
    submitted REAL NOT NULL,
    next_check REAL,
    promotion TEXT,                -- JSON: the promotion in force
    fallback TEXT,                 -- JSON: the one before it
    summary TEXT                   -- JSON: trials by state, best goodput (after each job)
)
""",
    """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    sla TEXT NOT NULL,
    engine TEXT NOT NULL,
    args TEXT NOT NULL DEFAULT '{}',
    state TEXT NOT NULL DEFAULT 'queued',
    priority INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    not_before REAL NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    pid INTEGER,
    pid_start REAL,
    exit_code INTEGER,
    outcome TEXT,
    error TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0
)
""",
    "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, priority, id)",
    """
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    sla TEXT NOT NULL,
    severity TEXT NOT NULL,
    summary TEXT NOT NULL,
    details TEXT NOT NULL,         -- JSON
    delivered INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_try REAL NOT NULL DEFAULT 0,
    last_error TEXT
)
""",
    """
CREATE TABLE IF NOT EXISTS engines (
    name TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    distribution TEXT NOT NULL,
    device TEXT NOT NULL,
    seen REAL NOT NULL
)
""",
    """
CREATE TABLE IF NOT EXISTS verdicts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    sla TEXT NOT NULL,
    old_engine TEXT NOT NULL,
    new_engine TEXT NOT NULL,
    verdict TEXT NOT NULL,
    details TEXT NOT NULL
)
""",
)

# Ordered migrations: MIGRATIONS[i] takes a database from version i to i + 1. Append new ones
# at the end and never edit a shipped one: a database's user_version says which it has run.
MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1,)
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass(frozen=True)
class Job:
    id: int
    kind: str
    sla: str
    engine: str
    args: dict[str, Any]
    state: str
    priority: int
    attempts: int
    not_before: float
    created: float
    started: float | None
    finished: float | None
    pid: int | None
    pid_start: float | None
    exit_code: int | None
    outcome: dict[str, Any] | None
    error: str | None
    cancel_requested: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SlaRow:
    name: str
    yaml: str
    schedule: str
    engine: str
    submitted: float
    next_check: float | None
    promotion: Promotion | None  # the promotion in force
    fallback: Promotion | None  # the one a re-tune on another engine took over from
    summary: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON."""
        return {
            **self.__dict__,
            "promotion": None if self.promotion is None else self.promotion.to_json(),
            "fallback": None if self.fallback is None else self.fallback.to_json(),
        }


# The columns that hold JSON, per table (with the column that names a row): each value is a
# JSON object, or NULL where the schema allows it. A value that is not (an edited or damaged
# row) is bad input: refused when the store opens, a StoreDamaged when read later.
JSON_COLUMNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "slas": ("name", ("promotion", "fallback", "summary")),
    "jobs": ("id", ("args", "outcome")),
    "alerts": ("id", ("details",)),
    "verdicts": ("id", ("details",)),
}


class BadRow(StoreDamaged):
    """A row whose JSON column does not hold a JSON object."""


def _loads(text: Any, where: str) -> dict[str, Any] | None:
    """A JSON column's value (None for NULL); BadRow unless it is a JSON object."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise BadRow(f"daemon.db: {where}: not valid JSON ({why})") from None
    if not isinstance(value, dict):
        found = type(value).__name__
        raise BadRow(f"daemon.db: {where}: a JSON object was expected, found {found}")
    return value


def _promotion(text: Any, where: str) -> Promotion | None:
    """A promotion column's value (None for NULL); BadRow unless it is a promotion."""
    value = _loads(text, where)
    if value is None:
        return None
    try:
        return Promotion.from_json(value, f"daemon.db: {where}")
    except RecordError as exc:
        raise BadRow(str(exc)) from None


def _stored(value: Any) -> Any:
    """A promotion as its JSON object; a plain mapping is checked as one first."""
    if isinstance(value, Mapping):
        value = Promotion.from_json(value)
    return value.to_json() if isinstance(value, Promotion) else value


def _object(text: Any, where: str) -> dict[str, Any]:
    value = _loads(text, where)
    if value is None:
        raise BadRow(f"daemon.db: {where}: a JSON object was expected, found NULL")
    return value


# How each JSON column is read back (the others: a JSON object or NULL).
_READERS: dict[str, Callable[[Any, str], object]] = {
    "args": _object,
    "details": _object,
    "promotion": _promotion,
    "fallback": _promotion,
}


def _job(row: sqlite3.Row) -> Job:
    d = dict(row)
    d["args"] = _object(d["args"], f"jobs row {d['id']}, column args")
    d["outcome"] = _loads(d["outcome"], f"jobs row {d['id']}, column outcome")
    d["cancel_requested"] = bool(d["cancel_requested"])
    return Job(**d)


def _sla(row: sqlite3.Row) -> SlaRow:
    d = dict(row)
    for k in ("promotion", "fallback"):
        d[k] = _promotion(d[k], f"slas row {d['name']!r}, column {k}")
    d["summary"] = _loads(d["summary"], f"slas row {d['name']!r}, column summary")
    return SlaRow(**d)


def _details(row: sqlite3.Row, table: str) -> dict[str, Any]:
    return {
        **dict(row),
        "details": _object(row["details"], f"{table} row {row['id']}, column details"),
    }


def _columns(db: sqlite3.Connection) -> dict[str, list[str]]:
    """Column names of every table of the database (SQLite's own tables left out)."""
    names = db.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return {
        str(n[0]): [str(c[1]) for c in db.execute("SELECT * FROM pragma_table_info(?)", (n[0],))]
        for n in names
    }


def _columns_of(statements: tuple[str, ...]) -> dict[str, list[str]]:
    """The tables a migration creates, as :func:`_columns` would read them back."""
    scratch = sqlite3.connect(":memory:")
    try:
        for statement in statements:
            scratch.execute(statement)
        return _columns(scratch)
    finally:
        scratch.close()


class Store:
    """All reads and writes of the daemon's database. Not thread-safe: one per thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        why = damage(path)  # PRAGMA quick_check, before anything reads or writes it
        if why is not None:
            raise self._damaged(why)
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        try:
            self._refuse_newer(self.version())  # before anything writes to a file not ours
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a queued job survives a power cut too
            self._migrate()
            self._check_rows()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            if isinstance(exc, sqlite3.OperationalError):  # locked, read-only: not damage
                raise
            raise self._damaged(str(exc)) from exc
        except BaseException:
            self._db.close()
            raise

    def _check_rows(self) -> None:
        """Every JSON column holds what the daemon wrote there (a JSON object), or the store is
        refused now, naming the rows, rather than failing later in the middle of its work."""
        bad: list[str] = []
        for table, (key, columns) in JSON_COLUMNS.items():
            rows = self._db.execute(f"SELECT {key}, {', '.join(columns)} FROM {table}")
            for row in rows:
                for column in columns:
                    where = f"{table} row {row[key]!r}, column {column}"
                    read = _READERS.get(column, _loads)
                    try:
                        read(row[column], where)
                    except BadRow as exc:
                        bad.append(str(exc).removeprefix("daemon.db: "))
        if bad:
            more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
            raise BadRow(
                f"the daemon database {self.path} has rows it can't use: {'; '.join(bad[:3])}"
                f"{more}. Restore the file from a backup, or correct or delete those rows "
                "(the daemon will not start on it)"
            )

    def _damaged(self, why: str) -> StoreDamaged:
        return StoreDamaged(
            f"the daemon database {self.path} is damaged ({why}); restore it from a backup, or "
            f"move the state directory {self.path.parent} aside to start afresh (the daemon "
            "will not start on it: it would lose the SLAs, jobs and promotions it records)"
        )

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------------ schema
    def version(self) -> int:
        """The schema version of the file (``PRAGMA user_version``)."""
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"{self.path}: the daemon database has schema version {version}, newer than "
                f"this autotuner knows ({SCHEMA_VERSION}); run the newer autotuner, or point "
                "the daemon at another state directory"
            )

    def _migrate(self) -> None:
        """Apply the missing migrations in order, all in one transaction with the new version
        (the version is read again inside it: another process may have migrated meanwhile)."""
        with self._txn() as db:
            version = self.version()
            self._refuse_newer(version)
            fresh = version == 0 and self._check_unversioned(db)
            for number in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[number - 1]:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {number}")  # an int: nothing to quote
        if fresh:
            logger.info("%s: created (schema version %d)", self.path, SCHEMA_VERSION)
        elif version < SCHEMA_VERSION:
            logger.info("%s: schema version %d -> %d", self.path, version, SCHEMA_VERSION)

    def _check_unversioned(self, db: sqlite3.Connection) -> bool:
        """Version 0 is a new file (True) or one from before versioning, whose tables are those
        of version 1; anything else (another program's database) is refused, not altered."""
        found = _columns(db)
        if not found:
            return True
        expected = _columns_of(_V1)
        odd = sorted(t for t, columns in found.items() if expected.get(t) != columns)
        if odd:
            raise StoreSchemaError(
                f"{self.path}: not a daemon database this autotuner knows (schema version 0 "
                f"with unexpected tables or columns: {', '.join(odd)})"
            )
        return False

    @contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ------------------------------------------------------------------ SLAs
    def add_sla(self, name: str, yaml_text: str, schedule: str, engine: str) -> bool:
        """Register an SLA; False when one of that name exists (a racing submission won)."""
        try:
            with self._txn() as db:
                db.execute(
                    "INSERT INTO slas(name, yaml, schedule, engine, submitted) VALUES (?,?,?,?,?)",
                    (name, yaml_text, schedule, engine, time.time()),
                )
        except sqlite3.IntegrityError:  # the primary key: every other column is given
            return False
        return True

    def get_sla(self, name: str) -> SlaRow | None:
        row = self._db.execute("SELECT * FROM slas WHERE name=?", (name,)).fetchone()
        return None if row is None else _sla(row)

    def slas(self) -> list[SlaRow]:
        return [_sla(r) for r in self._db.execute("SELECT * FROM slas ORDER BY name")]

    def update_sla(self, name: str, **fields: Any) -> None:
        allowed = {"schedule", "engine", "next_check", "promotion", "fallback", "summary"}
        if not fields or not set(fields) <= allowed:
            raise ValueError(f"cannot update {sorted(set(fields) - allowed)}")
        values = [
            json.dumps(_stored(v) if k in ("promotion", "fallback") else v)
            if k in ("promotion", "fallback", "summary") and v is not None
            else v
            for k, v in fields.items()
        ]
        sets = ", ".join(f"{k}=?" for k in fields)
        with self._txn() as db:
            db.execute(f"UPDATE slas SET {sets} WHERE name=?", (*values, name))

    def delete_sla(self, name: str) -> None:
        with self._txn() as db:
            db.execute("DELETE FROM slas WHERE name=?", (name,))

    # ------------------------------------------------------------------ jobs
    def enqueue(
        self,
        kind: JobKind,
        sla: str,
        engine: str,
        *,
        args: Mapping[str, Any] | None = None,
        priority: int = 0,
    ) -> int:
        with self._txn() as db:
            cur = db.execute(
                "INSERT INTO jobs(kind, sla, engine, args, priority, created) VALUES (?,?,?,?,?,?)",
                (kind, sla, engine, json.dumps(dict(args or {})), priority, time.time()),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def job(self, job_id: int) -> Job | None:
        row = self._db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def jobs(
        self, *, states: tuple[str, ...] = (), sla: str | None = None, limit: int = 1000
    ) -> list[Job]:
        where, params = [], []
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            params += list(states)
        if sla is not None:
            where.append("sla=?")
            params.append(sla)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._db.execute(
            f"SELECT * FROM jobs {clause} ORDER BY id DESC LIMIT ?", (*params, limit)
        )
        return [_job(r) for r in rows]

    def queued(self, now: float) -> list[Job]:
        """Runnable queued jobs, highest priority first, then oldest first."""
        rows = self._db.execute(
            "SELECT * FROM jobs WHERE state='queued' AND not_before<=? "
            "ORDER BY priority DESC, id ASC",
            (now,),
        )
        return [_job(r) for r in rows]

    def pending(self, sla: str, kind: str) -> Job | None:
        """A queued or running job of this kind for this SLA, if any."""
        row = self._db.execute(
            "SELECT * FROM jobs WHERE sla=? AND kind=? AND state IN ('queued','running') "
            "ORDER BY id LIMIT 1",
            (sla, kind),
        ).fetchone()
        return None if row is None else _job(row)

    def claim(self, job_id: int) -> bool:
        """Reserve a queued job before its process starts (state stays visible as running)."""
        with self._txn() as db:
            cur = db.execute(
                "UPDATE jobs SET state='running', started=?, attempts=attempts+1, pid=NULL "
                "WHERE id=? AND state='queued'",
                (time.time(), job_id),
            )
            return cur.rowcount == 1

    def set_pid(self, job_id: int, pid: int, pid_start: float) -> None:
        with self._txn() as db:
            db.execute("UPDATE jobs SET pid=?, pid_start=? WHERE id=?", (pid, pid_start, job_id))

    def finish(
        self,
        job_id: int,
        state: JobState,
        *,
        exit_code: int | None = None,
        outcome: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        with self._txn() as db:
            db.execute(
                "UPDATE jobs SET state=?, finished=?, exit_code=?, outcome=?, error=?, "
                "pid=NULL WHERE id=?",
                (
                    state,
                    time.time(),
                    exit_code,
                    None if outcome is None else json.dumps(dict(outcome)),
                    error,
                    job_id,
                ),
            )

    def requeue(self, job_id: int, *, delay_s: float = 0.0, error: str | None = None) -> None:
        """Back to the queue (interrupted or crashed); ``delay_s`` is the retry backoff."""
        with self._txn() as db:
            db.execute(
                "UPDATE jobs SET state='queued', pid=NULL, pid_start=NULL, started=NULL, "
                "not_before=?, error=COALESCE(?, error) WHERE id=?",
                (time.time() + delay_s, error, job_id),
            )

    def undo_attempt(self, job_id: int) -> None:
        """An interruption by the daemon itself does not count as a failed attempt."""
        with self._txn() as db:
            db.execute("UPDATE jobs SET attempts=MAX(0, attempts-1) WHERE id=?", (job_id,))

    def request_cancel(self, job_id: int) -> str | None:
        """Cancel a queued job at once; flag a running one. Returns the state seen."""
        with self._txn() as db:
            row = db.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is None:
                return None
            state = str(row["state"])
            if state == "queued":
                db.execute(
                    "UPDATE jobs SET state='cancelled', finished=? WHERE id=?",
                    (time.time(), job_id),
                )
            elif state == "running":
                db.execute("UPDATE jobs SET cancel_requested=1 WHERE id=?", (job_id,))
            return state

    def counts(self) -> dict[tuple[str, str], int]:
        rows = self._db.execute("SELECT kind, state, COUNT(*) AS n FROM jobs GROUP BY kind, state")
        return {(r["kind"], r["state"]): int(r["n"]) for r in rows}

    # ------------------------------------------------------------------ alerts
    def add_alert(
        self, kind: str, sla: str, severity: str, summary: str, details: Mapping[str, Any]
    ) -> int:
        with self._txn() as db:
            cur = db.execute(
                "INSERT INTO alerts(time, kind, sla, severity, summary, details) "
                "VALUES (?,?,?,?,?,?)",
                (time.time(), kind, sla, severity, summary, json.dumps(dict(details))),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def alerts(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT * FROM alerts ORDER BY id DESC LIMIT ?", (limit,))
        return [_details(r, "alerts") for r in rows]  # delivered: 1 sent, 0 pending, -1 gave up

    def undelivered(self, now: float) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT * FROM alerts WHERE delivered=0 AND next_try<=? ORDER BY id", (now,)
        )
        return [_details(r, "alerts") for r in rows]

    def alert_sent(self, alert_id: int, ok: bool, *, next_try: float, error: str | None) -> None:
        with self._txn() as db:
            db.execute(
                "UPDATE alerts SET delivered=?, attempts=attempts+1, next_try=?, last_error=? "
                "WHERE id=?",
                (int(ok), next_try, error, alert_id),
            )

    def give_up_alert(self, alert_id: int, error: str) -> None:
        with self._txn() as db:
            db.execute("UPDATE alerts SET delivered=-1, last_error=? WHERE id=?", (error, alert_id))

    def alert_counts(self) -> dict[str, int]:
        rows = self._db.execute("SELECT kind, COUNT(*) AS n FROM alerts GROUP BY kind")
        return {r["kind"]: int(r["n"]) for r in rows}

    def alerts_pending(self) -> int:
        row = self._db.execute("SELECT COUNT(*) AS n FROM alerts WHERE delivered=0").fetchone()
        return int(row["n"])

    def alerts_given_up(self) -> int:
        row = self._db.execute("SELECT COUNT(*) AS n FROM alerts WHERE delivered=-1").fetchone()
        return int(row["n"])

    def last_rechecks(self) -> list[Job]:
        """The newest finished re-check of each SLA."""
        rows = self._db.execute(
            "SELECT * FROM jobs WHERE id IN (SELECT MAX(id) FROM jobs WHERE kind='recheck' "
            "AND state='done' GROUP BY sla)"
        )
        return [_job(r) for r in rows]

    # ------------------------------------------------------------------ engines
    def engines(self) -> dict[str, dict[str, Any]]:
        return {r["name"]: dict(r) for r in self._db.execute("SELECT * FROM engines")}

    def see_engine(self, name: str, version: str, distribution: str, device: str) -> None:
        with self._txn() as db:
            db.execute(
                "INSERT INTO engines(name, version, distribution, device, seen) "
                "VALUES (?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET version=excluded.version, "
                "distribution=excluded.distribution, device=excluded.device, seen=excluded.seen",
                (name, version, distribution, device, time.time()),
            )

    def forget_engine(self, name: str) -> None:
        with self._txn() as db:
            db.execute("DELETE FROM engines WHERE name=?", (name,))

    # ------------------------------------------------------------------ verdicts
    def add_verdict(
        self, sla: str, old: str, new: str, verdict: str, details: Mapping[str, Any]
    ) -> None:
        with self._txn() as db:
            db.execute(
                "INSERT INTO verdicts(time, sla, old_engine, new_engine, verdict, details) "
                "VALUES (?,?,?,?,?,?)",
                (time.time(), sla, old, new, verdict, json.dumps(dict(details))),
            )

    def verdicts(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT * FROM verdicts ORDER BY id DESC LIMIT ?", (limit,))
        return [_details(r, "verdicts") for r in rows]

    def latest_verdicts(self) -> list[dict[str, Any]]:
        """The newest verdict per (SLA, old engine, new engine)."""
        rows = self._db.execute(
            "SELECT * FROM verdicts WHERE id IN (SELECT MAX(id) FROM verdicts "
            "GROUP BY sla, old_engine, new_engine)"
        )
        return [dict(r) for r in rows]
