"""The SLA file: what to serve, on what, under which load, and what "good" means.

Users write YAML (see ``objectives/README.md``); ``load_sla`` turns it into a validated ``Sla``
or raises ``SlaError`` listing every problem at once, each with its line number, dotted field
path and a message meant for humans::

    slo.yaml:12: constraints.p99_ttf_ms: unknown key (did you mean 'p99_ttft_ms'?)

This module is also the single source of truth for metric names (``SCALAR_METRICS``,
``PERCENTILE_METRIC_RE``, ``is_known_metric``) shared by the evaluator and the reports.

Errors are raised from validators as ``PydanticCustomError("sla", "{msg}", ctx)``; ``ctx["at"]``
is a sub-path below the validator's own location and ``ctx["more"]`` carries further
``(message, at)`` problems found by the same validator, so one validator can report several.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from autotuner.core.errors import BadInput
from autotuner.core.yamlpos import KeyPath, Located, load_located
from autotuner.engines import registry
from autotuner.engines.base import OptionRoles
from autotuner.sla.quality import QualitySpec
from autotuner.space import SearchSpec

# --------------------------------------------------------------------------- metric names

LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")

SCALAR_METRICS: frozenset[str] = frozenset(
    {
        "capacity",  # the highest arrival rate (or concurrency) that meets the SLA
        "capacity_per_gpu",  # capacity / GPUs of the layout (tensor x pipeline x data parallel)
        "goodput",
        "request_rate",
        "output_tokens_per_s",
        "total_tokens_per_s",
        "error_rate",
        "peak_memory_gib",
        *(f"mean_{m}_ms" for m in LATENCY_METRICS),
    }
)

# p<q>_<latency>_ms with q written as digits, optionally with a fraction: p50, p99, p99.9.
PERCENTILE_METRIC_RE = re.compile(r"^p(?P<q>\d+(?:\.\d+)?)_(?P<base>ttft|tpot|itl|e2e)_ms\Z")

# Shapes that look like a percentile key, to give a precise message when a part is wrong.
_PERCENTILE_SHAPE_RE = re.compile(r"^p(?P<q>\d+(?:\.\d+)?)_(?P<base>[a-z0-9]+)_ms\Z")

_COMMON_PERCENTILES = ("50", "90", "95", "99", "99.9")

# The finest percentile is p99.999: a finer one (p99.99999999999) needs more requests per level
# than any load level sends, and more than the confidence bounds can be computed for.
MAX_PERCENTILE_DECIMALS = 3

DEFAULT_DATASET_OUTPUT_TOKENS = 128
"""Output length for dataset rows that carry no ``output_tokens`` of their own."""


def _canonical_q(q: str) -> str:
    """``"99.0"`` -> ``"99"``, ``"099"`` -> ``"99"``; the spelling used in metric names."""
    text = format(Decimal(q), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def percentile_problem(q: str) -> str | None:
    """Why the ``q`` of ``p<q>_..._ms`` is no percentile a run can measure (None: it is one):
    outside (0, 100], or more than ``MAX_PERCENTILE_DECIMALS`` decimals."""
    if not 0 < Decimal(q) <= 100:
        return f"percentile must be in (0, 100], got {_canonical_q(q)}"
    decimals = len(_canonical_q(q).partition(".")[2])
    if decimals > MAX_PERCENTILE_DECIMALS:
        return (
            f"percentile {_canonical_q(q)} has {decimals} decimals; at most "
            f"{MAX_PERCENTILE_DECIMALS} (p50 to p99.999): a finer one needs more requests per "
            "load level than a run can send"
        )
    return None


def parse_percentile_metric(name: str) -> tuple[float, str] | None:
    """``"p99.9_ttft_ms"`` -> ``(99.9, "ttft")``; None unless a valid percentile metric
    (``percentile_problem``: 0 < q <= 100, at most three decimals)."""
    m = PERCENTILE_METRIC_RE.match(name)
    if m is None or percentile_problem(m["q"]) is not None:
        return None
    q = float(m["q"])
    if not 0 < q <= 100:
        return None
    return q, m["base"]


def canonical_metric(name: str) -> str | None:
    """The canonical spelling of a known metric (``p99.0_ttft_ms`` -> ``p99_ttft_ms``)."""
    if name in SCALAR_METRICS:
        return name
    m = PERCENTILE_METRIC_RE.match(name)
    if m is None or parse_percentile_metric(name) is None:
        return None
    return f"p{_canonical_q(m['q'])}_{m['base']}_ms"


def is_known_metric(name: str) -> bool:
    """True for scalar metrics and for ``p<q>_<ttft|tpot|itl|e2e>_ms`` with 0 < q <= 100 and
    at most three decimals."""
    return canonical_metric(name) is not None


def _metric_vocabulary() -> list[str]:
    pct = [f"p{q}_{m}_ms" for q in _COMMON_PERCENTILES for m in LATENCY_METRICS]
    return sorted(SCALAR_METRICS) + pct


# --------------------------------------------------------------------------- error helpers


def _fail(message: str, *at: str | int, more: Sequence[tuple[str, KeyPath]] = ()) -> Exception:
    """A validation error whose location is the validator's own plus ``at``."""
    return PydanticCustomError("sla", "{msg}", {"msg": message, "at": at, "more": list(more)})


def _fail_all(problems: Sequence[tuple[str, KeyPath]]) -> Exception:
    """One error carrying several ``(message, at)`` problems (see the module docstring)."""
    (message, at), rest = problems[0], problems[1:]
    return _fail(message, *at, more=rest)


def _show(value: Any) -> str:
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


