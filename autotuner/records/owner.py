"""Which process owns a study or a trial: kept in the study's lock file and in each trial's
record, so that another process can tell a live owner from one that is gone.

A pid alone is not enough (pids are reused): the owner is the pid, the host and the process's
start (:func:`autotuner.core.procs.start_stamp`), which together name one process.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from autotuner.records.base import Record


class ProcessOwner(BaseModel):
    """One process on one host (part of :class:`StudyLockFile` and of the trial record)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    pid: int
    host: str
    started: float  # procs.start_stamp(): seconds after boot (older records: epoch seconds)
    since: str | None = None  # ISO 8601 UTC: when it took what it owns

    def describe(self) -> str:
        """``pid 123 on host h since 2026-01-01T00:00:00+00:00``."""
        when = f" since {self.since}" if self.since else ""
        return f"pid {self.pid} on host {self.host}{when}"


class StudyLockFile(Record):
    """``<study>/tune.lock``: the tuner that holds the study (the lock itself is an flock on
    the file; this content only says who holds it)."""

    KIND = "study lock file"

    owner: ProcessOwner
    command: str | None = None  # the holder's command line
