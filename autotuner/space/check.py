"""Consistency checks of a parsed space file (domains, types, conditions, versions, limits,
priors, hopeless and monotone rules), and the rule an SLA's value of a declared option obeys."""

from __future__ import annotations

import re
from collections.abc import Mapping

from autotuner.core.options import OptionRule
from autotuner.core.show import show_value
from autotuner.core.yamlpos import KeyPath
from autotuner.space.schema import (
    _Decl,
    _File,
    _Hopeless,
    _Limits,
    _Monotone,
    _Not,
    _Prior,
    _Variant,
)
from autotuner.space.strategy import BINDING, MEASURED
from autotuner.space.values import ParamValue, _check_type, _kind, _member
from autotuner.space.versions import _check_spec


def _check_file(spec: _File) -> list[str]:
    """Consistency of a parsed file: names, domains, types, condition order, versions."""
    problems: list[str] = []
    if (err := _check_spec(spec.versions)) is not None:
        problems.append(f"versions: {err}")
    seen: set[str] = set()
    all_names = {d.name for d in spec.params}
    for d in spec.params:
        at = f"params.{d.name}"
        if d.name in seen:
            problems.append(f"{at}: declared twice")
        if (err := _check_spec(d.versions)) is not None:
            problems.append(f"{at}.versions: {err}")
        variants: list[tuple[str, _Decl | _Variant]] = [("", d)]
        variants += [(f".per_device.{k}", v) for k, v in d.per_device.items()]
        for suffix, v in variants:
            problems += [f"{at}{suffix}: {p}" for p in _check_domain(d, v)]
        if d.default is not None and not _check_type(d.type, d.default):
            problems.append(f"{at}.default: {show_value(d.default)} is not {_kind(d.type)}")
        for parent in d.when:
            if parent not in seen:
                where = "declared after it" if parent in all_names else "not declared"
                problems.append(f"{at}.when: {parent!r} is {where}")
        if d.superseded_by is not None and d.superseded_by not in all_names:
            problems.append(f"{at}.superseded_by: {d.superseded_by!r} is not declared")
        if d.limits is not None:
            problems += [f"{at}.limits: {p}" for p in _check_limits(d, d.limits)]
        seen.add(d.name)
    return problems


_LATENCY_KINDS = ("ttft", "tpot", "itl", "e2e")
_METRIC_RE = re.compile(r"^[a-z][a-z0-9_.]*\Z")


def _check_strategy(spec: _File) -> list[tuple[KeyPath, str]]:
    """``prior`` and ``hopeless_when`` of every parameter, each problem with its key path."""
    decls = {d.name: d for d in spec.params}
    problems: list[tuple[KeyPath, str]] = []
    for i, d in enumerate(spec.params):
        base: KeyPath = ("params", i)
        priors: list[tuple[KeyPath, _Prior, _Decl | _Variant]] = []
        if d.prior is not None:
            priors.append(((*base, "prior"), d.prior, d))
        for dev, v in d.per_device.items():
            if v.prior is not None:
                priors.append(((*base, "per_device", dev, "prior"), v.prior, v))
        for key, prior, where in priors:
            problems += [
                ((*key, k), f"params.{d.name}: prior: {m}")
                for k, m in _check_prior(d, prior, where)
            ]
        for j, h in enumerate(d.hopeless_when):
            key = (*base, "hopeless_when", j)
            problems += [
                ((*key, k), f"params.{d.name}: hopeless_when[{j}]: {m}")
                for k, m in _check_hopeless(d, h, decls)
            ]
        for j, mono in enumerate(d.monotone):
            key = (*base, "monotone", j)
            problems += [
                ((*key, k), f"params.{d.name}: monotone[{j}]: {m}")
                for k, m in _check_monotone(d, mono)
            ]
    return problems


def _check_monotone(d: _Decl, m: _Monotone) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if d.type not in ("int", "float"):
        out.append(("worse", f"only a number has a direction, not a {d.type}"))
    if not m.limits:
        out.append(("limits", "name the latencies or constraint metrics it worsens"))
    for lim in m.limits:
        if not _METRIC_RE.match(lim):
            kinds = ", ".join(_LATENCY_KINDS)
            out.append(("limits", f"{lim!r}: name a latency ({kinds}) or a metric"))
    if not m.why.strip():
        out.append(("why", "say why the move never helps"))
    return out


def _check_prior(d: _Decl, p: _Prior, where: _Decl | _Variant) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    choices = where.choices if where.choices is not None else d.choices
    for v in p.first:
        if not _check_type(d.type, v):
            out.append(("first", f"{show_value(v)} is not {_kind(d.type)}"))
        elif choices is not None and not _member(v, choices):
            out.append(("first", f"{show_value(v)} is not one of the choices"))
    if p.near is not None:
        if p.near not in MEASURED:
            out.append(("near", f"{p.near!r} is not a measured quantity ({', '.join(MEASURED)})"))
        if d.type not in ("int", "float"):
            out.append(("near", f"only numbers can be near a measured quantity, not a {d.type}"))
        if not p.times:
            out.append(("times", "'near' needs 'times': the factors to try, e.g. [2, 4]"))
    elif p.times:
        out.append(("times", "'times' multiplies 'near', which is not given"))
    if any(t <= 0 for t in p.times):
        out.append(("times", "factors must be > 0"))
    if p.rank is None and (p.first or p.near):
        out.append(("rank", "a prior needs a rank: its place in the warm start (1 = first)"))
    if p.rank is not None and not p.first and p.near is None:
        out.append(("rank", "a ranked prior needs 'first' values or 'near' to try"))
    for i, b in enumerate(p.by_limit):
        at = f"by_limit.{i}"
        if unknown := [x for x in b.limits if x not in BINDING]:
            out.append((at, f"unknown limits {unknown} (one of {', '.join(sorted(BINDING))})"))
        if not b.why.strip():
            out.append((at, "say why this direction helps under that limit"))
        if bool(b.first) == bool(b.times):
            out.append((at, "give 'first' values or 'times' (factors on the prior's 'near')"))
        if b.times and p.near is None:
            out.append((at, "'times' multiplies the prior's 'near', which is not given"))
        for v in b.first:
            if not _check_type(d.type, v):
                out.append((at, f"{show_value(v)} is not {_kind(d.type)}"))
    return out


