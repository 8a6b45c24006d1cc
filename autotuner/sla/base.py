"""What every SLA model shares: unknown keys are errors, no silent type coercion, and one way
for validators to report problems.

Errors are raised from validators as ``PydanticCustomError("sla", "{msg}", ctx)``; ``ctx["at"]``
is a sub-path below the validator's own location and ``ctx["more"]`` carries further
``(message, at)`` problems found by the same validator, so one validator can report several
(:mod:`autotuner.sla.problems` turns them into lines of the file).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from autotuner.core.yamlpos import KeyPath

# A name that becomes part of directory and file names (the SLA's, an engine environment's).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def fail(message: str, *at: str | int, more: Sequence[tuple[str, KeyPath]] = ()) -> Exception:
    """A validation error whose location is the validator's own plus ``at``."""
    return PydanticCustomError("sla", "{msg}", {"msg": message, "at": at, "more": list(more)})


def fail_all(problems: Sequence[tuple[str, KeyPath]]) -> Exception:
    """One error carrying several ``(message, at)`` problems (see the module docstring)."""
    (message, at), rest = problems[0], problems[1:]
    return fail(message, *at, more=rest)


def show(value: Any) -> str:
    """A value as the user wrote it in YAML, for "got ..." messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"{value} (a {type(value).__name__})"


def suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# Validation context key: {id(input dict): allowed field names}, filled by Strict so that
# "unknown key" errors can suggest the closest field of the right model.
HINTS = "sla_field_hints"


class Strict(BaseModel):
    """Base of every SLA model: unknown keys are errors, no silent type coercion."""

    # No inf or NaN anywhere: `duration_s: .inf` would hold a GPU lease forever, a NaN limit
    # compares false with everything.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _remember_fields(cls, data: Any, info: ValidationInfo) -> Any:
        hints = info.context.get(HINTS) if isinstance(info.context, dict) else None
        if isinstance(hints, dict) and isinstance(data, dict):
            hints[id(data)] = tuple(cls.model_fields)
        return data
