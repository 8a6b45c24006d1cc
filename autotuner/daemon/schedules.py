"""The re-check schedules: queue the nightly re-check (or tune, if nothing is promoted yet)
of every SLA that is due, and say once when an SLA's schedule can't be planned."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotuner.daemon.config import next_run
from autotuner.daemon.store import SlaRow

if TYPE_CHECKING:
    from autotuner.daemon.service import Daemon


def tick(d: Daemon, now: float) -> list[int]:
    """Queue the re-check (or tune) of every SLA due at ``now``; returns the jobs queued."""
    queued = []
    for row in d.store.slas():
        try:
            job = _tick_one(d, row, now)
        except Exception as exc:  # this SLA's schedule fails, not the loop
            if d.disk.note(exc, f"planning the re-check of {row.name}"):
                break
            _failed(d, row, exc)
            continue
        d.bad_schedules.pop(row.name, None)
        if job is not None:
            queued.append(job)
    return queued


def _tick_one(d: Daemon, row: SlaRow, now: float) -> int | None:
    if row.next_check is None:
        if row.promotion is not None:
            d.store.update_sla(row.name, next_check=next_run(row.schedule, now))
        return None
    if row.next_check > now:
        return None
    d.store.update_sla(row.name, next_check=next_run(row.schedule, now))
    if d.store.jobs(states=("queued", "running"), sla=row.name):
        return None  # already busy: the next night will check again
    if row.promotion is None:
        return d.enqueue_tune(row.name, row.engine)
    return d.enqueue_recheck(row.name, row.promotion.engine or row.engine)


def _failed(d: Daemon, row: SlaRow, exc: Exception) -> None:
    """Say once per schedule that an SLA's re-checks can't be planned (a schedule that
    never fires, stored by an older daemon; a damaged row)."""
    if d.bad_schedules.get(row.name) == row.schedule:
        return
    d.bad_schedules[row.name] = row.schedule
    why = str(exc) or type(exc).__name__
    if isinstance(exc, ValueError):
        why = f"schedule {row.schedule!r}: {why}"
    d.alert(
        "schedule_failed",
        row.name,
        "warning",
        f"{row.name}: its re-checks can't be planned ({why}); none is queued until it is "
        "fixed: delete the SLA and submit it again with a valid schedule",
        {"schedule": row.schedule, "error": why},
    )