def _check_hopeless(d: _Decl, h: _Hopeless, decls: Mapping[str, _Decl]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if not h.why.strip():
        out.append(("why", "say why these values are hopeless"))
    if (h.values is None) == (h.below is None):
        out.append(("values", "give either 'values' or 'below': which values are hopeless"))
    for v in h.values or []:
        if not _check_type(d.type, v):
            out.append(("values", f"{show_value(v)} is not {_kind(d.type)}"))
    below = h.below
    if below is not None:
        if d.type not in ("int", "float"):
            out.append(("below", f"only numbers can be below a bound, not a {d.type}"))
        if isinstance(below, bool) or (isinstance(below, str) and below not in MEASURED):
            known = ", ".join(sorted(MEASURED))
            out.append(("below", f"{show_value(below)} is neither a number nor measured ({known})"))
    if "times" in h.model_fields_set and not isinstance(below, str):
        out.append(("times", "'times' multiplies a measured 'below' (e.g. below: concurrency)"))
    if h.times <= 0:
        out.append(("times", "must be > 0"))
    for other, rule in h.with_.items():
        if other not in decls or other == d.name:
            what = "the parameter itself" if other == d.name else "not declared"
            out.append(("with", f"{other!r} is {what}"))
            continue
        for v in rule.not_ if isinstance(rule, _Not) else rule:
            if v is not None and not _check_type(decls[other].type, v):
                out.append(("with", f"{other}: {show_value(v)} is not {_kind(decls[other].type)}"))
    for m in h.unless_objective:
        if not _METRIC_RE.match(m):
            out.append(("unless_objective", f"{m!r} is not a metric name"))
    for m in h.limited:
        if m not in _LATENCY_KINDS and not _LATENCY_METRIC_RE.match(m):
            out.append(
                ("limited", f"{m!r}: name a latency ({', '.join(_LATENCY_KINDS)}) or its metric")
            )
    return out


_LATENCY_METRIC_RE = re.compile(r"^(?:mean|p\d+(?:\.\d+)?)_(?:ttft|tpot|itl|e2e)_ms\Z")


def _check_limits(d: _Decl, limits: _Limits) -> list[str]:
    """Limits belong to numbers, are ordered, and hold every value the file itself names."""
    if d.type not in ("int", "float"):
        return [f"only an int or float has limits, not a {d.type}"]
    problems = [
        f"bound {show_value(b)} is not {_kind(d.type)}"
        for b in (limits.low, limits.high)
        if b is not None and not _check_type(d.type, b)
    ]
    if limits.low is not None and limits.high is not None and limits.low > limits.high:
        problems.append(f"low ({limits.low}) > high ({limits.high})")
    if problems:
        return problems
    rule = _option_rule(d)
    named: list[ParamValue] = [d.low, d.high, d.default, *(d.choices or [])]
    for v in d.per_device.values():
        named += [v.low, v.high, v.fixed, *(v.choices or [])]
    return [
        f"{show_value(x)}, named in the file, is outside them"
        for x in named
        if x is not None and rule.problem(x) is not None
    ]


def _option_rule(d: _Decl, source: str = "") -> OptionRule:
    """What a value of ``d`` set by an SLA may be: its type, its limits, and for a categorical
    one of the choices the file lists on any device."""
    choices: tuple[ParamValue, ...] | None = None
    if d.type == "categorical":
        listed: list[ParamValue] = []
        for c in [*(d.choices or []), *(c for v in d.per_device.values() for c in v.choices or [])]:
            if not _member(c, listed):
                listed.append(c)
        choices = tuple(listed)
    low = d.limits.low if d.limits is not None else None
    high = d.limits.high if d.limits is not None else None
    return OptionRule(d.type, low, high, choices, source)


def _check_domain(d: _Decl, v: _Decl | _Variant) -> list[str]:
    problems: list[str] = []
    choices = v.choices
    if isinstance(v, _Decl):
        if d.type in ("categorical",) and choices is None:
            problems.append("a categorical needs 'choices'")
        if d.type in ("int", "float") and choices is None and (v.low is None or v.high is None):
            problems.append(f"an {d.type} needs 'choices' or 'low' and 'high'")
    for c in choices or []:
        if not _check_type(d.type, c):
            problems.append(f"choice {show_value(c)} is not {_kind(d.type)}")
    if choices is not None and len(choices) != len({repr(c) for c in choices}):
        problems.append("choices repeat a value")
    for bound in (v.low, v.high):
        if bound is not None and not _check_type(d.type, bound):
            problems.append(f"bound {show_value(bound)} is not {_kind(d.type)}")
    if v.low is not None and v.high is not None and v.low > v.high:
        problems.append(f"low ({v.low}) > high ({v.high})")
    if v.log and v.low is not None and v.low <= 0:
        problems.append("a log range needs low > 0")
    if v.log and v.step is not None:
        problems.append("'log' and 'step' exclude each other")
    return problems
