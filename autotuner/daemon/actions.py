"""What an operator asks of the daemon through the API, beyond a submission and the status:
an SLA's record, a re-tune or a re-check now, its deletion; the jobs and the engines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotuner.daemon import workers
from autotuner.daemon.errors import SubmitError
from autotuner.daemon.store import Job
from autotuner.daemon.submissions import check_extra_trials

if TYPE_CHECKING:
    from autotuner.daemon.service import Daemon


def study(d: Daemon, name: str) -> dict[str, Any] | None:
    """One SLA with its newest jobs and its verdicts; None if there is no such SLA."""
    row = d.store.get_sla(name)
    if row is None:
        return None
    return {
        **row.to_dict(),
        "jobs": [j.to_dict() for j in d.store.jobs(sla=name, limit=50)],
        "verdicts": [v for v in d.store.verdicts() if v["sla"] == name],
    }


def tune_now(d: Daemon, name: str, extra: int = 0) -> int:
    """Queue a re-tune of SLA ``name`` adding ``extra`` launches; SubmitError 404 if none,
    400 if ``extra`` is out of bounds."""
    check_extra_trials(extra)
    row = d.store.get_sla(name)
    if row is None:
        raise SubmitError(404, [f"no SLA named {name!r}"])
    return d.enqueue_tune(name, row.engine, extra=extra)


def check_now(d: Daemon, name: str) -> int:
    """Queue a re-check of the promoted config of ``name`` ahead of the queue; SubmitError
    404 if there is no such SLA, 409 if nothing is promoted yet."""
    row = d.store.get_sla(name)
    if row is None:
        raise SubmitError(404, [f"no SLA named {name!r}"])
    if row.promotion is None:
        raise SubmitError(409, [f"{name}: nothing promoted yet to re-check"])
    return d.enqueue_recheck(name, row.promotion.engine or row.engine, priority=1)


def delete_sla(d: Daemon, name: str) -> bool:
    """Cancel the SLA's jobs and forget it; False if there is no such SLA."""
    row = d.store.get_sla(name)
    if row is None:
        return False
    for job in d.store.jobs(states=("queued", "running"), sla=name):
        workers.cancel(d, job.id)
    d.store.delete_sla(name)
    return True


def jobs(d: Daemon, states: tuple[str, ...] = (), limit: int = 200) -> list[Job]:
    return d.store.jobs(states=states, limit=limit)


def job(d: Daemon, job_id: int) -> Job | None:
    return d.store.job(job_id)


def engines(d: Daemon) -> dict[str, dict[str, Any]]:
    """The engine environments the daemon has seen, by name."""
    return d.store.engines()
