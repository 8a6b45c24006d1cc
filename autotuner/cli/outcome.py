"""``--outcome FILE``: write how the command ended (:class:`~autotuner.records.outcome.JobOutcome`)
for whoever started it (the daemon). Written on every ending the error wrapper sees: success,
"SLA not met", bad input, a failed engine, an internal error, an interruption."""

from __future__ import annotations

import sys
from pathlib import Path

from autotuner.cli.errors import Report
from autotuner.core.errors import BadInput
from autotuner.records.outcome import JobOutcome


def writer(command: str, path: Path) -> Report:
    """A report hook for :func:`autotuner.cli.errors.run` that writes the outcome file."""

    def write(code: int, line: str | None) -> None:
        try:
            JobOutcome.of_exit(command, code, line).write(path)
        # the exit code stands; a reader takes a missing file as failed
        except (OSError, BadInput) as exc:
            print(f"warning: could not write the outcome file {path}: {exc}", file=sys.stderr)

    return write
