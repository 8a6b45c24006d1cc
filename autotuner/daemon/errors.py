"""Errors the daemon raises to its callers."""

from __future__ import annotations

from autotuner.core.errors import BadInput


class SubmitError(BadInput):
    """A submission was refused; ``status`` is the HTTP status that fits."""

    def __init__(self, status: int, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.status = status
        self.messages = messages


class AlreadyRunning(BadInput):
    pass