def _bound(value: Any) -> str:
    """A limit from a pydantic error context: ``0.0`` reads better as ``0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# Bounds that no real SLA reaches, so that a typo (or hostile input) fails here and not as a
# hang or an overflow in the middle of a run.
MAX_TOKENS = 10_000_000
MAX_SECONDS = 7 * 24 * 3600.0
MAX_REQUESTS = 10_000_000

# What one launch may cost, checked before anything runs (objectives/README.md, "Bounds"). A
# load level sends its requests within MAX_LEVEL_S (its planned duration, see
# ``planned_level``; the first level, at the SLA's own rate, is the longest) and keeps at most
# MAX_LEVEL_REQUESTS requests with their timings in memory.
MAX_LEVEL_S = 3600.0
MAX_LEVEL_REQUESTS = 100_000
MAX_WARMUP_REQUESTS = 1_000
MAX_CONCURRENCY = 10_000  # a closed loop's requests in flight: a task and a connection each
MIN_RATE = 0.001  # req/s, and a trace's replay speed: a level's duration divides by it
MAX_REQUEST_TIMEOUT_S = 3600.0  # also the longest a level waits for its last requests
MAX_STARTUP_S = 6 * 3600.0  # an engine start that never answers holds its devices this long
MAX_TURNS = 1_000  # turns of one conversation, each resending the whole history
MAX_GRID_POINTS = 10_000  # launches of a grid study; Optuna lists every point in memory

# Validation context key: {id(input dict): allowed field names}, filled by _Strict so that
# "unknown key" errors can suggest the closest field of the right model.
_HINTS = "sla_field_hints"


class _Strict(BaseModel):
    """Base of every SLA model: unknown keys are errors, no silent type coercion."""

    # No inf or NaN anywhere: `duration_s: .inf` would hold a GPU lease forever, a NaN limit
    # compares false with everything.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _remember_fields(cls, data: Any, info: ValidationInfo) -> Any:
        hints = info.context.get(_HINTS) if isinstance(info.context, dict) else None
        if isinstance(hints, dict) and isinstance(data, dict):
            hints[id(data)] = tuple(cls.model_fields)
        return data


# --------------------------------------------------------------------------- model

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_SYNTH_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*\Z")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_PARAM_RE = re.compile(r"^[a-z][a-z0-9_]*\Z")


class ModelSpec(_Strict):
    """Exactly one of ``path`` (a local HF-style directory) or ``synth`` (a generated arch)."""

    path: str | None = None
    synth: str | None = None
    served_name: str | None = None

    @field_validator("synth")
    @classmethod
    def _synth_name(cls, v: str | None) -> str | None:
        if v is not None and not _SYNTH_RE.match(v):
            raise _fail(
                f"must be lower-case letters, digits, '.' and '-' (e.g. tiny-llama), got {v!r}"
            )
        return v

    @field_validator("path", "served_name")
    @classmethod
    def _not_empty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise _fail("must not be empty")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.path is None) == (self.synth is None):
            raise _fail("give exactly one of 'path' or 'synth'")
        from autotuner.models.synth import ARCHS

        if self.synth is not None and self.synth not in ARCHS:
            v, known = self.synth, ", ".join(ARCHS)
            raise _fail(
                f"unknown architecture {v!r}{_suggest(v, list(ARCHS))}; known: {known}", "synth"
            )
        return self


# --------------------------------------------------------------------------- engine


def _cli_word(value: Any) -> str:
    # YAML turns `--max-num-seqs, 64` into a str and an int; both belong on a command line.
    if isinstance(value, str):
        return value
    if _is_number(value):
        return str(value)
    raise _fail(f"must be a string, got {_show(value)}")


def _env_key(value: Any) -> str:
    if not isinstance(value, str) or not _ENV_RE.match(value):
        raise _fail(
            f"invalid environment variable name {_show(value)} "
            "(letters, digits and '_', not starting with a digit)"
        )
    return value


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        raise _fail(f"must be a string, got {_show(value)} (quote it: '{_show(value)}')")
    if isinstance(value, str):
        return value
    if _is_number(value):
        return str(value)
    raise _fail(f"must be a string, got {_show(value)}")


def _reserved_params() -> dict[str, str]:
    """Options the tuner sets itself (model, bind address, port), by any engine's adapter."""
    out: dict[str, str] = {}
    for adapter in registry.adapters():
        out.update(adapter.reserved_params)
    return out


def _engine_kind(value: Any) -> str:
    kinds = registry.kinds()
    if isinstance(value, str) and value in kinds:
        return value
    if len(kinds) == 1:
        raise _fail(f"must be {kinds[0]!r}, got {_show(value)}")
    raise _fail(f"must be one of {', '.join(kinds)}, got {_show(value)}")


def _param_key(value: Any) -> str:
    if not isinstance(value, str) or not _PARAM_RE.match(value):
        hint = ""
        if isinstance(value, str):
            fixed = value.strip().lstrip("-").replace("-", "_").lower()
            if _PARAM_RE.match(fixed):
                hint = f" (did you mean {fixed!r}?)"
        raise _fail(f"option names are snake_case like max_num_seqs, got {_show(value)}{hint}")
    reserved = _reserved_params()
    if value in reserved:
        raise _fail(f"cannot be set here: {reserved[value]}")
    return value


def _param_value(value: Any) -> bool | int | float | str:
    if isinstance(value, bool | int | float | str):
        return value
    raise _fail(f"must be true/false, a number or a string, got {_show(value)}")


CliWord = Annotated[str, PlainValidator(_cli_word)]
EngineKind = Annotated[str, PlainValidator(_engine_kind)]
EnvKey = Annotated[str, PlainValidator(_env_key)]
EnvValue = Annotated[str, PlainValidator(_env_value)]
ParamKey = Annotated[str, PlainValidator(_param_key)]
ParamValue = Annotated[bool | int | float | str, PlainValidator(_param_value)]


