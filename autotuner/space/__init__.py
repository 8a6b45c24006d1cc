"""The search space: which engine options a study tunes, and over which values.

Each engine declares its options in ``search_spaces/<engine>.yaml`` (schema: that folder's
README). :func:`load_space` resolves the declaration for one context -- engine version, device,
GPU count, compute capability, CPU flags, whether lossy settings are allowed, the SLA's
``search`` overrides and its fixed ``engine.params`` -- into a :class:`SearchSpace`:

* ``params``: the tuned parameters with their effective ranges or choices, in file order;
* ``fixed``: options always passed: the SLA's ``engine.params``, override pins, hardware pins;
* ``dropped``: every option or choice left out, with the reason (for ``describe``).

A candidate is ``space.candidate(space.suggest(trial))`` = ``{**fixed, **suggested}``; an option
neither fixed nor suggested is left to the engine (no flag). ``baseline()`` is the engine's own
defaults: the fixed options only.

Conditions: a parameter with ``when`` is suggested only if each named parameter's value --
suggested in this trial, else fixed, else its declared default -- is in the listed set (or not
in it, for ``{not: [...]}``). Parents come first in the file, so one pass decides. Conditions
that depend only on untuned parameters are decided at load time.

Versions use a small comparator (no dependency on ``packaging``): the first ``X.Y[.Z...]`` in
the text counts and pre/dev/local parts are ignored, so ``0.12.0rc1`` and
``vllm 0.12.0+cu128`` are both 0.12.0 (flags are frozen once a release candidate is cut).
Specifiers are comma-separated clauses: ``>= <= > < == != ~=``, ``==X.Y.*``.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autotuner.core.errors import BadInput
from autotuner.core.options import OptionRule
from autotuner.core.yamlpos import KeyPath, load_located

if TYPE_CHECKING:
    import optuna

    from autotuner.core.hardware import HardwareProfile

__all__ = [
    "BINDING",
    "MEASURED",
    "ByLimit",
    "Condition",
    "DeclaredOptions",
    "Dropped",
    "Hopeless",
    "Monotone",
    "Override",
    "ParamOverride",
    "ParamSpec",
    "Prior",
    "SearchSpace",
    "SearchSpec",
    "SpaceError",
    "load_space",
    "load_space_for",
    "newest_declarations",
    "parse_version",
    "space_file",
    "spaces_dir",
    "version_in",
]

ParamValue = bool | int | float | str | None
ParamType = Literal["int", "float", "bool", "categorical"]
Device = Literal["cpu", "gpu"]

# Quantities the baseline's launch measures, which priors (``near``) and hopeless conditions
# (``below``) may name; :mod:`autotuner.search.priors` computes them.
# ``concurrency``: the baseline's, at the SLA's own load; ``capacity_concurrency``: the
# incumbent's (the best config so far), at its capacity (issue 28: the load that matters).
MEASURED: frozenset[str] = frozenset({"concurrency", "capacity_concurrency"})
# What can bound a launch's capacity: the first miss above it (``search.priors``): a latency
# kind, the peak memory, the error rate, or the engine not keeping up with the rate sent.
BINDING: frozenset[str] = frozenset(
    {"ttft", "tpot", "itl", "e2e", "memory", "errors", "served_rate"}
)


class SpaceError(BadInput, ValueError):
    """A search-space file or an override that can't be used; one problem per line."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# --------------------------------------------------------------------------- versions

_VERSION_RE = re.compile(r"\d+(?:\.\d+)+")
_CLAUSE_RE = re.compile(r"^(>=|<=|==|!=|~=|>|<)?\s*(\d+(?:\.\d+)*)(\.\*)?\Z")


