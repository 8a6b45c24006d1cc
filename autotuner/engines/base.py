"""The contract every engine backend follows.

An engine is a server process the tuner starts, load-tests and stops. Backends never run in the
tuner's interpreter: they are subprocesses with their own environment, started from an argv
list in their own process group, bound to 127.0.0.1 on a port the tuner picked.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from autotuner.core.errors import EngineStartFailed


class LaunchCause(StrEnum):
    """Why an engine failed to come up, as read from its log."""

    UNKNOWN_FLAG = "unknown_flag"
    OUT_OF_MEMORY = "out_of_memory"
    CUDA_ERROR = "cuda_error"
    TIMEOUT = "timeout"
    OTHER = "other"


class EngineLaunchError(EngineStartFailed, RuntimeError):
    """The engine exited, or never became healthy, before serving.

    ``cause`` is the classification, ``log_tail`` the last lines of its log (for humans),
    ``returncode`` the exit status when it exited (``None`` on a time-out).
    """

    def __init__(
        self, cause: LaunchCause, message: str, log_tail: str, returncode: int | None
    ) -> None:
        super().__init__(f"engine failed to start ({cause.value}): {message}")
        self.cause = cause
        self.message = message
        self.log_tail = log_tail
        self.returncode = returncode


@dataclass(frozen=True)
class Endpoint:
    """A running engine's OpenAI-compatible server."""

    base_url: str
    model: str
    pid: int
    argv: tuple[str, ...]
    log_path: Path
    startup_s: float


class EngineBackend(Protocol):
    """Lifecycle: ``launch`` once, then ``stop`` (always, in ``finally``)."""

    kind: str

    def argv(self) -> list[str]:
        """The exact command line that ``launch`` runs (for manifests and deploy files)."""
        ...

    async def launch(self) -> Endpoint:
        """Start the engine and return once it answers ``/health``.

        Raises :class:`EngineLaunchError` when it exits early or misses its deadline; the
        process group is already reaped then.
        """
        ...

    async def stop(self) -> None:
        """Reap the whole process group (SIGTERM, then SIGKILL). Safe to call twice."""
        ...