class EngineSpec(_Strict):
    """Which engine runs the model, and the fixed (untuned) part of its configuration.

    ``params`` are engine options in snake_case (vLLM's ``--max-num-seqs`` is ``max_num_seqs``);
    the search space tunes the others. ``name`` picks a registered engine environment,
    ``python`` an explicit interpreter; with neither, the default environment is used.
    """

    kind: EngineKind = Field(default_factory=registry.default_kind)
    name: str | None = None
    python: str | None = None
    args: list[CliWord] = Field(default_factory=list)
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict)
    params: dict[ParamKey, ParamValue] = Field(default_factory=dict)
    startup_timeout_s: float = Field(default=900.0, gt=0, le=MAX_STARTUP_S)

    @field_validator("name")
    @classmethod
    def _engine_name(cls, v: str | None) -> str | None:
        if v is not None and not _NAME_RE.match(v):
            raise _fail(f"not a valid engine name: {v!r}")
        return v

    @field_validator("python")
    @classmethod
    def _python_path(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise _fail("must not be empty")
        return v

    @model_validator(mode="after")
    def _one_environment(self) -> EngineSpec:
        if self.name is not None and self.python is not None:
            raise _fail("give at most one of 'name' or 'python'")
        return self

    @model_validator(mode="after")
    def _allowed(self) -> EngineSpec:
        # The engine runs as our user: only allow-listed options and variables reach it.
        from autotuner.sla import allowed

        problems = allowed.engine_problems(self.kind, self.params, self.args, self.env)
        if problems:
            raise _fail_all(problems)
        return self

    def settings(self) -> dict[str, bool | int | float | str]:
        """The options this SLA fixes, merged: ``params``, then those ``args`` sets (the one
        merge every launch, check and deploy file uses: sla.allowed.engine_settings)."""
        from autotuner.sla import allowed

        return allowed.engine_settings(self.kind, self.params, self.args)


# --------------------------------------------------------------------------- target


_GPU_KEYS = ("gpu", "gpus")
MAX_GPUS = 64  # a GPU count beyond any one host


class Target(_Strict):
    """Where the engine runs. YAML: ``cpu``, ``{gpu: 0}``, ``{gpu: "GPU-..."}``, ``{gpu: [0, 1]}``;
    ``gpus`` is the same key (``{gpus: [0, 1]}``) and also takes a count (``{gpus: 4}``: GPUs
    0 to 3). Every device of the target is leased as a whole, for each trial.

    ``devices`` are GPU indices or UUIDs as strings (empty for CPU).
    """

    kind: Literal["cpu", "gpu"] = "cpu"
    devices: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if data == "cpu":
            return {"kind": "cpu", "devices": []}
        if not isinstance(data, dict):
            if isinstance(data, Target):
                return data
            raise _fail(f"must be 'cpu' or a mapping like {{gpu: 0}}, got {_show(data)}")
        if not data or "kind" in data:  # Target() itself, or the model_dump() form
            return data
        problems: list[tuple[str, KeyPath]] = [
            (f"unknown key{_suggest(str(k), list(_GPU_KEYS))}", (str(k),))
            for k in data
            if k not in _GPU_KEYS
        ]
        keys = [k for k in _GPU_KEYS if k in data]
        if len(keys) != 1:
            problems.append(("must be 'cpu' or a mapping like {gpu: 0} or {gpus: [0, 1]}", ()))
            raise _fail_all(problems)
        (key,) = keys
        raw = data[key]
        items: list[tuple[Any, KeyPath]]
        if key == "gpus" and isinstance(raw, int) and not isinstance(raw, bool):
            # A count: the first N GPUs of the host, leased together.
            if not 1 <= raw <= MAX_GPUS:
                problems.append((f"a GPU count must be 1 to {MAX_GPUS}, got {raw}", (key,)))
                raise _fail_all(problems)
            raw = list(range(raw))
        if isinstance(raw, list):
            items = [(v, (key, i)) for i, v in enumerate(raw)]
            if not raw:
                problems.append(("list of GPUs must not be empty", (key,)))
        else:
            items = [(raw, (key,))]
        devices: list[str] = []
        for value, at in items:
            dev = _device(value)
            if dev is None:
                problems.append(
                    (f"must be a GPU index (0, 1, ...) or UUID, got {_show(value)}", at)
                )
            elif dev in devices:
                problems.append((f"GPU {dev} is listed twice", at))
            else:
                devices.append(dev)
        if problems:
            raise _fail_all(problems)
        return {"kind": "gpu", "devices": devices}

    @model_validator(mode="after")
    def _consistent(self) -> Target:
        if self.kind == "cpu" and self.devices:
            raise _fail("a cpu target has no devices", "devices")
        if self.kind == "gpu" and not self.devices:
            raise _fail("list of GPUs must not be empty", "devices")
        if len(set(self.devices)) != len(self.devices):
            raise _fail("a GPU is listed twice", "devices")
        return self

    def to_yaml_value(self) -> Any:
        """The short form users write (``cpu`` / ``{gpu: 0}`` / ``{gpu: [0, 1]}``)."""
        if self.kind == "cpu":
            return "cpu"
        devs: list[int | str] = [int(d) if d.isdigit() else d for d in self.devices]
        return {"gpu": devs[0] if len(devs) == 1 else devs}


def _device(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value) if value >= 0 else None
    if isinstance(value, str) and value.strip() and not any(c.isspace() or c == "," for c in value):
        return value
    return None


# --------------------------------------------------------------------------- workload


class UniformDist(_Strict):
    """Token counts drawn uniformly from ``[min, max]``."""

    distribution: Literal["uniform"]
    min: int = Field(ge=1, le=MAX_TOKENS)
    max: int = Field(ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> UniformDist:
        if self.max < self.min:
            raise _fail(f"must be >= min ({self.min}), got {self.max}", "max")
        return self


class _ShapedDist(_Strict):
    """A bell-shaped distribution of the token count, rounded and clipped to ``[min, max]``.

    ``mean`` and ``stddev`` describe the token count itself (not its logarithm).
    """

    mean: float = Field(gt=0, le=MAX_TOKENS)
    stddev: float = Field(ge=0, le=MAX_TOKENS)
    min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> _ShapedDist:
        if self.max is not None and self.max < self.min:
            raise _fail(f"must be >= min ({self.min}), got {self.max}", "max")
        hi = "" if self.max is None else f" and max ({self.max})"
        if self.mean < self.min or (self.max is not None and self.mean > self.max):
            raise _fail(f"must lie between min ({self.min}){hi}, got {_show(self.mean)}", "mean")
        return self


class NormalDist(_ShapedDist):
    distribution: Literal["normal"]


class LognormalDist(_ShapedDist):
    distribution: Literal["lognormal"]


Distribution = UniformDist | NormalDist | LognormalDist

_COUNT_TAG = "count"  # internal tag of a plain integer, hidden from messages


def _token_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        tag = value.get("distribution")
        return tag if isinstance(tag, str) else None
    if isinstance(value, UniformDist | NormalDist | LognormalDist):
        return value.distribution
    return _COUNT_TAG


TokenCount = Annotated[
    Annotated[Annotated[int, Field(ge=1, le=MAX_TOKENS)], Tag(_COUNT_TAG)]
    | Annotated[UniformDist, Tag("uniform")]
    | Annotated[NormalDist, Tag("normal")]
    | Annotated[LognormalDist, Tag("lognormal")],
    Discriminator(_token_tag),
]
"""A fixed token count (int >= 1) or a distribution mapping."""


class PoissonArrival(_Strict):
    """Open loop: exponential gaps, ``rate`` requests per second on average."""

    process: Literal["poisson"]
    rate: float = Field(ge=MIN_RATE)


class ConstantArrival(_Strict):
    """Open loop: one request every ``1/rate`` seconds."""

    process: Literal["constant"]
    rate: float = Field(ge=MIN_RATE)


class ConcurrencyArrival(_Strict):
    """Closed loop: keep ``concurrency`` requests in flight."""

    process: Literal["concurrency"]
    concurrency: int = Field(ge=1, le=MAX_CONCURRENCY)


class TraceArrival(_Strict):
    """Open loop: the times of ``workload.trace``, replayed ``speed`` times as fast."""

    process: Literal["trace"]
    speed: float = Field(default=1.0, ge=MIN_RATE, le=1e6)


Arrival = Annotated[
    PoissonArrival | ConstantArrival | ConcurrencyArrival | TraceArrival,
    Field(discriminator="process"),
]


class SharedPrefix(_Strict):
    """Synthetic system prompts: every request starts with ``tokens`` tokens of one; ``share``
    of the requests use one of ``prompts`` shared ones, the rest one of their own (so the
    prompt lengths do not depend on the share)."""

    prompts: int = Field(ge=1, le=MAX_REQUESTS)
    tokens: int = Field(ge=1, le=MAX_TOKENS)
    share: float = Field(ge=0, le=1)


class Conversation(_Strict):
    """Multi-turn chats: each conversation sends ``turns`` requests, each later one resending
    the history (earlier prompts and answers) plus a new user message, ``think_time_s`` after
    the previous answer arrived. The arrival rate stays requests per second: conversations
    start at ``rate / turns``."""

    turns: int = Field(ge=1, le=MAX_TURNS)
    think_time_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS)


class Workload(_Strict):
    """The load test: what requests look like, how they arrive, and how long it runs.

    With a ``dataset``, a row's own ``output_tokens`` wins, then its reply's length, then
    ``output_tokens`` here, then ``DEFAULT_DATASET_OUTPUT_TOKENS``. A ``trace`` gives every
    request's lengths and arrival time (``arrival: {process: trace}``). The run stops after
    ``requests`` measured requests or ``duration_s`` seconds, whichever comes first when both
    are given (with a trace and neither: the trace once).
    """

    api: Literal["completions", "chat"] = "completions"
    input_tokens: TokenCount | None = None
    dataset: str | None = None
    dataset_format: Literal["auto", "prompts", "openai-chat", "sharegpt"] = "auto"
    trace: str | None = None  # a timed trace: arrival times and lengths
    trace_format: Literal["auto", "azure", "mooncake"] = "auto"
    trace_block_tokens: int = Field(default=512, ge=1, le=MAX_TOKENS)  # Mooncake's hash blocks
    output_tokens: TokenCount | None = None
    shared_prefix: SharedPrefix | None = None
    conversation: Conversation | None = None
    arrival: Arrival
    requests: int | None = Field(default=None, ge=1, le=MAX_LEVEL_REQUESTS)
    duration_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)  # see _planned_level
    warmup_requests: int = Field(default=0, ge=0, le=MAX_WARMUP_REQUESTS)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)  # numpy seeds are unsigned 32-bit
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_LEVEL_S)
    request_timeout_s: float = Field(default=300.0, gt=0, le=MAX_REQUEST_TIMEOUT_S)

    @field_validator("dataset", "trace")
    @classmethod
    def _dataset_path(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise _fail("must not be empty")
        return v

    @model_validator(mode="after")
    def _complete(self) -> Workload:
        problems: list[tuple[str, KeyPath]] = []
        sources = (self.input_tokens, self.dataset, self.trace)
        if sum(x is not None for x in sources) != 1:
            problems.append(("give exactly one of 'input_tokens', 'dataset' or 'trace'", ()))
        if self.output_tokens is None and self.dataset is None and self.trace is None:
            problems.append(("required unless 'dataset' or 'trace' is given", ("output_tokens",)))
        if (self.trace is None) != (self.arrival.process != "trace"):
            problems.append(("a trace goes with {process: trace} and only with it", ("arrival",)))
        if self.requests is None and self.duration_s is None and self.trace is None:
            problems.append(("give 'requests', 'duration_s' or both", ()))
        for key in ("shared_prefix", "conversation"):
            if getattr(self, key) is not None and self.input_tokens is None:
                problems.append(("needs 'input_tokens' (synthetic prompts)", (key,)))
        if problems:
            raise _fail_all(problems)
        return self


# --------------------------------------------------------------------------- constraints

# Fixed constraint keys -> (metric, bound).
_FIXED_CONSTRAINTS: dict[str, tuple[str, Literal["max", "min"]]] = {
    "min_request_rate": ("request_rate", "min"),
    "min_output_tokens_per_s": ("output_tokens_per_s", "min"),
    "min_goodput": ("goodput", "min"),
    "max_gpu_memory_gib": ("peak_memory_gib", "max"),
    "max_error_rate": ("error_rate", "max"),
}


def _constraint_target(key: str) -> tuple[str, Literal["max", "min"]]:
    """Metric and bound of a constraint key; raises a validation error for bad keys."""
    if key in _FIXED_CONSTRAINTS:
        return _FIXED_CONSTRAINTS[key]
    shape = _PERCENTILE_SHAPE_RE.match(key)
    if shape is not None and shape["base"] in LATENCY_METRICS:
        problem = percentile_problem(shape["q"])
        if problem is not None:
            raise _fail(problem)
        return f"p{_canonical_q(shape['q'])}_{shape['base']}_ms", "max"
    vocabulary = list(_FIXED_CONSTRAINTS)
    m = re.match(r"^p(\d+(?:\.\d+)?)", key)
    percentiles = (m[1], *_COMMON_PERCENTILES) if m else _COMMON_PERCENTILES
    vocabulary += [f"p{q}_{base}_ms" for q in percentiles for base in LATENCY_METRICS]
    suggestion = _suggest(key, vocabulary)
    if shape is not None and not suggestion:
        raise _fail(
            f"unknown key: the latency metric must be one of {', '.join(LATENCY_METRICS)}, "
            f"got {shape['base']!r}"
        )
    raise _fail(f"unknown key{suggestion}")


class Constraint(_Strict):
    """One hard limit: the trial is infeasible unless ``metric`` is within ``limit``.

    Built from one entry of the YAML ``constraints`` mapping: ``key`` as written there,
    ``metric`` the canonical metric it bounds, ``bound`` whether ``limit`` is a max or a min.
    Only ``key`` and ``limit`` are needed to construct one.
    """

    model_config = ConfigDict(frozen=True)

    key: str
    metric: str
    bound: Literal["max", "min"]
    limit: float

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("key"), str):
            return data  # let the field validation report it
        key: str = data["key"]
        metric, bound = _constraint_target(key)
        for name, derived in (("metric", metric), ("bound", bound)):
            if name in data and data[name] != derived:
                raise _fail(f"{name} of {key!r} is {derived!r}, got {_show(data[name])}")
        limit = data.get("limit")
        if not isinstance(limit, int | float) or isinstance(limit, bool):
            raise _fail(f"must be a number, got {_show(limit)}")
        if metric == "error_rate":
            if not 0 <= limit <= 1:
                raise _fail(f"must be between 0 and 1, got {_show(limit)}")
        elif limit <= 0:
            raise _fail(f"must be > 0, got {_show(limit)}")
        return {**data, "metric": metric, "bound": bound, "limit": float(limit)}

    @classmethod
    def of(cls, key: str, limit: float) -> Constraint:
        """The constraint written ``key: limit`` in YAML."""
        return cls.model_validate({"key": key, "limit": limit})

    def violation(self, value: float) -> float:
        """How far ``value`` is past the limit; <= 0 means satisfied (Optuna's convention)."""
        return value - self.limit if self.bound == "max" else self.limit - value

    def satisfied(self, value: float) -> bool:
        return self.violation(value) <= 0


