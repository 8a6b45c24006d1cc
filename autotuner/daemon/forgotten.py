"""A daemon must not start afresh on a state directory whose database went missing.

SQLite takes a missing or zero-byte file for a new, empty database. If ``daemon.db`` was
truncated to nothing (a full disk, a bad restore) or deleted while the state directory still
holds the SLAs, promoted bundles and spool files it recorded, starting would silently forget
them: no re-checks, no alerts, SLAs that look unknown. The daemon refuses instead (exit 2) and
says what it found and what to do.
"""

from __future__ import annotations

from pathlib import Path

from autotuner.daemon.errors import StoreDamaged


def traces(root: Path) -> dict[str, int]:
    """What a state directory holds that only a daemon with a database wrote: SLAs
    submitted, promoted bundles, spool files taken in (those found, by kind)."""
    found = {
        "SLAs (slas/)": sum(1 for _ in root.glob("slas/*/source.yaml")),
        "promoted bundles (studies/)": sum(
            1 for _ in root.glob("studies/*/*/*/promoted/optimization_manifest.json")
        ),
        "submitted spool files (spool/done/)": sum(
            1 for p in root.glob("spool/done/*") if p.is_file()
        ),
    }
    return {what: n for what, n in found.items() if n}


def refuse_forgotten(root: Path, db: Path) -> None:
    """:class:`StoreDamaged` when ``db`` is missing or empty but ``root`` holds traces."""
    try:
        size: int | None = db.stat().st_size
    except FileNotFoundError:
        size = None
    if size:
        return  # a database with content: Store checks it (quick_check, schema version)
    found = traces(root)
    if not found:
        return  # a first start
    what = "missing" if size is None else "empty (0 bytes)"
    held = ", ".join(f"{n} {kind}" for kind, n in found.items())
    raise StoreDamaged(
        f"the daemon database {db} is {what}, but {root} holds what it recorded: {held}; "
        "starting on an empty database would forget them. Restore daemon.db from a backup, "
        "or move the state directory aside to start afresh"
    )
