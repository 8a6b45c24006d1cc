"""Values of parameters: their types, how they compare, and whether one fits a declared type."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from autotuner.core.types import same_value

ParamValue = bool | int | float | str | None
ParamType = Literal["int", "float", "bool", "categorical"]
Device = Literal["cpu", "gpu"]


def _member(v: ParamValue, values: Iterable[ParamValue]) -> bool:
    return any(same_value(v, x) for x in values)


def _kind(decl_type: ParamType) -> str:
    return {
        "int": "an int",
        "float": "a number",
        "bool": "true or false",
        "categorical": "a string or number",
    }[decl_type]


def _check_type(decl_type: ParamType, v: ParamValue) -> bool:
    if decl_type == "bool":
        return isinstance(v, bool)
    if decl_type == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if decl_type == "float":
        return isinstance(v, int | float) and not isinstance(v, bool)
    return v is None or isinstance(v, str | int | float)
