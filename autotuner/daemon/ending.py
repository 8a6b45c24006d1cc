"""How a job ended, from its exit code and the outcome file its command wrote (``--outcome``).

The exit code alone is not enough: a Python that dies before the command runs (an import
error, a broken install) exits 1, which is also "the SLA is not met". So a result code counts
only when the outcome file is there and says the same; an internal error (70) is a bug, not a
result, and is not retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from autotuner.core.errors import BadInput, InternalError
from autotuner.records.base import RecordError
from autotuner.records.outcome import JobOutcome

# result: act on it (the kind's ``finished``); retry: back to the queue with backoff;
# failed: fail the job at once with a job_failed alert.
Verdict = Literal["result", "retry", "failed"]


@dataclass(frozen=True)
class Ending:
    verdict: Verdict
    why: str | None = None  # for "failed": the job's error line and the alert's summary


def judge(code: int, results: frozenset[int], outcome_file: Path) -> Ending:
    """What exit ``code`` of a job whose kind reads ``results`` means, given its outcome file."""
    outcome, unreadable = _read(outcome_file)
    if code == BadInput.exit_code:
        return Ending("failed", "refused: bad input")
    if code == InternalError.exit_code:
        said = f": {outcome.message}" if outcome is not None and outcome.message else ""
        return Ending("failed", f"crashed with an internal error (exit {code}){said}")
    if code not in results:
        return Ending("retry")
    if outcome is None:
        return Ending("failed", f"exited {code} but {unreadable}: its result can't be trusted")
    if not outcome.agrees_with(code):
        return Ending(
            "failed",
            f"exited {code} but its outcome file says {outcome.status} (exit "
            f"{outcome.exit_code}): its result can't be trusted",
        )
    return Ending("result")


def _read(path: Path) -> tuple[JobOutcome | None, str]:
    """The outcome file, or None and why it can't be read."""
    try:
        return JobOutcome.read(path), ""
    except FileNotFoundError:
        return None, f"wrote no outcome file ({path})"
    except (OSError, RecordError) as exc:
        return None, f"its outcome file is unreadable ({exc})"