def parse_version(text: str) -> tuple[int, ...]:
    """``"vllm 0.12.0rc1 (cpu)"`` -> ``(0, 12)``: release numbers, trailing zeros stripped."""
    m = _VERSION_RE.search(text)
    if m is None:
        raise ValueError(f"no version number (like 0.32.0) in {text!r}")
    parts = [int(p) for p in m[0].split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _version_number(text: str) -> str:
    """The version number as written in ``text`` (``"vllm 0.32.0 (cpu)"`` -> ``"0.32.0"``)."""
    m = _VERSION_RE.search(text)
    return m[0] if m else text


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    pa, pb = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (pa > pb) - (pa < pb)


def _clause_holds(version: tuple[int, ...], clause: str) -> bool:
    m = _CLAUSE_RE.match(clause.strip())
    if m is None:
        raise ValueError(f"bad version clause {clause!r} (like '>=0.10' or '==0.11.*')")
    op, num, star = m[1] or "==", m[2], m[3]
    bound = tuple(int(p) for p in num.split("."))
    if star:
        if op not in ("==", "!="):
            raise ValueError(f"'.*' only goes with == or != in {clause!r}")
        prefix = version[: len(bound)] + (0,) * (len(bound) - len(version))
        return (prefix == bound) == (op == "==")
    c = _cmp(version, bound)
    if op == "~=":  # compatible release: >= bound, same prefix but the last part
        if len(bound) < 2:
            raise ValueError(f"'~=' needs at least two parts in {clause!r}")
        head = bound[:-1]
        return c >= 0 and (version + (0,) * len(head))[: len(head)] == head
    return {
        ">=": c >= 0,
        "<=": c <= 0,
        ">": c > 0,
        "<": c < 0,
        "==": c == 0,
        "!=": c != 0,
    }[op]


def version_in(version: str | tuple[int, ...], spec: str) -> bool:
    """Whether ``version`` satisfies every clause of ``spec`` (``">=0.10,<0.27"``; "" = any)."""
    v = parse_version(version) if isinstance(version, str) else version
    return all(_clause_holds(v, c) for c in spec.split(",") if c.strip())


def _check_spec(spec: str) -> str | None:
    try:
        version_in((0,), spec)
    except ValueError as e:
        return str(e)
    return None


# --------------------------------------------------------------------------- SLA overrides


class ParamOverride(BaseModel):
    """How an SLA narrows, widens, pins or removes one parameter of the space.

    YAML: ``false`` (exclude: the engine decides), ``{fixed: v}`` (always pass ``v``),
    ``{values: [...]}`` (search exactly these values), ``{low, high, log}`` (numeric range;
    any subset). ``true`` or ``{}`` changes nothing. ``{fixed: null}`` is the same as ``false``.
    Overrides also switch on parameters the file declares with ``search: false``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    fixed: ParamValue = None
    values: list[ParamValue] | None = None
    low: int | float | None = None
    high: int | float | None = None
    log: bool | None = None
    exclude: bool = False

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if data is False:
            return {"exclude": True}
        if data is True or data is None:
            return {}
        if isinstance(data, dict) and "fixed" in data and data["fixed"] is None:
            rest = {k: v for k, v in data.items() if k != "fixed"}
            return {**rest, "exclude": True}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ParamOverride:
        ranged = self.low is not None or self.high is not None or self.log is not None
        pinned = "fixed" in self.model_fields_set
        if self.exclude and (pinned or self.values is not None or ranged):
            raise ValueError("'false' (exclude) can't be combined with other settings")
        if pinned and (self.values is not None or ranged):
            raise ValueError("'fixed' can't be combined with 'values', 'low', 'high' or 'log'")
        if self.values is not None and ranged:
            raise ValueError("give either 'values' or a range ('low', 'high', 'log'), not both")
        if self.values is not None and not self.values:
            raise ValueError("'values' must not be empty")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self

    @property
    def is_fixed(self) -> bool:
        return "fixed" in self.model_fields_set

    @property
    def searches(self) -> bool:
        """Whether it asks for a search (values or a range), as opposed to pin/exclude/no-op."""
        return self.values is not None or any(
            x is not None for x in (self.low, self.high, self.log)
        )


Override = ParamOverride


class SearchSpec(BaseModel):
    """A suggested shape for the SLA's ``search:`` section (see the README)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    allow_lossy: bool = False
    # How data_parallel_size runs: the engine's own flag, N engine servers on disjoint
    # devices (replicas), or auto: the flag where the engine version has it
    # (autotuner.engines.layout).
    data_parallel: Literal["auto", "engine", "replicas"] = "auto"
    params: dict[str, ParamOverride] = Field(default_factory=dict)
    # Values of searched parameters for the baseline launch, which otherwise leaves every
    # searched option to the engine: e.g. a layout the model fits in ({tensor_parallel_size:
    # 4} for a 70B model that one GPU cannot hold).
    baseline: dict[str, ParamValue] = Field(default_factory=dict)


# --------------------------------------------------------------------------- file schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Requirement(_Strict):
    values: list[ParamValue] | None = None  # None: every value of the parameter
    compute_capability: str | None = None  # GPU: at least "8.9"
    cpu_flags_any: list[str] | None = None  # CPU engine: one of these /proc/cpuinfo flags
    at_most_gpus: bool = False  # value <= number of GPUs of the target


class _Not(_Strict):
    not_: list[ParamValue] = Field(alias="not")


class _ByLimit(_Strict):
    """A prior's direction when the incumbent's capacity was bounded by one of ``limits``."""

    limits: list[str]  # names of BINDING
    first: list[ParamValue] = Field(default_factory=list)  # values to try, in order
    times: list[float] = Field(default_factory=list)  # ... or factors on the prior's ``near``
    why: str


class _Prior(_Strict):
    """Where the warm start looks first (``prior:``); see the folder's README."""

    rank: int | None = Field(default=None, ge=1)  # warm-start order: 1 = most influential
    first: list[ParamValue] = Field(default_factory=list)  # values to try first, in order
    near: str | None = None  # ... or around a quantity the baseline measured
    times: list[float] = Field(default_factory=list)  # ... times these factors
    # ... or, when the incumbent's capacity was bounded by one of a rule's limits, its values
    by_limit: list[_ByLimit] = Field(default_factory=list)


class _Hopeless(_Strict):
    """Values never worth a launch for some SLAs (``hopeless_when:``); see the README."""

    values: list[ParamValue] | None = None  # the parameter's value is one of these ...
    below: int | float | str | None = None  # ... or below a number or a measured quantity
    times: float = 1.0  # factor on a measured ``below``
    with_: dict[str, list[ParamValue] | _Not] = Field(default_factory=dict, alias="with")
    device: Device | None = None  # only on this device
    objective: Literal["throughput", "latency"] | None = None  # only for this first objective
    unless_objective: list[str] = Field(default_factory=list)  # not when one is an objective
    limited: list[str] = Field(default_factory=list)  # only when the SLA limits one of these
    why: str


class _Monotone(_Strict):
    """Which way the value worsens a limited quantity, all else equal (``monotone:``)."""

    limits: list[str]  # latency kinds (ttft, tpot, itl, e2e) or constraint metrics
    worse: Literal["higher", "lower"]
    why: str


class _Variant(_Strict):
    """Per-device changes to a declaration (``per_device: {cpu: {...}}``)."""

    low: int | float | None = None
    high: int | float | None = None
    log: bool | None = None
    step: int | float | None = None
    choices: list[ParamValue] | None = None
    fixed: ParamValue = None  # pinned on this device unless the SLA says otherwise
    prior: _Prior | None = None  # replaces the declaration's prior on this device


class _Limits(_Strict):
    """What the engine accepts for a number (inclusive; None: open): a fixed value, a
    widened range or a listed value must stay inside, wider than the search range."""

    low: int | float | None = None
    high: int | float | None = None


class _Decl(_Strict):
    name: str
    type: ParamType
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: list[ParamValue] | None = None
    default: ParamValue = None
    versions: str = ""
    devices: Literal["cpu", "gpu", "both"] = "both"
    per_device: dict[Device, _Variant] = Field(default_factory=dict)
    requires: list[_Requirement] = Field(default_factory=list)
    lossy: bool | list[ParamValue] = False
    when: dict[str, list[ParamValue] | _Not] = Field(default_factory=dict)
    superseded_by: str | None = None
    search: bool = True
    limits: _Limits | None = None
    why: str = ""
    prior: _Prior | None = None
    hopeless_when: list[_Hopeless] = Field(default_factory=list)
    monotone: list[_Monotone] = Field(default_factory=list)


class _File(_Strict):
    engine: str
    format: Literal[1]
    versions: str = ""
    params: list[_Decl]


# --------------------------------------------------------------------------- resolved space


@dataclass(frozen=True)
class Condition:
    """Active when ``param``'s value is in ``values`` (not in them when ``negate``)."""

    param: str
    values: tuple[ParamValue, ...]
    negate: bool = False

    def holds(self, value: ParamValue) -> bool:
        return _member(value, self.values) != self.negate

    def __str__(self) -> str:
        shown = ", ".join(_show(v) for v in self.values)
        return f"{self.param} {'not in' if self.negate else 'in'} [{shown}]"


@dataclass(frozen=True)
class Prior:
    """Where the warm start looks first for one parameter (evaluated by ``search.priors``).

    ``rank`` orders the parameters (1 first); ``first`` are values to try, in order;
    ``near`` names a quantity the baseline measured (``concurrency``) whose multiples by
    ``times`` are tried instead when it was measured.
    """

    rank: int
    first: tuple[ParamValue, ...] = ()
    near: str | None = None
    times: tuple[float, ...] = ()
    by_limit: tuple[ByLimit, ...] = ()  # directions by the limit that bounded the incumbent


@dataclass(frozen=True)
class ByLimit:
    """A prior's direction when the incumbent's capacity was bounded by one of ``limits``
    (:data:`BINDING`): its ``first`` values, or ``times`` on the prior's ``near``; ``why``."""

    limits: tuple[str, ...]
    first: tuple[ParamValue, ...]
    times: tuple[float, ...]
    why: str


@dataclass(frozen=True)
class Hopeless:
    """When a value of ``param`` is not worth a launch for an SLA, and ``why``.

    Every field given must hold (evaluated by ``search.priors``): the value is in ``values``
    or below ``below`` (a number, or a measured quantity times ``times``); the other params
    match ``with_``; the target is ``device``; the SLA's first objective is of the
    ``objective`` kind and none of ``unless_objective``; the SLA limits one of ``limited``.
    """

    param: str
    why: str
    values: tuple[ParamValue, ...] | None = None
    below: float | str | None = None
    times: float = 1.0
    with_: tuple[Condition, ...] = ()
    device: Device | None = None
    objective: str | None = None
    unless_objective: tuple[str, ...] = ()
    limited: tuple[str, ...] = ()


@dataclass(frozen=True)
class Monotone:
    """All else equal, moving ``param`` the ``worse`` way (``higher`` or ``lower``) never
    brings a quantity under one of ``limits`` (latency kinds or constraint metrics) at the
    same load: after a miss there, such a move is hopeless (``search.misses``)."""

    param: str
    limits: tuple[str, ...]
    worse: Literal["higher", "lower"]
    why: str


@dataclass(frozen=True)
class ParamSpec:
    """One tuned parameter in its effective form.

    ``choices`` set: a categorical search over them (ints, bools and strings alike); otherwise
    an int/float range ``[low, high]`` with optional ``log`` or ``step``. ``type`` is the
    value type declared in the file; ``default`` is the engine's (None: engine decides).
    """

    name: str
    type: ParamType
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: tuple[ParamValue, ...] | None = None
    default: ParamValue = None
    when: tuple[Condition, ...] = ()
    why: str = field(default="", compare=False)
    # Where to look first and what never to launch: search strategy, not the space itself
    # (left out of ``hash``, so a study keeps its identity when they change).
    prior: Prior | None = field(default=None, compare=False)
    hopeless: tuple[Hopeless, ...] = field(default=(), compare=False)
    monotone: tuple[Monotone, ...] = field(default=(), compare=False)

    def domain(self) -> str:
        if self.choices is not None:
            return "{" + ", ".join(_show(c) for c in self.choices) + "}"
        extra = " log" if self.log else (f" step {_show(self.step)}" if self.step else "")
        return f"[{_show(self.low)}, {_show(self.high)}]{extra}"


@dataclass(frozen=True)
class Dropped:
    """An option (``value`` unset) or one of its choices left out of the search, and why."""

    param: str
    reason: str
    value: ParamValue = None
    is_choice: bool = False


@dataclass(frozen=True, eq=False)
class SearchSpace:
    """A resolved search space; see the module docstring for the contract."""

    engine: str
    version: str
    device: Device
    params: list[ParamSpec]
    fixed: dict[str, ParamValue]
    dropped: list[Dropped] = field(default_factory=list)
    defaults: dict[str, ParamValue] = field(default_factory=dict)
    fixed_by: dict[str, str] = field(default_factory=dict)  # param -> "engine.params" | ...
    source: str = ""

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def value_of(self, name: str, suggested: Mapping[str, ParamValue]) -> ParamValue:
        """The effective value of ``name``: suggested, else fixed, else the declared default."""
        if name in suggested:
            return suggested[name]
        if name in self.fixed:
            return self.fixed[name]
        return self.defaults.get(name)

    def is_active(self, p: ParamSpec, suggested: Mapping[str, ParamValue]) -> bool:
        return all(c.holds(self.value_of(c.param, suggested)) for c in p.when)

    def suggest(
        self, trial: optuna.trial.BaseTrial, only: Collection[str] | None = None
    ) -> dict[str, ParamValue]:
        """Ask ``trial`` for every active tuned parameter (or only those in ``only``: the
        others are left to the engine); returns only the suggested ones."""
        values: dict[str, ParamValue] = {}
        for p in self.params:
            if (only is not None and p.name not in only) or not self.is_active(p, values):
                continue
            if p.choices is not None:
                values[p.name] = trial.suggest_categorical(p.name, list(p.choices))
            elif p.type == "int":
                assert p.low is not None and p.high is not None
                values[p.name] = trial.suggest_int(
                    p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log
                )
            else:
                assert p.low is not None and p.high is not None
                x = trial.suggest_float(p.name, float(p.low), float(p.high), step=p.step, log=p.log)
                # A stepped float comes back as 0.8500000000000001: pass the flag 0.85.
                values[p.name] = round(x, _decimals(p.step)) if p.step else x
        return values

    def candidate(self, suggested: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """What the engine gets: the fixed options, then the suggested ones."""
        return {**self.fixed, **suggested}

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """Optuna distributions of all tuned parameters (conditional ones included)."""
        from optuna.distributions import (
            BaseDistribution,
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        out: dict[str, BaseDistribution] = {}
        for p in self.params:
            if p.choices is not None:
                out[p.name] = CategoricalDistribution(list(p.choices))
            elif p.type == "int":
                assert p.low is not None and p.high is not None
                out[p.name] = IntDistribution(
                    int(p.low), int(p.high), log=p.log, step=int(p.step or 1)
                )
            else:
                assert p.low is not None and p.high is not None
                out[p.name] = FloatDistribution(float(p.low), float(p.high), log=p.log, step=p.step)
        return out

    def baseline(self) -> dict[str, ParamValue]:
        """The engine's defaults for this context: the fixed options and nothing tuned."""
        return dict(self.fixed)

    def hash(self) -> str:
        """sha256 of the effective space (tuned domains, conditions, fixed options).

        Notes and the engine version string are left out: the same space resolved for
        another patch release hashes the same, a changed range or pin does not.
        """
        payload = {
            "engine": self.engine,
            "device": self.device,
            "params": [
                {k: v for k, v in asdict(p).items() if k not in _NOT_HASHED} for p in self.params
            ],
            "fixed": self.fixed,
        }
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=repr)
        return hashlib.sha256(text.encode()).hexdigest()

    def describe(self) -> list[str]:
        """Human-readable lines: what is tuned, pinned and dropped, and why."""
        lines = [
            f"{self.engine} {self.version} on {self.device}: {len(self.params)} tuned, "
            f"{len(self.fixed)} fixed (space {self.hash()[:12]})"
        ]
        for p in self.params:
            cond = f" when {' and '.join(str(c) for c in p.when)}" if p.when else ""
            lines.append(f"  tune  {p.name}: {p.type} {p.domain()}{cond}")
        for name, value in self.fixed.items():
            by = self.fixed_by.get(name, "")
            lines.append(f"  fixed {name} = {_show(value)}" + (f" ({by})" if by else ""))
        # Choices dropped for the same reason share a line: "tensor_parallel_size=2, 4, 8: ...".
        grouped: dict[tuple[str, str, bool], list[ParamValue]] = {}
        for d in self.dropped:
            grouped.setdefault((d.param, d.reason, d.is_choice), []).append(d.value)
        for (param, reason, is_choice), values in grouped.items():
            what = f"{param}={', '.join(_show(v) for v in values)}" if is_choice else param
            lines.append(f"  drop  {what}: {reason}")
        return lines


# --------------------------------------------------------------------------- helpers

_NOT_HASHED = frozenset({"why", "prior", "hopeless", "monotone"})


def _show(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _decimals(step: float) -> int:
    exponent = Decimal(str(step)).normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _same(a: ParamValue, b: ParamValue) -> bool:
    """Equality that keeps True apart from 1 (YAML and Optuna both distinguish them)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _member(v: ParamValue, values: Iterable[ParamValue]) -> bool:
    return any(_same(v, x) for x in values)


def spaces_dir() -> Path:
    """The ``search_spaces`` folder: the repository's (a checkout or an editable install), else
    the copy a wheel carries inside the package."""
    package = Path(__file__).resolve().parent.parent
    repo = package.parent / "search_spaces"
    if repo.is_dir():
        return repo
    return package / "search_spaces"


def _read(path: Path) -> _File:
    """Parse and check one space file; problems name the file and line (``file:12: ...``)."""
    try:
        located = load_located(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise SpaceError([f"{path}: {e}"]) from e

    def at(key: KeyPath) -> str:
        line = located.line_of(key)
        return f"{path}:{line}" if line is not None else str(path)

    try:
        spec = _File.model_validate(located.data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            problems.append(f"{at(tuple(err['loc']))}: {loc}: {err['msg']}")
        raise SpaceError(problems) from e
    index = {d.name: ("params", i) for i, d in enumerate(spec.params)}
    problems = []
    for p in _check_file(spec):
        name = p.split(":", 1)[0].split(".")[1] if p.startswith("params.") else ""
        problems.append(f"{at(index.get(name, ()))}: {p}")
    problems += [f"{at(key)}: {p}" for key, p in _check_strategy(spec)]
    if problems:
        raise SpaceError(problems)
    return spec


@dataclass(frozen=True)
class DeclaredOptions:
    """The options one space file declares, as rules for the values an SLA may give them.

    ``file`` is where they come from, ``versions`` the releases it covers.
    """

    file: Path
    versions: str
    rules: dict[str, OptionRule]


def newest_declarations(engine: str, *, directory: Path | None = None) -> DeclaredOptions:
    """The declarations of ``engine``'s space for its newest releases: the file whose
    ``versions`` has no upper end (else the last by name).

    For checks made before the engine's version is known (``autotuner check``, a submission):
    types, limits and choices; whether the version in use has an option is decided by
    :func:`load_space` when tuning.
    """
    base = directory or spaces_dir()
    files = sorted({*base.glob(f"{engine}.yaml"), *base.glob(f"{engine}-*.yaml")})
    if not files:
        raise SpaceError([f"no search space for engine {engine!r} in {base}"])
    stamps = tuple((f, f.stat().st_mtime_ns) for f in files)
    return _newest(engine, stamps)


@functools.lru_cache(maxsize=8)
def _newest(engine: str, stamps: tuple[tuple[Path, int], ...]) -> DeclaredOptions:
    specs = [(f, _read(f)) for f, _ in stamps]
    open_ended = [(f, s) for f, s in specs if version_in((1_000_000,), s.versions)]
    file, spec = open_ended[-1] if open_ended else specs[-1]
    where = f"{file.parent.name}/{file.name}"
    rules = {d.name: _option_rule(d, where) for d in spec.params}
    return DeclaredOptions(file, spec.versions, rules)


def space_file(engine: str, version: str, *, directory: Path | None = None) -> Path:
    """The ``<engine>.yaml`` / ``<engine>-*.yaml`` file whose ``versions`` covers ``version``."""
    base = directory or spaces_dir()
    files = sorted({*base.glob(f"{engine}.yaml"), *base.glob(f"{engine}-*.yaml")})
    if not files:
        raise SpaceError([f"no search space for engine {engine!r} in {base}"])
    matching = [f for f in files if version_in(version, _read(f).versions)]
    if len(matching) != 1:
        found = ", ".join(f"{f.name} ({_read(f).versions or 'any'})" for f in files)
        what = "no search space covers" if not matching else "several search spaces cover"
        raise SpaceError([f"{what} {engine} {version}: {found}"])
    return matching[0]


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
            problems.append(f"{at}.default: {_show(d.default)} is not {_kind(d.type)}")
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
            out.append(("first", f"{_show(v)} is not {_kind(d.type)}"))
        elif choices is not None and not _member(v, choices):
            out.append(("first", f"{_show(v)} is not one of the choices"))
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
                out.append((at, f"{_show(v)} is not {_kind(d.type)}"))
    return out


def _check_hopeless(d: _Decl, h: _Hopeless, decls: Mapping[str, _Decl]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if not h.why.strip():
        out.append(("why", "say why these values are hopeless"))
    if (h.values is None) == (h.below is None):
        out.append(("values", "give either 'values' or 'below': which values are hopeless"))
    for v in h.values or []:
        if not _check_type(d.type, v):
            out.append(("values", f"{_show(v)} is not {_kind(d.type)}"))
    below = h.below
    if below is not None:
        if d.type not in ("int", "float"):
            out.append(("below", f"only numbers can be below a bound, not a {d.type}"))
        if isinstance(below, bool) or (isinstance(below, str) and below not in MEASURED):
            known = ", ".join(sorted(MEASURED))
            out.append(("below", f"{_show(below)} is neither a number nor measured ({known})"))
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
                out.append(("with", f"{other}: {_show(v)} is not {_kind(decls[other].type)}"))
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
        f"bound {_show(b)} is not {_kind(d.type)}"
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
        f"{_show(x)}, named in the file, is outside them"
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
            problems.append(f"choice {_show(c)} is not {_kind(d.type)}")
    if choices is not None and len(choices) != len({repr(c) for c in choices}):
        problems.append("choices repeat a value")
    for bound in (v.low, v.high):
        if bound is not None and not _check_type(d.type, bound):
            problems.append(f"bound {_show(bound)} is not {_kind(d.type)}")
    if v.low is not None and v.high is not None and v.low > v.high:
        problems.append(f"low ({v.low}) > high ({v.high})")
    if v.log and v.low is not None and v.low <= 0:
        problems.append("a log range needs low > 0")
    if v.log and v.step is not None:
        problems.append("'log' and 'step' exclude each other")
    return problems


# --------------------------------------------------------------------------- resolution


@dataclass
class _Context:
    version: tuple[int, ...]
    version_text: str
    device: Device
    gpu_count: int
    compute_capability: tuple[int, int] | None
    cpu_flags: frozenset[str] | None
    allow_lossy: bool


def _parse_cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def _unmet(req: _Requirement, value: ParamValue, ctx: _Context) -> str | None:
    """Why ``value`` can't run on this hardware under ``req``; None when it can (or unknown)."""
    if req.values is not None and not _member(value, req.values):
        return None
    if (
        req.at_most_gpus
        and ctx.device == "gpu"
        and isinstance(value, int)
        and value > max(ctx.gpu_count, 1)
    ):
        return f"more than the target's {ctx.gpu_count} GPU(s)"
    if ctx.device == "gpu" and req.compute_capability and ctx.compute_capability is not None:
        need = _parse_cc(req.compute_capability)
        if ctx.compute_capability < need:
            have = ".".join(map(str, ctx.compute_capability))
            return f"needs compute capability >= {req.compute_capability} (have {have})"
    if (
        ctx.device == "cpu"
        and req.cpu_flags_any
        and ctx.cpu_flags is not None
        and not set(req.cpu_flags_any) & ctx.cpu_flags
    ):
        return f"needs one of the CPU flags {', '.join(req.cpu_flags_any)}"
    return None


def _outside_limits(d: _Decl, value: ParamValue) -> str | None:
    """Why a number the SLA gives is outside what the engine accepts (None: inside)."""
    if d.limits is None or not isinstance(value, int | float) or isinstance(value, bool):
        return None
    return _option_rule(d).problem(value)


def _is_lossy(d: _Decl, value: ParamValue) -> bool:
    if isinstance(d.lossy, bool):
        return d.lossy
    return _member(value, d.lossy)


def _merged(d: _Decl, device: Device) -> tuple[_Decl, ParamValue, bool]:
    """The declaration with its per-device variant applied, the device pin, and if pinned."""
    v = d.per_device.get(device)
    if v is None:
        return d, None, False
    update: dict[str, Any] = {
        k: getattr(v, k)
        for k in ("low", "high", "log", "step", "choices", "prior")
        if k in v.model_fields_set
    }
    return d.model_copy(update=update), v.fixed, "fixed" in v.model_fields_set


def _available(d: _Decl, ctx: _Context) -> bool:
    return version_in(ctx.version, d.versions) and d.devices in ("both", ctx.device)


class _Resolver:
    """Turns a file + context + overrides into a SearchSpace, collecting problems."""

    def __init__(
        self,
        spec: _File,
        ctx: _Context,
        overrides: Mapping[str, ParamOverride],
        engine_params: Mapping[str, ParamValue],
    ) -> None:
        self.spec = spec
        self.ctx = ctx
        self.overrides = overrides
        self.engine_params = engine_params
        self.decls = {d.name: d for d in spec.params}
        self.problems: list[str] = []
        self.params: list[ParamSpec] = []
        self.fixed: dict[str, ParamValue] = dict(engine_params)
        self.fixed_by: dict[str, str] = dict.fromkeys(engine_params, "engine.params")
        self.dropped: list[Dropped] = []
        self.static: dict[str, ParamValue] = {}  # values of untuned params, for conditions

    def run(self) -> None:
        for name in self.overrides:
            if name not in self.decls:
                close = difflib.get_close_matches(name, list(self.decls), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.problems.append(f"search.{name}: not a parameter of the space{hint}")
            elif name in self.engine_params:
                self.problems.append(
                    f"search.{name}: also set in engine.params; give it in one place only"
                )
        for d in self.spec.params:
            self._resolve(d)

    def _drop(self, d: _Decl, reason: str) -> None:
        self.dropped.append(Dropped(d.name, reason))
        self.static.setdefault(d.name, d.default)

    def _pin(self, d: _Decl, value: ParamValue, by: str) -> None:
        self.fixed[d.name] = value
        self.fixed_by[d.name] = by
        self.static[d.name] = value

    def _resolve(self, d: _Decl) -> None:
        ctx = self.ctx
        ov = self.overrides.get(d.name, ParamOverride())
        at = f"search.{d.name}"
        if d.name in self.engine_params:  # already in fixed, as the SLA gave it
            self.static[d.name] = self.engine_params[d.name]
            return
        if not version_in(ctx.version, d.versions):
            if ov.is_fixed or ov.searches:
                self.problems.append(
                    f"{at}: {ctx.version_text} has no such option (needs {d.versions})"
                )
            self._drop(d, f"needs {self.spec.engine} {d.versions} (have {ctx.version_text})")
            return
        if ov.exclude:
            self._drop(d, "excluded by the SLA (the engine decides)")
            return
        if ov.is_fixed:
            self._resolve_fixed(d, ov.fixed, at)
            return
        eff, pin, pinned = _merged(d, ctx.device)
        if d.devices not in ("both", ctx.device):
            if ov.searches:
                self.problems.append(
                    f"{at}: not searched on {ctx.device} ({d.devices} only); use 'fixed'"
                )
            self._drop(d, f"{d.devices} only")
            return
        if pinned and not ov.searches:
            self._pin(d, pin, f"pinned on {ctx.device}")
            return
        # One knob per effect: where the newer option exists, the older one is not searched
        # (searching both would mostly repeat configurations), unless the SLA asks for it.
        sup = self.decls.get(d.superseded_by or "")
        if sup is not None and _available(sup, ctx) and not ov.searches:
            self._drop(d, f"superseded by {sup.name} in this version")
            return
        if not d.search and not ov.searches:
            self._drop(d, "off by default (the SLA's search: section can switch it on)")
            return
        spec = self._domain(eff, ov, at)
        if spec is None:
            return
        self._place(d, spec)

    def _resolve_fixed(self, d: _Decl, value: ParamValue, at: str) -> None:
        if not _check_type(d.type, value):
            self.problems.append(f"{at}.fixed: {_show(value)} is not {_kind(d.type)}")
            return
        if (why := _outside_limits(d, value)) is not None:
            self.problems.append(f"{at}.fixed: {why}")
            return
        if _is_lossy(d, value) and not self.ctx.allow_lossy:
            self.problems.append(
                f"{at}.fixed: {_show(value)} changes outputs; set search.allow_lossy: true"
            )
            return
        for req in d.requires:
            why = _unmet(req, value, self.ctx)
            if why is not None:
                self.problems.append(f"{at}.fixed: {_show(value)} {why}")
                return
        self._pin(d, value, "SLA search")

    def _domain(self, d: _Decl, ov: ParamOverride, at: str) -> ParamSpec | None:
        """The effective domain after the override and hardware/lossy filtering."""
        ctx = self.ctx
        choices: list[ParamValue] | None
        if ov.values is not None:
            bad = [v for v in ov.values if not _check_type(d.type, v)]
            if bad:
                self.problems.append(f"{at}.values: {_show(bad[0])} is not {_kind(d.type)}")
                return None
            outside = [w for v in ov.values if (w := _outside_limits(d, v)) is not None]
            if outside:
                self.problems.append(f"{at}.values: {outside[0]}")
                return None
            lossy = [v for v in ov.values if _is_lossy(d, v)]
            if lossy and not ctx.allow_lossy:
                self.problems.append(
                    f"{at}.values: {_show(lossy[0])} changes outputs; set search.allow_lossy: true"
                )
                return None
            choices = list(ov.values)
        elif d.type == "bool":
            choices = d.choices if d.choices is not None else [False, True]
        else:
            choices = d.choices
        low, high, log = d.low, d.high, d.log
        if choices is not None and any(x is not None for x in (ov.low, ov.high, ov.log)):
            self.problems.append(f"{at}: has a set of choices; narrow it with 'values'")
            return None
        if choices is None:
            for name, bound in (("low", ov.low), ("high", ov.high)):
                if bound is not None and not _check_type(d.type, bound):
                    self.problems.append(f"{at}.{name}: {_show(bound)} is not {_kind(d.type)}")
                    return None
            low = ov.low if ov.low is not None else low
            high = ov.high if ov.high is not None else high
            log = ov.log if ov.log is not None else log
            assert low is not None and high is not None
            if low > high:
                self.problems.append(f"{at}: low ({_show(low)}) > high ({_show(high)})")
                return None
            if log and low <= 0:
                self.problems.append(f"{at}: a log range needs low > 0")
                return None
            for name, bound in (("low", ov.low), ("high", ov.high)):
                if bound is not None and (why := _outside_limits(d, bound)) is not None:
                    self.problems.append(f"{at}.{name}: {why}")
                    return None
        else:
            kept: list[ParamValue] = []
            for c in choices:
                reason = next(
                    (r for req in d.requires if (r := _unmet(req, c, ctx)) is not None), None
                )
                if reason is None and _is_lossy(d, c) and not ctx.allow_lossy:
                    reason = "changes outputs (lossy); allow with search.allow_lossy: true"
                if reason is None:
                    kept.append(c)
                else:
                    self.dropped.append(Dropped(d.name, reason, c, is_choice=True))
            choices = kept
            if not choices:
                self._drop(d, "no value left to search")
                return None
        step = None if log else d.step
        return ParamSpec(
            name=d.name,
            type=d.type,
            low=None if choices is not None else low,
            high=None if choices is not None else high,
            log=bool(log) if choices is None else False,
            step=step if choices is None else None,
            choices=tuple(choices) if choices is not None else None,
            default=d.default,
            why=" ".join(d.why.split()),
            prior=_prior(d.prior),
            hopeless=tuple(_hopeless(d.name, h) for h in d.hopeless_when),
            monotone=tuple(
                Monotone(d.name, tuple(m.limits), m.worse, " ".join(m.why.split()))
                for m in d.monotone
            ),
        )

    def _place(self, d: _Decl, spec: ParamSpec) -> None:
        """Single-valued domains become pins (or drops); static conditions are decided."""
        single: list[ParamValue] | None = None
        if spec.choices is not None and len(spec.choices) == 1:
            single = [spec.choices[0]]
        elif spec.choices is None and spec.low == spec.high:
            single = [spec.low]
        if single is not None:
            if _same(single[0], d.default):
                self._drop(d, f"only the default ({_show(d.default)}) remains")
            else:
                self._pin(d, single[0], "only value left")
            return
        tuned = {p.name for p in self.params}
        dynamic: list[Condition] = []
        for parent, rule in d.when.items():
            negate = isinstance(rule, _Not)
            vals = tuple(rule.not_ if isinstance(rule, _Not) else rule)
            cond = Condition(parent, vals, negate)
            if parent in tuned:
                dynamic.append(cond)
            elif not cond.holds(self.static.get(parent, self.decls[parent].default)):
                value = self.static.get(parent, self.decls[parent].default)
                self._drop(d, f"inactive: {parent} is {_show(value)}")
                return
        self.params.append(
            ParamSpec(
                name=spec.name,
                type=spec.type,
                low=spec.low,
                high=spec.high,
                log=spec.log,
                step=spec.step,
                choices=spec.choices,
                default=spec.default,
                when=tuple(dynamic),
                why=spec.why,
                prior=spec.prior,
                hopeless=spec.hopeless,
                monotone=spec.monotone,
            )
        )


def _condition(parent: str, rule: list[ParamValue] | _Not) -> Condition:
    if isinstance(rule, _Not):
        return Condition(parent, tuple(rule.not_), negate=True)
    return Condition(parent, tuple(rule))


def _prior(p: _Prior | None) -> Prior | None:
    if p is None or p.rank is None:
        return None
    by_limit = tuple(
        ByLimit(tuple(b.limits), tuple(b.first), tuple(b.times), " ".join(b.why.split()))
        for b in p.by_limit
    )
    return Prior(p.rank, tuple(p.first), p.near, tuple(p.times), by_limit)


def _hopeless(param: str, h: _Hopeless) -> Hopeless:
    return Hopeless(
        param=param,
        why=" ".join(h.why.split()),
        values=tuple(h.values) if h.values is not None else None,
        below=h.below,
        times=h.times,
        with_=tuple(_condition(k, r) for k, r in h.with_.items()),
        device=h.device,
        objective=h.objective,
        unless_objective=tuple(h.unless_objective),
        limited=tuple(h.limited),
    )


def load_space(
    engine: str,
    version: str,
    *,
    device: Device,
    gpu_count: int,
    compute_capability: tuple[int, int] | None,
    allow_lossy: bool,
    overrides: Mapping[str, ParamOverride],
    engine_params: Mapping[str, ParamValue] | None = None,
    cpu_flags: Collection[str] | None = None,
    path: Path | None = None,
) -> SearchSpace:
    """Resolve the engine's search space for one context.

    ``version`` is the engine's version text (``"0.32.0"``, ``"vllm 0.32.0 (cpu)"``).
    ``compute_capability`` / ``cpu_flags`` None mean unknown: nothing is dropped for them.
    ``engine_params`` are the SLA's fixed options: passed as they are (also options the space
    does not declare, e.g. ``max_model_len``) and never tuned. ``path`` picks a file instead
    of ``search_spaces/<engine>*.yaml``. Raises :class:`SpaceError` listing every problem
    (unknown override names, values of the wrong type, lossy values without ``allow_lossy``,
    options the version lacks, ...).
    """
    try:
        parsed = parse_version(version)
    except ValueError as e:
        raise SpaceError([str(e)]) from e
    file = path or space_file(engine, version)
    spec = _read(file)
    if spec.engine != engine:
        raise SpaceError([f"{file}: declares engine {spec.engine!r}, not {engine!r}"])
    if not version_in(parsed, spec.versions):
        raise SpaceError([f"{file} covers {engine} {spec.versions}, not {version}"])
    ctx = _Context(
        version=parsed,
        version_text=_version_number(version),
        device=device,
        gpu_count=gpu_count,
        compute_capability=compute_capability,
        cpu_flags=frozenset(cpu_flags) if cpu_flags is not None else None,
        allow_lossy=allow_lossy,
    )
    r = _Resolver(spec, ctx, overrides, dict(engine_params or {}))
    r.run()
    if r.problems:
        raise SpaceError(r.problems)
    return SearchSpace(
        engine=engine,
        version=version,
        device=device,
        params=r.params,
        fixed=r.fixed,
        dropped=r.dropped,
        defaults={d.name: d.default for d in spec.params},
        fixed_by=r.fixed_by,
        source=str(file),
    )


def load_space_for(
    engine: str,
    version: str,
    hardware: HardwareProfile,
    *,
    allow_lossy: bool,
    overrides: Mapping[str, ParamOverride],
    engine_params: Mapping[str, ParamValue] | None = None,
) -> SearchSpace:
    """:func:`load_space` with the device facts taken from a ``HardwareProfile``."""
    return load_space(
        engine,
        version,
        device=hardware.device,
        gpu_count=hardware.gpu_count,
        compute_capability=hardware.compute_capability,
        allow_lossy=allow_lossy,
        overrides=overrides,
        engine_params=engine_params,
        cpu_flags=hardware.cpu.flags,
    )
