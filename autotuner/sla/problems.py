"""What is wrong with an SLA file, as lines of it: ``Problem``, ``SlaError``, and pydantic's
validation errors turned into problems with their dotted path, line and a message for humans."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from autotuner.core.errors import BadInput
from autotuner.core.yamlpos import KeyPath, Located
from autotuner.sla.base import show, suggest
from autotuner.sla.workload import COUNT_TAG


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an SLA file. ``path`` is dotted (``workload.arrival.rate``)."""

    line: int | None
    path: str
    message: str

    def render(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line is not None else source
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class SlaError(BadInput):
    """An SLA file that can't be used; ``str()`` gives one line per problem."""

    def __init__(self, problems: list[Problem], source: str = "<string>") -> None:
        self.problems = problems
        self.source = source
        super().__init__("\n".join(p.render(source) for p in problems))

    def describe(self) -> str:
        return str(self)  # each line already names the file and line


def _bound(value: Any) -> str:
    """A limit from a pydantic error context: ``0.0`` reads better as ``0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _data_path(loc: Sequence[int | str], data: Any, keep_from: int) -> KeyPath:
    """Follow a pydantic ``loc`` through the input data, dropping union tags.

    Entries before ``keep_from`` that are not keys/indices of the data are tags (``poisson``,
    ``count``, ``function-after[...]``, ``[key]``) and are skipped; later entries (the field
    named by a ``missing`` error, a validator's ``at``) are always kept. An int entry on a
    mapping is a position in it: the constraints mapping is validated as a list.
    """
    node = data
    out: list[str | int] = []
    for i, part in enumerate(loc):
        if isinstance(node, dict):
            if part in node:
                out.append(str(part))
                node = node[part]
                continue
            if isinstance(part, int) and 0 <= part < len(node):
                key = list(node)[part]
                out.append(str(key))
                node = node[key]
                continue
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(part)
            node = node[part]
            continue
        if i >= keep_from:
            out.append(part)
            node = None
    return tuple(out)


def _node_at(data: Any, path: KeyPath) -> Any:
    node = data
    for part in path:
        if isinstance(node, dict):
            node = next((v for k, v in node.items() if str(k) == part), None)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def _quoted(text: Any) -> list[str]:
    return re.findall(r"'([^']*)'", str(text))


def _discriminator_field(ctx: dict[str, Any]) -> str:
    names = _quoted(ctx.get("discriminator", ""))
    # Callable discriminators (token counts) are reported under their mapping key.
    return names[0] if names else "distribution"


def _message(err: Any, path: KeyPath, data: Any, hints: dict[int, tuple[str, ...]]) -> str:
    kind: str = err["type"]
    ctx: dict[str, Any] = err.get("ctx") or {}
    got = show(err.get("input"))
    if kind == "sla":
        return str(ctx["msg"])
    if kind == "invalid_key":
        return f"keys must be text (quote it: '{path[-1]}')" if path else "keys must be text"
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        fields = hints.get(id(_node_at(data, path[:-1])), ())
        return f"unknown key{suggest(str(path[-1]), fields)}" if path else "unknown key"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op, bound = {
            "greater_than": (">", "gt"),
            "greater_than_equal": (">=", "ge"),
            "less_than": ("<", "lt"),
            "less_than_equal": ("<=", "le"),
        }[kind]
        return f"must be {op} {_bound(ctx.get(bound))}, got {got}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer, got {got}"
    if kind in ("float_type", "float_parsing"):
        return f"must be a number, got {got}"
    if kind == "string_type":
        return f"must be a string, got {got}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false, got {got}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be a mapping, got {got}"
    if kind in ("list_type", "tuple_type"):
        return f"must be a list, got {got}"
    if kind == "literal_error":
        expected = _quoted(ctx.get("expected", ""))
        if len(expected) == 1:
            return f"must be {expected[0]!r}, got {got}"
        return f"must be one of {', '.join(expected)}, got {got}"
    if kind == "union_tag_invalid":
        tags = [t for t in _quoted(ctx.get("expected_tags", "")) if t != COUNT_TAG]
        return f"must be one of {', '.join(tags)}, got {show(ctx.get('tag'))}"
    if kind == "union_tag_not_found":
        return "required field is missing"
    text = str(err.get("msg", "invalid value"))
    return text.removeprefix("Value error, ")


def problems_from_validation(
    exc: ValidationError, located: Located, hints: dict[int, tuple[str, ...]]
) -> list[Problem]:
    problems: list[Problem] = []
    for err in exc.errors(include_url=False):
        ctx: dict[str, Any] = err.get("ctx") or {}
        loc = list(err["loc"])
        keep_from = len(loc) - 1 if err["type"] == "missing" else len(loc)
        path = _data_path(loc, located.data, keep_from)
        message = _message(err, path, located.data, hints)
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc.append(_discriminator_field(ctx))
        found = [(message, ctx.get("at", ()))]
        found += [(m, at) for m, at in ctx.get("more", ())]
        for msg, at in found:
            p = _data_path([*loc, *at], located.data, keep_from)
            problems.append(Problem(located.line_of(p), dotted(p), msg))
    return problems
