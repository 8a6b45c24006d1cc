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


class StoreSchemaError(BadInput):
    """The daemon's database has a schema this code cannot use: written by a newer autotuner
    (a higher ``user_version``) or not a daemon database at all."""


class StoreDamaged(BadInput):
    """The daemon's database can't be trusted: the file is damaged, or it is empty while the
    state directory holds what it recorded (see daemon/forgotten.py)."""


class UnknownJobKind(BadInput):
    """A job row names a kind this daemon has no object for (see daemon/kinds.py)."""
