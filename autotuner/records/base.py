"""The base of every record: a pydantic model with a ``schema_version``, written and read by
the same class.

A record file without ``schema_version`` was written before records had one: it is read as
version 0, which has the same fields as version 1 (the field was added, nothing else changed).
A version this autotuner does not know (a newer autotuner wrote it) is refused with
:class:`RecordVersionError`, never guessed at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from autotuner.core.paths import atomic_write_text

LEGACY = 0  # files written before records carried a schema_version


class RecordError(ValueError):
    """A record file or attribute set can't be read: not JSON, or not the record's shape."""


class RecordVersionError(RecordError):
    """A record has a ``schema_version`` this autotuner does not read (a newer one wrote it)."""

    def __init__(self, source: str, kind: str, found: object, readable: tuple[int, ...]) -> None:
        self.source = source
        self.found = found
        self.readable = readable
        super().__init__(
            f"{source}: {kind} has schema_version {found!r}, but this autotuner reads "
            f"{', '.join(str(v) for v in readable)} (written by a newer autotuner? upgrade it)"
        )


class Record(BaseModel):
    """A record that crosses a module or process boundary.

    ``KIND`` names it in error messages; ``SCHEMA_VERSION`` is the version this class writes.
    Unknown keys are ignored on reading (an Optuna trial holds other attributes too).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    KIND: ClassVar[str] = "record"
    SCHEMA_VERSION: ClassVar[int] = 1

    schema_version: int = 1

    @classmethod
    def readable_versions(cls) -> tuple[int, ...]:
        return (LEGACY, *range(1, cls.SCHEMA_VERSION + 1))

    @classmethod
    def upgrade(cls, data: dict[str, Any], version: int) -> dict[str, Any]:
        """``data`` of an older ``version``, converted to the current one. Version 0 has the
        fields of version 1, so the default only stamps the version."""
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any], source: str) -> Self:
        """Validate ``data`` (a parsed file or attribute set) read from ``source``."""
        version = data.get("schema_version", LEGACY)
        if isinstance(version, bool) or version not in cls.readable_versions():
            raise RecordVersionError(source, cls.KIND, version, cls.readable_versions())
        fields = dict(data)
        if version < cls.SCHEMA_VERSION:
            fields = cls.upgrade(fields, version)
        fields["schema_version"] = cls.SCHEMA_VERSION
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise RecordError(f"{source}: not a valid {cls.KIND}: {_first(exc)}") from exc

    @classmethod
    def from_json(cls, text: str, source: str) -> Self:
        """Parse and validate the JSON ``text`` read from ``source``."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested past the stack
            raise RecordError(f"{source}: not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            found = type(data).__name__
            raise RecordError(f"{source}: a {cls.KIND} is a JSON object, found {found}")
        return cls.from_data(data, source)

    @classmethod
    def read(cls, path: Path) -> Self:
        """Read the record written to ``path`` (``OSError`` if it can't be read at all)."""
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"{path}: not UTF-8 text ({exc.reason})") from exc
        return cls.from_json(text, str(path))

    @classmethod
    def read_or_none(cls, path: Path) -> Self | None:
        """The record at ``path``, or None when it is missing or unreadable (a process that
        died before writing it, a half-edited file). A record of a newer autotuner still
        raises :class:`RecordVersionError`: that is not a file to skip quietly."""
        try:
            return cls.read(path)
        except RecordVersionError:
            raise
        except (OSError, RecordError):
            return None

    def to_data(self) -> dict[str, Any]:
        """The JSON form, field names as on disk (non-finite floats kept, as ``json`` writes
        them)."""
        return self.model_dump(mode="json")

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_data(), indent=indent)

    def write(self, path: Path, indent: int | None = 2) -> None:
        """Write atomically: readers see the previous file or this one."""
        atomic_write_text(path, self.to_json(indent))


def _first(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {err['msg']}{more}"