class Objective(_Strict):
    """One optimisation goal. YAML: ``{maximize: goodput}`` or ``{minimize: p99_ttft_ms}``."""

    model_config = ConfigDict(frozen=True)

    metric: str
    direction: Literal["maximize", "minimize"]

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if isinstance(data, Objective):
            return data
        if not isinstance(data, dict):
            raise _fail(f"must be a mapping like {{maximize: goodput}}, got {_show(data)}")
        if set(data) == {"metric", "direction"}:  # the model_dump() form
            return {**data, "metric": _checked_metric(data["metric"], "metric")}
        directions = ("maximize", "minimize")
        unknown = [k for k in data if k not in directions]
        if unknown:
            key = str(unknown[0])
            raise _fail(f"unknown key{_suggest(key, directions)}", key)
        if len(data) != 1:
            raise _fail("give exactly one of 'maximize' or 'minimize' per item")
        ((direction, metric),) = data.items()
        return {"metric": _checked_metric(metric, direction), "direction": direction}


def _checked_metric(metric: Any, at: str) -> str:
    if not isinstance(metric, str):
        raise _fail(f"must be a metric name, got {_show(metric)}", at)
    canonical = canonical_metric(metric)
    shape = PERCENTILE_METRIC_RE.match(metric)
    if canonical is None and shape is not None and (problem := percentile_problem(shape["q"])):
        raise _fail(problem, at)
    if canonical is None:
        raise _fail(f"unknown metric {metric!r}{_suggest(metric, _metric_vocabulary())}", at)
    return canonical


