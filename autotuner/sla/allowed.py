"""What an SLA may hand the engine, checked when the SLA is read (``check``, ``tune``, the daemon).

The engine runs as the tuner's user, so its options and environment are allow-lists (see
:mod:`autotuner.core.options`): an option of ``engine.params``, ``engine.args`` or
``search.params`` must be declared by the engine's search space or listed by its adapter, and
its value must have the declared type, lie inside the declared limits, or be one of the
declared choices; a variable of ``engine.env`` must be listed by the adapter. The engine's
version is not known yet (it is when tuning), so the space file for the newest releases is
used, and messages say so.

Problems are ``(message, path)`` pairs, the path relative to the validated section.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from autotuner.core.options import OptionRule
from autotuner.engines import registry
from autotuner.space import DeclaredOptions, SearchSpec, SpaceError, newest_declarations

Problems = list[tuple[str, tuple[str | int, ...]]]


def _declared(kind: str) -> DeclaredOptions:
    return newest_declarations(registry.get(kind).space_name)


def option_rules(kind: str) -> dict[str, OptionRule]:
    """Every option an SLA may set for engine ``kind``: the adapter's, then the space's."""
    return {**registry.get(kind).options, **_declared(kind).rules}


def _space_note(kind: str, rule: OptionRule) -> str:
    declared = _declared(kind)
    if rule.source.endswith(declared.file.name):
        name = registry.get(kind).display_name
        return (
            f" ({rule.source} for the newest {name}; the engine's own version is checked "
            "when tuning)"
        )
    return f" ({rule.source})" if rule.source else ""


def _value_problem(kind: str, rule: OptionRule, value: object) -> str | None:
    why = rule.problem(value)
    return None if why is None else why + _space_note(kind, rule)


def engine_problems(
    kind: str, params: Mapping[str, object], args: Sequence[str], env: Mapping[str, str]
) -> Problems:
    """What ``engine.params``, ``engine.args`` and ``engine.env`` may not carry."""
    adapter = registry.get(kind)
    try:
        rules = option_rules(kind)
    except SpaceError as exc:
        return [(f"cannot check the options against the search space: {exc}", ("params",))]
    problems: Problems = []
    for name, value in params.items():
        rule = rules.get(name)
        if rule is None:
            problems.append(
                (
                    f"not an option an SLA may set: the search space "
                    f"({_declared(kind).file.name}) does not declare it and the "
                    f"{adapter.display_name} adapter does not list it",
                    ("params", name),
                )
            )
        elif (why := _value_problem(kind, rule, value)) is not None:
            problems.append((why, ("params", name)))
    for index, why in adapter.check_sla_args(args, rules):
        problems.append((why, ("args", index)))
    for name, why in adapter.check_env(env):
        problems.append((why, ("env", name)))
    return problems


def search_problems(kind: str, search: SearchSpec, params: Mapping[str, object]) -> Problems:
    """Names and values of ``search.params`` that the search space would refuse when tuning."""
    try:
        declared = _declared(kind)
    except SpaceError as exc:
        return [(f"cannot check against the search space: {exc}", ("search",))]
    problems: Problems = []
    for name, override in search.params.items():
        at: tuple[str | int, ...] = ("search", "params", name)
        rule = declared.rules.get(name)
        if rule is None:
            close = difflib.get_close_matches(name, list(declared.rules), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                (f"not a parameter of the search space ({declared.file.name}){hint}", at)
            )
            continue
        if name in params:
            problems.append(("also set in engine.params; give it in one place only", at))
        fixed = override.fixed if override.is_fixed else None
        if fixed is not None and (why := _value_problem(kind, rule, fixed)) is not None:
            problems.append((why, (*at, "fixed")))
        for i, value in enumerate(override.values or ()):
            if value is None and rule.type == "categorical":
                continue  # null: omit the flag
            if (why := _value_problem(kind, rule, value)) is not None:
                problems.append((why, (*at, "values", i)))
        if rule.type in ("int", "float"):
            for key in ("low", "high"):
                bound = getattr(override, key)
                if bound is not None and (why := _value_problem(kind, rule, bound)) is not None:
                    problems.append((why, (*at, key)))
    return problems
