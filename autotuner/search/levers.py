"""Levers by what they can move: an engine's lever table, read and ranked for one limit.

The table is engine knowledge (a data file in the engine's package, named by the adapter's
``levers_file``); this module knows no engine. A table maps each lever -- a search-space
parameter, or something outside the space (more GPUs, speculative decoding) -- to rows::

    format: 1
    levers:
      <lever>:
        - limit: tpot            # the latency kind (ttft, tpot, itl, e2e) or memory it moves
          workload: long_prompts # long_prompts (mean prompt >= LONG_PROMPT tokens) | any
          effect: moves          # moves | trades | none
          try: [2048]            # values that pull it (absent: the space file's prior)
          costs: [ttft]          # what it may cost (a trade's other limit)
          lossy: false           # changes outputs: only with search.allow_lossy
          outside: "..."         # not a parameter of the space: how to say it
          why: "..."
          measured: null         # or {where: ..., result: ..., change: -0.08}

``moves``: lowers the limit's metric; ``trades``: only by raising another (a lever that
moved TPOT and TTFT around the same point in a measured study); ``none``: cannot move it.
``measured: null`` marks a row as expected, not yet measured. After the baseline missed a
limit, :func:`rank` orders the levers for it: lossless levers of the space that move it
(measured effects first, largest first), then trades, then what the space cannot try
(lossy values without ``search.allow_lossy``, parameters outside the space), which the
"infeasible losslessly" answer names as what would close the gap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotuner.core.show import show_value
from autotuner.core.types import same_value
from autotuner.space import ParamSpec, ParamValue, SearchSpace

__all__ = [
    "LIMITS",
    "LONG_PROMPT",
    "Lever",
    "LeverTable",
    "LeverTableError",
    "Measured",
    "Ranked",
    "load_levers",
    "rank",
]

LIMITS = frozenset({"ttft", "tpot", "itl", "e2e", "memory", "served_rate", "errors"})
EFFECTS = ("moves", "trades", "none")
WORKLOADS = ("any", "long_prompts")
# A mean prompt this long or longer is a long-prompt workload: its prefill work is what decode
# steps carry (a 2,000-token prompt is several step budgets of a small budget). Not 1024: on
# the replayed 1024-token surfaces a 2048-token budget was infeasible (short steps prefill
# inefficiently), and pulling it first cost a launch there.
LONG_PROMPT = 1536

_KEYS = {"limit", "workload", "effect", "try", "costs", "lossy", "outside", "why", "measured"}


class LeverTableError(ValueError):
    """A lever table that cannot be read: what is wrong and where."""


@dataclass(frozen=True)
class Measured:
    """Where a row was measured and what moved; ``change``: the limit metric's relative
    change (-0.08: 8 % lower), when a number was measured."""

    where: str
    result: str
    change: float | None = None


@dataclass(frozen=True)
class Lever:
    """One row of the table: what ``name`` does to ``limit``."""

    name: str
    limit: str
    effect: str
    why: str
    workload: str = "any"
    values: tuple[ParamValue, ...] = ()
    costs: tuple[str, ...] = ()
    lossy: bool = False
    outside: str | None = None
    measured: Measured | None = None

    def describe(self) -> str:
        """The lever in a few words: its name and the values that pull it."""
        if self.outside:
            return self.outside
        if self.values:
            return f"{self.name}={'/'.join(show_value(v) for v in self.values)}"
        return self.name

    def evidence(self) -> str:
        """What was measured of it, or that it was not."""
        if self.measured is None:
            return "expected, not yet measured"
        return f"measured: {self.measured.result} ({self.measured.where})"


@dataclass(frozen=True)
class LeverTable:
    rows: tuple[Lever, ...]

    def for_limit(self, limit: str, long_prompts: bool | None) -> list[Lever]:
        """The rows about ``limit`` that apply to the workload (``long_prompts`` None:
        unknown, e.g. a dataset: only ``any`` rows), in file order."""
        return [
            r
            for r in self.rows
            if r.limit == limit and (r.workload == "any" or (long_prompts and r.workload != "any"))
        ]


def _fail(where: str, what: str) -> LeverTableError:
    return LeverTableError(f"{where}: {what}")


def _measured(raw: Any, where: str) -> Measured | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _fail(where, "measured must be null or a mapping with where and result")
    place, result, change = raw.get("where"), raw.get("result"), raw.get("change")
    if not isinstance(place, str) or not place.strip():
        raise _fail(where, "measured.where must say where it was measured")
    if not isinstance(result, str) or not result.strip():
        raise _fail(where, "measured.result must say what moved")
    if change is not None and (
        isinstance(change, bool) or not isinstance(change, int | float) or not math.isfinite(change)
    ):
        raise _fail(where, f"measured.change must be a number, got {change!r}")
    extra = set(raw) - {"where", "result", "change"}
    if extra:
        raise _fail(where, f"measured has unknown keys: {', '.join(sorted(map(str, extra)))}")
    return Measured(place.strip(), result.strip(), None if change is None else float(change))


def _row(name: str, raw: Any, where: str) -> Lever:
    if not isinstance(raw, Mapping):
        raise _fail(where, "a row must be a mapping")
    extra = set(raw) - _KEYS
    if extra:
        raise _fail(where, f"unknown keys: {', '.join(sorted(map(str, extra)))}")
    limit, effect, workload = raw.get("limit"), raw.get("effect"), raw.get("workload", "any")
    if limit not in LIMITS:
        raise _fail(where, f"limit must be one of {', '.join(sorted(LIMITS))}, got {limit!r}")
    if effect not in EFFECTS:
        raise _fail(where, f"effect must be one of {', '.join(EFFECTS)}, got {effect!r}")
    if workload not in WORKLOADS:
        raise _fail(where, f"workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    why = raw.get("why")
    if not isinstance(why, str) or not why.strip():
        raise _fail(where, "why is required")
    values = raw.get("try", [])
    if not isinstance(values, list) or not all(
        v is None or isinstance(v, bool | int | float | str) for v in values
    ):
        raise _fail(where, "try must be a list of values")
    costs = raw.get("costs", [])
    if not isinstance(costs, list) or not all(c in LIMITS for c in costs):
        raise _fail(where, f"costs must be a list of limits ({', '.join(sorted(LIMITS))})")
    if effect == "trades" and not costs:
        raise _fail(where, "a trade must name what it costs (costs:)")
    lossy = raw.get("lossy", False)
    if not isinstance(lossy, bool):
        raise _fail(where, "lossy must be true or false")
    outside = raw.get("outside")
    if outside is not None and (not isinstance(outside, str) or not outside.strip()):
        raise _fail(where, "outside must be a sentence")
    return Lever(
        name=name,
        limit=str(limit),
        effect=str(effect),
        why=" ".join(why.split()),
        workload=str(workload),
        values=tuple(values),
        costs=tuple(str(c) for c in costs),
        lossy=lossy,
        outside=outside.strip() if isinstance(outside, str) else None,
        measured=_measured(raw.get("measured"), where),
    )


def parse_levers(text: str, source: str = "lever table") -> LeverTable:
    """A lever table from YAML text; :class:`LeverTableError` says what is wrong."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _fail(source, f"not YAML: {e}") from None
    if not isinstance(doc, Mapping) or doc.get("format") != 1:
        raise _fail(source, "needs format: 1 and levers:")
    levers = doc.get("levers")
    if not isinstance(levers, Mapping) or not levers:
        raise _fail(source, "levers must be a mapping of lever name to rows")
    rows: list[Lever] = []
    for name, entries in levers.items():
        if not isinstance(name, str) or not isinstance(entries, list) or not entries:
            raise _fail(f"{source}: {name}", "a lever is a name with a list of rows")
        for i, raw in enumerate(entries):
            rows.append(_row(name, raw, f"{source}: {name}[{i}]"))
    return LeverTable(tuple(rows))