# --------------------------------------------------------------------------- tuning


class WarmupSpec(_Strict):
    """Warm-up to steady state before a launch's first measured level: load at that level's
    own rate until the median TPOT and TTFT of a window of requests stop falling
    (:mod:`autotuner.measure.steady` states the rule), at most ``max_requests`` requests and
    ``max_s`` seconds; ``workload.warmup_requests`` is its floor."""

    max_requests: int = Field(default=200, ge=0, le=MAX_WARMUP_REQUESTS)  # 0: off
    max_s: float = Field(default=60.0, gt=0, le=3600.0)
    window: int = Field(default=25, ge=5, le=500)  # requests per compared window
    tolerance: float = Field(default=0.10, ge=0, lt=1)  # a fall beyond this is not steady


class ConfirmSpec(_Strict):
    """How the winner is confirmed against the baseline before it is promoted."""

    candidates: int = Field(default=1, ge=1, le=5)  # top Pareto points re-measured
    replicates: int = Field(default=3, ge=1, le=10)  # launches per config, interleaved
    min_effect: float = Field(default=0.05, ge=0, lt=1)  # relative capacity win required


class TuneSpec(_Strict):
    """Budget and strategy of ``autotuner tune``."""

    trials: int = Field(default=12, ge=1, le=10_000)  # engine launches, baseline included
    time_budget_s: float | None = Field(default=None, gt=0, le=365 * 24 * 3600.0)
    # grid: every combination of the `values` lists in search.params (vLLM auto_tune style)
    sampler: Literal["auto", "tpe", "gp", "nsga2", "random", "grid"] = "auto"
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    max_levels: int = Field(default=8, ge=1, le=16)  # load levels measured per launch
    rate_step: float = Field(default=1.5, gt=1, le=4)  # load factor between levels
    # A launch's capacity search stops once its bracket is this narrow (relative).
    capacity_resolution: float = Field(default=0.03, gt=0, lt=0.5)
    # Stop the search once the last `patience` launches raised the best capacity by less than
    # capacity_resolution (search.stopping); null: spend the whole budget. Grids run whole.
    patience: int | None = Field(default=4, ge=1, le=1000)
    # Per-level confidence of a percentile verdict (meets / misses / undecided).
    confidence: float = Field(default=0.95, ge=0.5, le=0.999)
    # Levels grow to the requests their percentile needs, up to this many.
    max_requests_per_level: int = Field(default=600, ge=1, le=MAX_LEVEL_REQUESTS)
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec)
    warmup: WarmupSpec = Field(default_factory=WarmupSpec)
    # Profile the promoted config and the baseline with the engine's own profiler (one more
    # launch each, after the search) for the bundle's kernel breakdown; null: on for GPUs.
    profile: bool | None = None
    storage: str | None = None  # SQLAlchemy URL; default: SQLite in the study directory

    @field_validator("storage")
    @classmethod
    def _storage_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from sqlalchemy.engine import make_url  # Optuna's dependency; only needed here
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(v)
        except ArgumentError:
            raise _fail(
                f"not a database URL: {v!r} (e.g. sqlite:///study.db, postgresql://host/db)"
            ) from None
        return v


# --------------------------------------------------------------------------- what a run costs

_TIE = 1e-12  # as autotuner.measure.quantile: a sum this close to the confidence reaches it


def percentile_requests(p: float, confidence: float) -> int:
    """The fewest requests with which a level can show its p-quantile (0 < p < 1) met at
    ``confidence``: the least n with 1 - p**n >= confidence (the level's maximum is then the
    quantile's upper confidence bound). The closed form of
    ``autotuner.measure.quantile.requests_needed`` without exceedances (a test keeps the two
    equal), here so that the schema knows how many requests a level sends."""
    target = 1 - confidence + _TIE
    n = max(1, math.ceil(math.log(target) / math.log(p)))
    while n > 1 and p ** (n - 1) <= target:
        n -= 1
    while p**n > target:
        n += 1
    return n


def level_requests(sla: Sla) -> tuple[int | None, int, str | None]:
    """``(requests, needed, hardest)``: the requests each load level sends (None: the
    workload's ``duration_s``, or a trace replayed once, bounds a level), the fewest its
    hardest percentile limit needs (0: none) and that constraint's key. As
    ``autotuner.measure.levels.level_size``: ``workload.requests``, raised to what the
    highest constrained percentile needs, up to ``tune.max_requests_per_level``."""
    needed, hardest = 0, None
    for c in sla.constraints:
        parsed = parse_percentile_metric(c.metric)
        if parsed is None or c.bound != "max" or parsed[0] >= 100:
            continue
        n = percentile_requests(parsed[0] / 100, sla.tune.confidence)
        if n > needed:
            needed, hardest = n, c.key
    base = sla.workload.requests
    if base is None:
        return None, needed, hardest
    cap = sla.tune.max_requests_per_level
    return min(max(base, needed), max(base, cap)), needed, hardest


