"""What an SLA may hand the engine, checked when the SLA is read (``check``, ``tune``, the daemon).

The engine runs as the tuner's user, so its options and environment are allow-lists (see
:mod:`autotuner.core.options`): an option of ``engine.params``, ``engine.args`` or
``search.params`` must be declared by the engine's search space or listed by its adapter, and
its value must have the declared type, lie inside the declared limits, or be one of the
declared choices; a variable of ``engine.env`` must be listed by the adapter. The engine's
version is not known yet (it is when tuning), so the space file for the newest releases is
used, and messages say so.

Problems are ``(message, path)`` pairs, the path relative to the validated section.

Every source of a launch's options goes through the same rules and one merge
(:func:`engine_settings`): ``engine.params``, then the options ``engine.args`` spells out
(an option in both, or twice in ``engine.args``, is refused), the search space's values
(``search.params``: an option the SLA fixes may not be searched too), ``search.baseline``,
and ``bench --set`` (:func:`override_problems`). The engine is given the merged options as
its command line; what a trial records is what ran.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from autotuner.core.options import OptionRule
from autotuner.core.types import ParamValue
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
    refused_args = adapter.check_sla_args(args, rules)
    for index, why in refused_args:
        problems.append((why, ("args", index)))
    if not refused_args:
        seen: dict[str, int] = {}
        for index, name, _ in adapter.sla_args_settings(args, rules):
            if name in params:
                problems.append(
                    (
                        f"{name} is also set in engine.params; give it in one place only",
                        ("args", index),
                    )
                )
            elif name in seen:
                problems.append(
                    (f"{name} is set twice in engine.args (also at {seen[name]})", ("args", index))
                )
            seen.setdefault(name, index)
    for name, why in adapter.check_env(env):
        problems.append((why, ("env", name)))
    return problems


def engine_settings(
    kind: str, params: Mapping[str, bool | int | float | str], args: Sequence[str]
) -> dict[str, bool | int | float | str]:
    """The options an SLA fixes, merged: ``engine.params``, then those ``engine.args`` sets
    (read from args :func:`engine_problems` accepted)."""
    out = dict(params)
    for _, name, value in registry.get(kind).sla_args_settings(args, option_rules(kind)):
        out[name] = value
    return out


def override_problems(kind: str, overrides: Mapping[str, ParamValue]) -> list[str]:
    """Why options given on the command line (``bench --set NAME=VALUE``) are refused: the
    same allow-list and rules as the SLA's own (null omits an option, so it always passes)."""
    adapter = registry.get(kind)
    try:
        rules = option_rules(kind)
    except SpaceError as exc:
        return [f"cannot check the options against the search space: {exc}"]
    problems: list[str] = []
    for name, value in overrides.items():
        rule = rules.get(name)
        if name in adapter.reserved_params:
            problems.append(f"--set {name}: cannot be set here: {adapter.reserved_params[name]}")
        elif rule is None:
            close = difflib.get_close_matches(name, list(rules), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                f"--set {name}: not an option an SLA may set{hint}: the search space "
                f"({_declared(kind).file.name}) does not declare it and the "
                f"{adapter.display_name} adapter does not list it"
            )
        elif value is not None and (why := _value_problem(kind, rule, value)) is not None:
            problems.append(f"--set {name}: {why}")
    return problems


def search_problems(kind: str, search: SearchSpec, params: Mapping[str, object]) -> Problems:
    """Names and values of ``search.params`` (and of ``search.baseline``) that the search
    space would refuse when tuning; ``params``: the options the SLA fixes
    (:func:`engine_settings`), which may not be searched as well."""
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
            problems.append(
                ("also fixed by engine.params or engine.args; give it in one place only", at)
            )
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
    for name, value in search.baseline.items():
        rule = declared.rules.get(name)
        if rule is None or value is None:
            continue
        if (why := _value_problem(kind, rule, value)) is not None:
            problems.append((why, ("search", "baseline", name)))
    return problems
