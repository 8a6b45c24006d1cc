"""The outcome file (``--outcome FILE`` of ``tune``, ``bench`` and ``compare-engines``): how a
command ended, for the process that started it.

An exit code alone can't tell "the SLA is not met" (1) from a Python that died before the
command ran (also 1), so the daemon passes ``--outcome`` and trusts a job's end only when the
file is there and agrees with the exit code. The command writes it last, whatever happened:

    met       exit 0: the SLA is met (tune: a config that meets it was promoted;
              compare-engines: a verdict was reached, see its result.json)
    not_met   exit 1: the SLA is not met (compare-engines --fail-on-regression: a regression)
    error     any other exit: bad input (2), the engine failed to start (3), an internal
              error (70), interrupted (130); ``message`` is the line printed on stderr
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from autotuner.core.errors import SlaNotMet
from autotuner.records.base import Record

OutcomeStatus = Literal["met", "not_met", "error"]


def status_of(exit_code: int) -> OutcomeStatus:
    """The status an exit code means."""
    if exit_code == 0:
        return "met"
    if exit_code == SlaNotMet.exit_code:
        return "not_met"
    return "error"


class JobOutcome(Record):
    KIND = "outcome file"

    command: str  # tune, bench, compare-engines
    status: OutcomeStatus
    exit_code: int
    message: str | None = None  # what the command printed about an error
    finished: str  # ISO 8601, UTC

    @classmethod
    def of_exit(cls, command: str, exit_code: int, message: str | None) -> JobOutcome:
        return cls(
            command=command,
            status=status_of(exit_code),
            exit_code=exit_code,
            message=message,
            finished=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    def agrees_with(self, exit_code: int) -> bool:
        """Whether the file describes an exit with ``exit_code``."""
        return self.exit_code == exit_code and self.status == status_of(exit_code)
