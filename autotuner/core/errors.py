"""The root of the tuner's errors and the exit code each kind means.

Every error the tuner raises on purpose derives from :class:`AutotunerError` through one of
the subclasses below; its ``exit_code`` is what the command line exits with when the error
reaches it (``autotuner.cli.errors``). A new error class picks the subclass whose exit code
fits and may keep a builtin base its callers catch, e.g. ``class X(BadInput, ValueError)``.

Anything that is not an :class:`AutotunerError` and reaches the command line is a bug: it
exits 70 (:class:`InternalError`) and its traceback goes to a file.
"""

from __future__ import annotations

from typing import ClassVar


class AutotunerError(Exception):
    """An error the tuner raised on purpose; ``str()`` is meant for the user."""

    exit_code: ClassVar[int] = 70

    def describe(self) -> str:
        """What the command line prints on stderr for this error."""
        return f"error: {self}"


class SlaNotMet(AutotunerError):
    """No configuration meets the SLA. Exit code 1 means this and nothing else."""

    exit_code = 1


class BadInput(AutotunerError):
    """An input can't be used: SLA or config file, search space, study, engine, device."""

    exit_code = 2


class EngineStartFailed(AutotunerError):
    """The engine exited, or never became healthy, before serving."""

    exit_code = 3


class EngineCrashed(EngineStartFailed):
    """The engine exited while it was being measured: a failed engine (exit 3), never a miss
    of the SLA, and never a capacity."""


class InternalError(AutotunerError):
    """A bug: something the tuner did not expect. The traceback is written to a file."""

    exit_code = 70


class Interrupted(AutotunerError):
    """Stopped by Ctrl-C or SIGTERM; the message says what was cleaned up and how to resume."""

    exit_code = 130

    def describe(self) -> str:
        return str(self)


EXIT_CODES: dict[int, str] = {
    0: "success (bench: the SLA is met)",
    SlaNotMet.exit_code: "the SLA is not met (engine and model commands: the operation failed; "
    "compare-engines --fail-on-regression: a regression; doctor: warnings)",
    BadInput.exit_code: "bad input",
    EngineStartFailed.exit_code: "the engine failed to start (or crashed while measured)",
    InternalError.exit_code: "internal error (a bug; the traceback is in a file)",
    Interrupted.exit_code: "interrupted",
}
