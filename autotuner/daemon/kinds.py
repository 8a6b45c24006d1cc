"""The kinds of daemon job: what each runs, which exit codes are its results, what its end does.

Each kind is one object in :data:`KINDS`, looked up by the name stored in the job's row; the
service asks it and never switches on the name. A kind's process is ``autotuner <command>``:

    tune        autotuner tune SLA           0 promoted, 1 nothing met the SLA
    recheck     autotuner bench SLA --set    0 met, 1 missed
    regression  autotuner compare-engines    0 a verdict (which one is in its result file)

An engine that failed (exit 3: it did not start, or crashed while measured) is never an SLA
verdict, for any kind: the job is retried, then fails with a ``job_failed`` alert; it raises
no ``sla_infeasible`` or ``sla_violation`` and queues no re-tune.

Every command is given ``--outcome FILE`` (records/outcome.py). An exit code in ``results``
counts only when that file is there and agrees with it: a Python that died before the command
ran exits 1 too, and must not read as "SLA not met". An exit code outside ``results`` is a
failure the service retries with backoff, except 2 (bad input) and 70 (internal error), which
fail the job at once whatever its kind (daemon/ending.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from autotuner.daemon import jobs, outcomes
from autotuner.daemon.errors import UnknownJobKind
from autotuner.daemon.store import JobKind

if TYPE_CHECKING:
    from autotuner.daemon.config import DaemonConfig
    from autotuner.daemon.service import Daemon
    from autotuner.daemon.store import Job, SlaRow


class Kind(ABC):
    """One kind of job. Stateless: one instance serves every job of the kind."""

    name: ClassVar[JobKind]
    results: ClassVar[frozenset[int]]  # exit codes whose outcome is read: the job is done

    def leases_devices(self, config: DaemonConfig) -> bool:
        """Whether the job holds its SLA's devices while it runs."""
        return True

    def cannot_run(self, row: SlaRow) -> str | None:
        """Why the job has nothing to do (it is cancelled with this reason), or None."""
        return None

    @abstractmethod
    def argv(self, d: Daemon, job: Job, row: SlaRow) -> list[str]:
        """The job's command line (an argv, never a shell line); may write the pinned SLA
        file it names."""

    @abstractmethod
    def finished(self, d: Daemon, job: Job, code: int) -> dict[str, Any]:
        """Act on a result (``code`` in ``results``): record, alert, queue what follows.
        Returns the outcome stored with the job."""


class Tune(Kind):
    name = "tune"
    results = frozenset({0, 1})

    def leases_devices(self, config: DaemonConfig) -> bool:
        # On a Ray cluster, Ray places each trial on a free GPU: the daemon leases nothing.
        return not (config.executor == "ray" and config.ray_address)

    def argv(self, d: Daemon, job: Job, row: SlaRow) -> list[str]:
        jobs.pin(d.layout, row, job.engine)
        argv = jobs.tune_argv(
            d.layout,
            job.sla,
            job.engine,
            int(job.args.get("extra_trials", 0)),
            d.config.executor,
            d.config.ray_address,
        )
        return [*argv, *jobs.outcome_argv(d.layout, job.sla, job.id)]

    def finished(self, d: Daemon, job: Job, code: int) -> dict[str, Any]:
        return outcomes.tune_done(d, job, code)


class Recheck(Kind):
    name = "recheck"
    results = frozenset({0, 1})  # 3, the engine failed: no verdict on the SLA

    def cannot_run(self, row: SlaRow) -> str | None:
        return None if row.promotion else "nothing promoted to re-check"

    def argv(self, d: Daemon, job: Job, row: SlaRow) -> list[str]:
        p = row.promotion
        assert p is not None  # cannot_run said so
        argv = jobs.recheck_argv(d.layout, job.sla, p.engine or row.engine, job.id, p.params)
        return [*argv, *jobs.outcome_argv(d.layout, job.sla, job.id)]

    def finished(self, d: Daemon, job: Job, code: int) -> dict[str, Any]:
        return outcomes.recheck_done(d, job, code)


class Regression(Kind):
    name = "regression"
    results = frozenset({0})

    def argv(self, d: Daemon, job: Job, row: SlaRow) -> list[str]:
        old, new = str(job.args["old"]), str(job.args["new"])
        jobs.pin(d.layout, row, new)
        argv = jobs.regression_argv(
            d.layout,
            job.sla,
            old,
            new,
            job.id,
            d.config.regression.replicates,
            d.config.regression.min_effect,
        )
        return [*argv, *jobs.outcome_argv(d.layout, job.sla, job.id)]

    def finished(self, d: Daemon, job: Job, code: int) -> dict[str, Any]:
        return outcomes.regression_done(d, job, code)


# Every name in store.JOB_KINDS, in that order (a unit test holds the two together).
KINDS: Mapping[str, Kind] = {k.name: k for k in (Tune(), Recheck(), Regression())}


def get(name: str) -> Kind:
    """The kind of that name; UnknownJobKind for a name no kind has."""
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownJobKind(f"unknown job kind {name!r}") from None
