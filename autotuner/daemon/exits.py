"""What the daemon does when a job's process exits: cancelled, interrupted by a stop, failed,
retried with backoff, or a result its kind acts on (:mod:`autotuner.daemon.ending` judges
which from the exit code and the outcome file).
"""

from __future__ import annotations

import contextlib
import logging
import signal
from typing import TYPE_CHECKING

from autotuner.daemon import ending, kinds

if TYPE_CHECKING:
    from autotuner.daemon.service import Daemon
    from autotuner.daemon.workers import Running

logger = logging.getLogger(__name__)


def record(d: Daemon, run: Running, code: int) -> None:
    """Act on a job's end; a failure here fails that job (never the loop), and one for
    lack of space is done again once there is space."""
    job_id = run.job.id
    try:
        _finished(d, run, code)
        return
    except Exception as exc:
        if d.disk.note(exc, f"recording how job {job_id} ended"):
            d.disk.defer(f"record how job {job_id} ended", lambda: _finished(d, run, code))
            return
        logger.exception("job %d: handling its end failed", job_id)
        error = f"internal: {exc!r}"
    try:  # a bug in handling must not leave the job "running"
        d.store.finish(job_id, "failed", exit_code=code, error=error)
        d.alert(
            "job_failed",
            run.job.sla,
            "warning",
            f"job {job_id} ({run.job.kind}): handling its end failed: {error}",
            {"job": job_id, "exit_code": code},
        )
    except Exception as exc:
        if not d.disk.note(exc, f"recording how job {job_id} ended"):
            logger.exception("job %d: could not be marked failed", job_id)


def _finished(d: Daemon, run: Running, code: int) -> None:
    job = d.store.job(run.job.id)
    assert job is not None
    logger.info("job %d (%s %s) exited with %d", job.id, job.kind, job.sla, code)
    if job.cancel_requested:
        d.store.finish(job.id, "cancelled", exit_code=code)
        return
    if run.stopping:
        d.store.undo_attempt(job.id)
        d.store.requeue(job.id, error="interrupted: the daemon was stopped")
        return
    interrupted = code in (130, -signal.SIGTERM, -signal.SIGKILL)
    kind = kinds.get(job.kind)
    end = ending.judge(code, kind.results, d.layout.outcome(job.sla, job.id))
    if end.verdict == "failed":  # bad input, a crash, or a result nothing vouches for
        error = "\n".join(filter(None, [end.why, tail(d, job.id)]))
        d.store.finish(job.id, "failed", exit_code=code, error=error)
        d.alert(
            "job_failed",
            job.sla,
            "warning",
            f"job {job.id} ({job.kind}) {end.why}",
            {"job": job.id, "exit_code": code},
        )
        return
    if end.verdict == "retry":
        if job.attempts < d.config.max_attempts:
            delay = 30.0 * 2 ** (job.attempts - 1)
            d.store.requeue(job.id, delay_s=delay, error=f"exit {code}: {tail(d, job.id)}")
            return
        d.store.finish(job.id, "failed", exit_code=code, error=tail(d, job.id))
        d.alert(
            "job_failed",
            job.sla,
            "warning",
            f"job {job.id} ({job.kind}) failed {job.attempts} times "
            f"({'interrupted' if interrupted else f'exit {code}'})",
            {"job": job.id},
        )
        return
    outcome = kind.finished(d, job, code)
    d.store.finish(job.id, "done", exit_code=code, outcome=outcome)


def tail(d: Daemon, job_id: int, lines: int = 15) -> str:
    """The last ``lines`` lines of a job's log ('' if it can't be read)."""
    with contextlib.suppress(OSError):
        text = d.layout.log(job_id).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])
    return ""
