"""Is this SQLite file damaged? Asked before a database is opened, so that a truncated or
overwritten file gives one clear message (what is wrong, what to do) instead of a driver
traceback from deep inside the first query."""

from __future__ import annotations

import sqlite3
from pathlib import Path

MAX_PROBLEMS = 3  # of quick_check's lines, in the message


def damage(path: Path) -> str | None:
    """What is wrong with the SQLite file at ``path`` (``PRAGMA quick_check``), or None when
    nothing is, or when there is no file yet (a missing or zero-byte file is a new database:
    whether that is expected is the caller's question). Never writes to the file."""
    try:
        if path.stat().st_size == 0:
            return None
    except FileNotFoundError:
        return None
    try:
        db = sqlite3.connect(path, timeout=30.0)
        try:
            rows = db.execute("PRAGMA quick_check").fetchall()
        finally:
            db.close()
    except sqlite3.OperationalError:
        return None  # locked, or can't be opened at all: the caller's open says which
    except sqlite3.DatabaseError as exc:  # "file is not a database", "... malformed"
        return str(exc)
    problems = [str(r[0]) for r in rows if r and r[0] != "ok"]
    if not problems:
        return None
    more = f" (and {len(problems) - MAX_PROBLEMS} more)" if len(problems) > MAX_PROBLEMS else ""
    return "; ".join(problems[:MAX_PROBLEMS]) + more


def tables(path: Path) -> list[str] | None:
    """The names of the tables in the SQLite file at ``path``, opened read-only (None when it
    can't be read as a database: :func:`damage` says why)."""
    try:
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30.0)
        try:
            rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return sorted(str(r[0]) for r in rows)