def span(seconds: float) -> str:
    """A duration for messages: ``299000`` -> ``83.1 h (299,000 s)``, ``90`` -> ``90 s``."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    unit, size = ("min", 60) if seconds < 3600 else ("h", 3600)
    if seconds >= 3 * 86400:
        unit, size = "days", 86400
    head = f"{seconds / size:.3g} {unit}"
    return f"{head} ({seconds:,.0f} s)" if seconds < 1e9 else head


def _count(n: int) -> str:
    """A count for messages, without writing out a number of thousands of digits."""
    return f"{n:,}" if n < 10**15 else f"about 10^{math.floor(math.log10(n))}"


def grid_points(search: SearchSpec) -> int:
    """Points of a grid study over ``search.params``: the product of the sizes of their
    ``values`` lists, counted without listing the points (the baseline is one launch more)."""
    return math.prod(len(o.values) for o in search.params.values() if o.values is not None)


def _planned_level(sla: Sla) -> tuple[str, KeyPath] | None:
    """Why the longest load level of a launch would take more than ``MAX_LEVEL_S``, and where
    (None: it fits, or only a data file or the engine's pace can tell; see the trace check
    of ``_missing_files``).

    The first level, at the SLA's own rate, is the longest (the capacity search never goes
    below that rate): its requests at that rate (at most ``duration_s``), plus the think time
    of the last conversation's later turns. A request still running after that gets up to
    ``workload.request_timeout_s`` more."""
    w = sla.workload
    rate: float | None = getattr(w.arrival, "rate", None)
    count, needed, hardest = level_requests(sla)
    send = count / rate if rate is not None and count is not None else None
    by_duration = w.duration_s is not None and (send is None or w.duration_s < send)
    if by_duration:
        assert w.duration_s is not None
        send = w.duration_s
    if send is None:
        return None
    conv = w.conversation
    turns, pause = (conv.turns, conv.think_time_s) if conv is not None else (1, 0.0)
    think = (turns - 1) * pause
    total = send + think
    if total <= MAX_LEVEL_S:
        return None
    at: KeyPath
    if by_duration:
        what = f"workload.duration_s {send:g} s"
        hint, at = "shorten workload.duration_s", ("workload", "duration_s")
    else:
        assert count is not None and rate is not None
        what = f"{count:,} requests at {rate:g} req/s"
        if w.requests is not None and count > w.requests and hardest is not None:
            what += f" ({hardest} at {sla.tune.confidence:.0%} confidence needs {needed:,})"
            hint = f"raise the rate or constrain a lower percentile than {hardest}"
        else:
            hint = "raise the rate or lower workload.requests"
        hint += " (or end each level with workload.duration_s)"
        at = ("workload", "arrival", "rate")
    if think:
        what += f" in {send:,.0f} s, then {turns - 1} later turns x {pause:g} s of think time"
        if think > send:
            hint = "shorten workload.conversation.think_time_s or the conversations"
            at = ("workload", "conversation", "think_time_s")
    return (
        f"a load level is planned to take {span(total)}: {what}; a level may take at most "
        f"{span(MAX_LEVEL_S)}: {hint}",
        at,
    )


# --------------------------------------------------------------------------- the SLA


def _default_objectives() -> list[Objective]:
    return [Objective(metric="capacity", direction="maximize")]


class Sla(_Strict):
    """A validated SLA file. Relative paths in it are resolved with ``resolve_path``.

    ``source_path`` is the file it was loaded from (None when parsed from text); it is not a
    field, so it can't be set from YAML and is left out of dumps and comparisons of dumps.
    """

    name: str = "sla"
    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    target: Target = Field(default_factory=Target)
    workload: Workload
    constraints: list[Constraint] = Field(default_factory=list)
    objectives: list[Objective] = Field(default_factory=_default_objectives)
    search: SearchSpec = Field(default_factory=SearchSpec)
    tune: TuneSpec = Field(default_factory=TuneSpec)
    quality: QualitySpec = Field(default_factory=QualitySpec)  # the lossy tier's gate

    _source_path: Path | None = PrivateAttr(default=None)
    _base_dir: Path | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        if len(v) > 100:  # it names directories and files
            raise _fail(f"must be at most 100 characters, got {len(v)}")
        if not _NAME_RE.match(v):
            raise _fail(
                f"must start with a letter or digit and use only letters, digits, "
                f"'_', '.' and '-', got {v!r}"
            )
        return v

    @field_validator("engine", "target", "objectives", "search", "tune", "quality", mode="before")
    @classmethod
    def _empty_section(cls, v: Any, info: ValidationInfo) -> Any:
        # `engine:` with every line below commented out is YAML null: read it as "defaults".
        if v is None and info.field_name is not None:
            return cls.model_fields[info.field_name].get_default(call_default_factory=True)
        return v

    @field_validator("constraints", mode="before")
    @classmethod
    def _constraints_from_mapping(cls, v: Any) -> Any:
        # YAML writes constraints as a mapping; the model keeps them as a list in file order.
        # Errors then carry list indices, which the error mapper turns back into keys.
        if v is None:  # an empty `constraints:` section
            return []
        if isinstance(v, dict):
            return [{"key": k, "limit": limit} for k, limit in v.items()]
        # A list is the model_dump() form: accepted only as such.
        if isinstance(v, list) and all(
            isinstance(c, Constraint) or (isinstance(c, dict) and "key" in c) for c in v
        ):
            return v
        raise _fail(f"must be a mapping like {{p99_ttft_ms: 500}}, got {_show(v)}")

    @field_validator("constraints")
    @classmethod
    def _one_per_metric(cls, v: list[Constraint]) -> list[Constraint]:
        seen: dict[tuple[str, str], str] = {}
        problems: list[tuple[str, KeyPath]] = []
        for i, c in enumerate(v):
            first = seen.setdefault((c.metric, c.bound), c.key)
            if first != c.key:
                problems.append((f"bounds the same metric as {first!r}", (i,)))
        if problems:
            raise _fail_all(problems)
        return v

    @field_validator("objectives")
    @classmethod
    def _distinct_objectives(cls, v: list[Objective]) -> list[Objective]:
        if not v:
            raise _fail("give at least one objective, e.g. [{maximize: goodput}]")
        seen: set[str] = set()
        problems: list[tuple[str, KeyPath]] = []
        for i, o in enumerate(v):
            if o.metric in seen:
                problems.append((f"metric {o.metric!r} appears twice", (i,)))
            seen.add(o.metric)
        if problems:
            raise _fail_all(problems)
        return v

    @model_validator(mode="after")
    def _search_values(self) -> Sla:
        from autotuner.sla import allowed

        problems = allowed.search_problems(self.engine.kind, self.search, self.engine.settings())
        for name in self.search.baseline:
            override = self.search.params.get(name)
            if override is None or override.fixed is not None or override.exclude:
                problems.append(
                    (
                        f"{name!r} is not searched by this SLA: give it values in "
                        f"search.params, e.g. {name}: {{values: [...]}}",
                        ("search", "baseline", name),
                    )
                )
        if problems:
            raise _fail_all(problems)
        return self

    @model_validator(mode="after")
    def _grid_has_values(self) -> Sla:
        if self.tune.sampler == "grid" and not any(
            o.values is not None for o in self.search.params.values()
        ):
            raise _fail(
                "the grid sampler tries every combination of the 'values' lists in "
                "search.params, and none has one: give e.g. "
                "search: {params: {max_num_seqs: {values: [128, 256, 512]}}}",
                "tune",
                "sampler",
            )
        points = grid_points(self.search) if self.tune.sampler == "grid" else 0
        if points > MAX_GRID_POINTS:
            sizes = " x ".join(
                f"{len(o.values)} {name}"
                for name, o in self.search.params.items()
                if o.values is not None and len(o.values) > 1
            )
            raise _fail(
                f"the grid has {_count(points)} points ({sizes} values), more than the "
                f"{MAX_GRID_POINTS:,} launches a grid study may make: list fewer values, or "
                "let a sampler choose among them (tune.sampler: auto)",
                "tune",
                "sampler",
            )
        return self

    @model_validator(mode="after")
    def _level_fits(self) -> Sla:
        planned = _planned_level(self)
        if planned is not None:
            raise _fail(planned[0], *planned[1])
        return self

    @property
    def source_path(self) -> Path | None:
        return self._source_path

    @source_path.setter
    def source_path(self, value: Path | None) -> None:
        self._source_path = value

    def resolve_path(self, p: str) -> Path:
        """``p`` with ``~`` expanded, relative to the SLA file's directory (else the base dir
        given to ``parse_sla``, else the current directory)."""
        path = Path(p).expanduser()
        if path.is_absolute():
            return path
        if self._source_path is not None:
            base = self._source_path.parent
        elif self._base_dir is not None:
            base = self._base_dir
        else:
            base = Path.cwd()
        return base / path

    def latency_slos(self) -> dict[str, float]:
        """Per-request latency limits for goodput, from the ``p<q>_<metric>_ms`` constraints.

        Keys are ``ttft``/``tpot``/``itl``/``e2e`` (only those constrained); with several
        percentiles of one metric the tightest limit wins.
        """
        slos: dict[str, float] = {}
        for c in self.constraints:
            parsed = parse_percentile_metric(c.metric)
            if parsed is not None and c.bound == "max":
                base = parsed[1]
                slos[base] = min(slos.get(base, c.limit), c.limit)
        return slos


# --------------------------------------------------------------------------- errors


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


def _dotted(path: KeyPath) -> str:
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
    got = _show(err.get("input"))
    if kind == "sla":
        return str(ctx["msg"])
    if kind == "invalid_key":
        return f"keys must be text (quote it: '{path[-1]}')" if path else "keys must be text"
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        fields = hints.get(id(_node_at(data, path[:-1])), ())
        return f"unknown key{_suggest(str(path[-1]), fields)}" if path else "unknown key"
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
        tags = [t for t in _quoted(ctx.get("expected_tags", "")) if t != _COUNT_TAG]
        return f"must be one of {', '.join(tags)}, got {_show(ctx.get('tag'))}"
    if kind == "union_tag_not_found":
        return "required field is missing"
    text = str(err.get("msg", "invalid value"))
    return text.removeprefix("Value error, ")


def _problems_from_validation(
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
            problems.append(Problem(located.line_of(p), _dotted(p), msg))
    return problems


# --------------------------------------------------------------------------- loading


def _default_name(source: str) -> str:
    if source.startswith("<"):
        return "sla"
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(source).stem).lstrip("_.-")
    return stem or "sla"


def _yaml_problem(exc: yaml.YAMLError) -> Problem:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        detail = exc.problem or "malformed YAML"
        if exc.context:
            detail = f"{detail} ({exc.context})"
        return Problem(mark.line + 1 if mark else None, "", f"invalid YAML: {detail}")
    return Problem(None, "", f"invalid YAML: {exc}")


def parse_sla(
    text: str,
    source: str = "<string>",
    base_dir: Path | None = None,
    *,
    check_files: bool = False,
) -> Sla:
    """Validate SLA text; raise ``SlaError`` with every problem found.

    ``source`` labels messages and gives the default ``name`` (its stem); ``base_dir`` is where
    relative paths resolve. With ``check_files``, ``model.path`` and ``workload.dataset`` must
    exist on disk (``load_sla`` turns this on).
    """
    try:
        located = load_located(text)
    except yaml.YAMLError as exc:
        raise SlaError([_yaml_problem(exc)], source) from None
    data = located.data
    if data is None:
        raise SlaError(
            [Problem(None, "", "file is empty (expected a mapping: model, workload, ...)")], source
        )
    if not isinstance(data, dict):
        problem = Problem(
            located.root_line, "", f"top level must be a mapping of SLA fields, got {_show(data)}"
        )
        raise SlaError([problem], source)

    problems = [
        Problem(d.line, _dotted(d.path), f"duplicate key (first given on line {d.first_line})")
        for d in located.duplicates
    ]
    data.setdefault("name", _default_name(source))
    hints: dict[int, tuple[str, ...]] = {}
    sla: Sla | None = None
    try:
        sla = Sla.model_validate(data, context={_HINTS: hints})
    except ValidationError as exc:
        problems += _problems_from_validation(exc, located, hints)
    if sla is not None:
        sla._base_dir = base_dir
        if check_files:
            problems += _missing_files(sla, located)
    if problems or sla is None:
        problems.sort(key=lambda p: p.line or 0)
        raise SlaError(problems, source)
    return sla


def _missing_files(sla: Sla, located: Located) -> list[Problem]:
    problems: list[Problem] = []
    if sla.model.path is not None:
        where: KeyPath = ("model", "path")
        model_dir = sla.resolve_path(sla.model.path)
        if not model_dir.is_dir():
            problems.append(
                Problem(located.line_of(where), "model.path", f"no such directory: {model_dir}")
            )
        elif not (model_dir / "config.json").is_file():
            problems.append(
                Problem(located.line_of(where), "model.path", f"no config.json in {model_dir}")
            )
        else:  # a folder from outside: its config must be one a model has (models.folder)
            from autotuner.models.folder import read_config

            try:
                read_config(model_dir)
            except BadInput as exc:
                problems.append(Problem(located.line_of(where), "model.path", str(exc)))
    if sla.workload.dataset is not None or sla.workload.trace is not None:
        from autotuner.workload.replay import file_problems

        limit = context_limit(sla, _roles(sla))
        for at, msg in file_problems(sla.workload, sla.resolve_path, limit):
            problems.append(Problem(located.line_of(at), _dotted(at), msg))
    if not problems:
        problems += _length_problems(sla, located)
        problems += _trace_level_problems(sla, located)
    return problems


def _trace_level_problems(sla: Sla, located: Located) -> list[Problem]:
    """A replayed trace's level past ``MAX_LEVEL_S`` (``_planned_level`` for a trace): the
    level's requests, the trace repeated after its span as often as they need, at
    ``arrival.speed`` x the trace's pace; ``duration_s`` ends it sooner (checked there)."""
    w = sla.workload
    if w.trace is None or not isinstance(w.arrival, TraceArrival):
        return []
    from autotuner.workload.datafiles import DataFileError
    from autotuner.workload.traces import read_trace

    try:
        trace = read_trace(sla.resolve_path(w.trace), w.trace_format, w.trace_block_tokens)
    except (DataFileError, OSError):
        return []  # reported by file_problems
    records = trace.records
    n = len(records)
    count = level_requests(sla)[0] or n
    send = ((count - 1) // n * trace.span_s + records[(count - 1) % n].time_s) / w.arrival.speed
    if send <= MAX_LEVEL_S or (w.duration_s is not None and w.duration_s <= send):
        return []
    where: KeyPath = ("workload", "arrival", "speed")
    return [
        Problem(
            located.line_of(where),
            "workload.arrival.speed",
            f"a load level is planned to take {span(send)}: {count:,} requests of the trace "
            f"({len(records):,} records over {span(trace.span_s)}) replayed at "
            f"{w.arrival.speed:g}x; a level may take at most {span(MAX_LEVEL_S)}: raise the "
            "speed or lower workload.requests (or end each level with workload.duration_s)",
        )
    ]


def _longest(count: Any) -> int | None:
    """The most tokens a ``TokenCount`` can ask for (None: unbounded above)."""
    if isinstance(count, int):
        return count
    if isinstance(count, UniformDist):
        return count.max
    if isinstance(count, _ShapedDist):
        return count.max
    return None


def _roles(sla: Sla) -> OptionRoles:
    """The option roles of the SLA's engine kind (validation resolves the kind it checks)."""
    return registry.get(sla.engine.kind).roles


def context_limit(sla: Sla, roles: OptionRoles) -> int | None:
    """The engine's context length: the option of the context-length role in ``roles`` (vLLM:
    ``max_model_len``) as the SLA sets it, else the model's own. Load plans fit dataset
    prompts to it."""
    option = roles.context_length
    fixed = sla.engine.settings().get(option) if option is not None else None  # params, args
    if isinstance(fixed, int) and not isinstance(fixed, bool):
        return fixed
    config: dict[str, Any] = {}
    if sla.model.synth is not None:
        from autotuner.models.synth import ARCHS

        config = ARCHS[sla.model.synth].config()
    elif sla.model.path is not None:
        import json

        from autotuner.core import confined

        try:  # within the directories a daemon's SLA may read (core.confined)
            raw = confined.read_bytes(sla.resolve_path(sla.model.path) / "config.json")
            config = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError, RecursionError):  # _missing_files says what is wrong
            return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) else None


