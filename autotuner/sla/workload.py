"""The SLA's ``workload:`` section: what the requests look like, how they arrive, how long a
load test runs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, Tag, field_validator, model_validator

from autotuner.core.yamlpos import KeyPath
from autotuner.sla.base import Strict, fail, fail_all, show
from autotuner.sla.bounds import (
    MAX_CONCURRENCY,
    MAX_LEVEL_REQUESTS,
    MAX_LEVEL_S,
    MAX_RATE,
    MAX_REQUEST_TIMEOUT_S,
    MAX_REQUESTS,
    MAX_SECONDS,
    MAX_TOKENS,
    MAX_TURNS,
    MAX_WARMUP_REQUESTS,
    MIN_RATE,
)

DEFAULT_DATASET_OUTPUT_TOKENS = 128
"""Output length for dataset rows that carry no ``output_tokens`` of their own."""


class UniformDist(Strict):
    """Token counts drawn uniformly from ``[min, max]``."""

    distribution: Literal["uniform"]
    min: int = Field(ge=1, le=MAX_TOKENS)
    max: int = Field(ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> UniformDist:
        if self.max < self.min:
            raise fail(f"must be >= min ({self.min}), got {self.max}", "max")
        return self


class ShapedDist(Strict):
    """A bell-shaped distribution of the token count, rounded and clipped to ``[min, max]``.

    ``mean`` and ``stddev`` describe the token count itself (not its logarithm).
    """

    mean: float = Field(gt=0, le=MAX_TOKENS)
    stddev: float = Field(ge=0, le=MAX_TOKENS)
    min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> ShapedDist:
        if self.max is not None and self.max < self.min:
            raise fail(f"must be >= min ({self.min}), got {self.max}", "max")
        hi = "" if self.max is None else f" and max ({self.max})"
        if self.mean < self.min or (self.max is not None and self.mean > self.max):
            raise fail(f"must lie between min ({self.min}){hi}, got {show(self.mean)}", "mean")
        return self


class NormalDist(ShapedDist):
    distribution: Literal["normal"]


class LognormalDist(ShapedDist):
    distribution: Literal["lognormal"]


Distribution = UniformDist | NormalDist | LognormalDist

COUNT_TAG = "count"  # internal tag of a plain integer, hidden from messages


def _token_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        tag = value.get("distribution")
        return tag if isinstance(tag, str) else None
    if isinstance(value, UniformDist | NormalDist | LognormalDist):
        return value.distribution
    return COUNT_TAG


TokenCount = Annotated[
    Annotated[Annotated[int, Field(ge=1, le=MAX_TOKENS)], Tag(COUNT_TAG)]
    | Annotated[UniformDist, Tag("uniform")]
    | Annotated[NormalDist, Tag("normal")]
    | Annotated[LognormalDist, Tag("lognormal")],
    Discriminator(_token_tag),
]
"""A fixed token count (int >= 1) or a distribution mapping."""


def _sendable(rate: float) -> float:
    if rate > MAX_RATE:
        raise fail(
            f"must be at most {MAX_RATE:,.0f} req/s, got {show(rate)}: the load generator is "
            "one process and spends far more than 10 us of a core on each request (about "
            "540 us on a 2-core host), so no host sends a higher rate; it would only be "
            "scheduled, never offered to the engine"
        )
    return rate


OpenRate = Annotated[float, Field(ge=MIN_RATE), AfterValidator(_sendable)]
"""An open loop's req/s: at least ``MIN_RATE``, at most what a load generator can send
(``MAX_RATE``, see :mod:`autotuner.sla.bounds`)."""


class PoissonArrival(Strict):
    """Open loop: exponential gaps, ``rate`` requests per second on average."""

    process: Literal["poisson"]
    rate: OpenRate


class ConstantArrival(Strict):
    """Open loop: one request every ``1/rate`` seconds."""

    process: Literal["constant"]
    rate: OpenRate


class ConcurrencyArrival(Strict):
    """Closed loop: keep ``concurrency`` requests in flight."""

    process: Literal["concurrency"]
    concurrency: int = Field(ge=1, le=MAX_CONCURRENCY)


class TraceArrival(Strict):
    """Open loop: the times of ``workload.trace``, replayed ``speed`` times as fast."""

    process: Literal["trace"]
    speed: float = Field(default=1.0, ge=MIN_RATE, le=1e6)


Arrival = Annotated[
    PoissonArrival | ConstantArrival | ConcurrencyArrival | TraceArrival,
    Field(discriminator="process"),
]


class SharedPrefix(Strict):
    """Synthetic system prompts: every request starts with ``tokens`` tokens of one; ``share``
    of the requests use one of ``prompts`` shared ones, the rest one of their own (so the
    prompt lengths do not depend on the share)."""

    prompts: int = Field(ge=1, le=MAX_REQUESTS)
    tokens: int = Field(ge=1, le=MAX_TOKENS)
    share: float = Field(ge=0, le=1)


class Conversation(Strict):
    """Multi-turn chats: each conversation sends ``turns`` requests, each later one resending
    the history (earlier prompts and answers) plus a new user message, ``think_time_s`` after
    the previous answer arrived. The arrival rate stays requests per second: conversations
    start at ``rate / turns``."""

    turns: int = Field(ge=1, le=MAX_TURNS)
    think_time_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS)


class Workload(Strict):
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
    duration_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)  # see sla.document
    warmup_requests: int = Field(default=0, ge=0, le=MAX_WARMUP_REQUESTS)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)  # numpy seeds are unsigned 32-bit
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_LEVEL_S)
    request_timeout_s: float = Field(default=300.0, gt=0, le=MAX_REQUEST_TIMEOUT_S)

    @field_validator("dataset", "trace")
    @classmethod
    def _dataset_path(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise fail("must not be empty")
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
            raise fail_all(problems)
        return self
