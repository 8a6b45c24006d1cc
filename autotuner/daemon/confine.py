"""Where an SLA that came in over HTTP or the spool may make the daemon read and write.

Whoever holds the API token (or can drop a file into the spool) should not get the daemon's
user to read any file of the host or write a database anywhere it can write. So, for those
SLAs only (the local CLI runs as its own user and is not confined):

* ``tune.storage`` is left out (the study's SQLite file in the state directory) or is a
  ``sqlite:///`` URL of a file under ``STATE_DIR/studies/``; any other URL is refused;
* ``model.path`` and ``workload.dataset`` must lie, once every symbolic link is resolved,
  under ``STATE_DIR/spool/`` or one of the config's ``allowed_paths`` (none by default).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from autotuner.sla.spec import Sla


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(os.path.realpath(r)) for r in roots)


def path_roots(state_dir: Path, allowed: Sequence[Path]) -> list[Path]:
    """The directories model and dataset paths may lie under."""
    return [state_dir / "spool", *allowed]


def storage_problem(storage: str | None, state_dir: Path) -> str | None:
    """Why ``tune.storage`` is refused for a daemon SLA, or None."""
    if storage is None:
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    studies = state_dir / "studies"
    hint = f"leave it out (the daemon keeps each study under {studies})"
    try:
        url = make_url(storage)
    except ArgumentError:
        return f"tune.storage: not a database URL; {hint}"
    if url.get_backend_name() != "sqlite":
        return (
            f"tune.storage: the daemon does not write to {url.get_backend_name()} databases; {hint}"
        )
    db = url.database or ""
    if url.query or db in ("", ":memory:") or db.startswith("file:"):
        return f"tune.storage: only a plain SQLite file path is allowed; {hint}"
    if not Path(db).is_absolute():
        return f"tune.storage: the SQLite path must be absolute, under {studies}; {hint}"
    if not _inside(Path(db), [studies]):
        return f"tune.storage: {db} is outside {studies}; {hint}"
    return None


def path_problems(sla: Sla, state_dir: Path, allowed: Sequence[Path]) -> list[str]:
    """Why ``model.path`` / ``workload.dataset`` / ``workload.trace`` are refused for a daemon
    SLA (empty: fine).

    Relative paths count as resolved against the SLA's base directory (the spool)."""
    roots = path_roots(state_dir, allowed)
    where = ", ".join(str(r) for r in roots)
    problems = []
    for field, value in (
        ("model.path", sla.model.path),
        ("workload.dataset", sla.workload.dataset),
        ("workload.trace", sla.workload.trace),
    ):
        if value is None:
            continue
        if not _inside(sla.resolve_path(value), roots):
            problems.append(
                f"{field}: {value} is outside the directories the daemon may read SLA files "
                f"from ({where}; allowed_paths in the daemon's config adds more)"
            )
    return problems


def problems(sla: Sla, state_dir: Path, allowed: Sequence[Path]) -> list[str]:
    """Every confinement problem of an SLA submitted to the daemon."""
    out = path_problems(sla, state_dir, allowed)
    storage = storage_problem(sla.tune.storage, state_dir)
    if storage is not None:
        out.append(storage)
    return out