def _length_problems(sla: Sla, located: Located) -> list[Problem]:
    """Requests that no engine of this model can serve: prompt plus output past the context."""
    roles = _roles(sla)
    limit = context_limit(sla, roles)
    named = roles.context_length or "context length"
    prompt = _longest(sla.workload.input_tokens) if sla.workload.input_tokens else None
    output = _longest(sla.workload.output_tokens) if sla.workload.output_tokens else None
    if limit is None or prompt is None:
        return []
    w = sla.workload
    if w.shared_prefix is not None or w.conversation is not None:
        return _traffic_length_problems(sla, located, limit, prompt, output or 0, named)
    need = prompt + (output or 0)
    if need <= limit:
        return []
    where: KeyPath = ("workload", "input_tokens")
    return [
        Problem(
            located.line_of(where),
            "workload.input_tokens",
            f"a request of {prompt} prompt + {output or 0} output tokens does not fit the "
            f"model's context of {limit} tokens ({named})",
        )
    ]


def _traffic_length_problems(
    sla: Sla, located: Located, limit: int, prompt: int, output: int, named: str
) -> list[Problem]:
    """Shared prefixes and conversations: the longest request is the last turn, which resends
    the system prompt and every earlier prompt and answer. ``named``: what the engine calls
    its context length (in the messages)."""
    w = sla.workload
    prefix = w.shared_prefix.tokens if w.shared_prefix else 0
    turns = w.conversation.turns if w.conversation else 1
    if prefix >= limit:
        where: KeyPath = ("workload", "shared_prefix", "tokens")
        return [
            Problem(
                located.line_of(where),
                "workload.shared_prefix.tokens",
                f"a system prompt of {prefix} tokens does not fit the model's context of "
                f"{limit} tokens ({named})",
            )
        ]
    need = prefix + turns * (prompt + output)
    if need <= limit:
        return []
    key, where = (
        ("conversation", ("workload", "conversation", "turns"))
        if turns > 1
        else ("input_tokens", ("workload", "input_tokens"))
    )
    last = f"the last of {turns} turns" if turns > 1 else "a request"
    return [
        Problem(
            located.line_of(where),
            f"workload.{key}" + (".turns" if turns > 1 else ""),
            f"{last} needs {need} tokens ({prefix} system prompt + {turns} x ({prompt} prompt + "
            f"{output} output)), more than the model's context of {limit} tokens "
            f"({named})",
        )
    ]