def load_levers(path: Path | None) -> LeverTable | None:
    """The table at ``path``; None when the engine has none."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise _fail(str(path), f"cannot read: {e.strerror or e}") from None
    return parse_levers(text, str(path))


# --------------------------------------------------------------------------- ranking


@dataclass(frozen=True)
class Ranked:
    """A lever for one limit and what the study can do with it.

    ``status``: ``try`` (a lossless lever of the space that moves the limit), ``trade``
    (moves it only at another limit's cost), ``lossy`` (needs ``search.allow_lossy``),
    ``outside`` (not a parameter of this space: more GPUs, another feature), ``none``
    (cannot move it). ``values``: the values of the space that pull it (``try`` and ``trade``).
    """

    lever: Lever
    status: str
    values: tuple[ParamValue, ...] = ()


def _in_domain(p: ParamSpec, value: ParamValue) -> bool:
    if p.choices is not None:
        return any(same_value(value, c) for c in p.choices)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return p.low is not None and p.high is not None and p.low <= value <= p.high


_ORDER = {"try": 0, "trade": 1, "lossy": 2, "outside": 3, "none": 4}


def rank(
    table: LeverTable,
    limit: str,
    space: SearchSpace,
    *,
    long_prompts: bool | None,
    prior_values: Mapping[str, Sequence[ParamValue]] | None = None,
) -> list[Ranked]:
    """The levers for ``limit`` on this workload, best first (module docstring).

    ``prior_values``: per parameter, the values the space file's prior would try now (for
    rows without ``try:``). A lever whose values all lie outside the space's domain is
    ``lossy`` when it is lossy (the space dropped them without ``search.allow_lossy``), else
    ``outside``.
    """
    tuned = {p.name: p for p in space.params}
    out: list[Ranked] = []
    for row in table.for_limit(limit, long_prompts):
        if row.effect == "none":
            out.append(Ranked(row, "none"))
            continue
        p = tuned.get(row.name)
        wanted = row.values or tuple((prior_values or {}).get(row.name, ()))
        values = tuple(v for v in wanted if p is not None and _in_domain(p, v))
        status = "try" if row.effect == "moves" else "trade"
        if values:
            out.append(Ranked(row, status, values))
        elif p is not None and not wanted:  # a parameter of the space, values not known yet
            out.append(Ranked(row, status))
        elif row.lossy:
            out.append(Ranked(row, "lossy"))
        else:
            out.append(Ranked(row, "outside"))

    def key(r: Ranked) -> tuple[int, float]:
        # Measured effects first, the largest fall first; unmeasured rows keep file order.
        m = r.lever.measured
        change = m.change if m is not None and m.change is not None else math.inf
        return _ORDER[r.status], change

    return sorted(out, key=key)