def load_sla(path: str | Path) -> Sla:
    """Read and validate an SLA file; every failure (I/O included) is an ``SlaError``."""
    source = str(path)
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SlaError([Problem(None, "", "no such file")], source) from None
    except IsADirectoryError:
        raise SlaError([Problem(None, "", "is a directory, not an SLA file")], source) from None
    except UnicodeDecodeError:
        raise SlaError([Problem(None, "", "not UTF-8 text")], source) from None
    except OSError as exc:
        raise SlaError([Problem(None, "", f"cannot read: {exc.strerror or exc}")], source) from None
    sla = parse_sla(text, source, file.parent.resolve(), check_files=True)
    sla.source_path = file.resolve()
    return sla


def to_yaml(sla: Sla) -> str:
    """The SLA in the form users write; ``parse_sla(to_yaml(s))`` equals ``s`` field for field."""
    doc: dict[str, Any] = {
        "name": sla.name,
        "model": sla.model.model_dump(exclude_none=True),
        "engine": sla.engine.model_dump(exclude_none=True),
        "target": sla.target.to_yaml_value(),
        "workload": sla.workload.model_dump(exclude_none=True),
        "constraints": {c.key: c.limit for c in sla.constraints},
        "objectives": [{o.direction: o.metric} for o in sla.objectives],
        "search": sla.search.model_dump(exclude_defaults=True),
        "tune": sla.tune.model_dump(exclude_defaults=True),
    }
    quality = sla.quality.model_dump(exclude_defaults=True)
    if quality:  # absent when default, so older SLAs dump as before
        doc["quality"] = quality
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=False)
