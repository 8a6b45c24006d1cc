"""The load generator: streams OpenAI requests at a running engine and times every token.

Open-loop arrivals (Poisson, constant) are sent on schedule whatever the server does, so a
slow server faces a growing queue instead of a politely slowed client; closed loop keeps
``concurrency`` requests in flight. Every request ends as a record: successful, or failed with
a kind (``http_500``, ``connection``, ``timeout``, ``incomplete``, ``deadline``). Failures
stay in the result and count against the SLA.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import numpy as np

from autotuner.measure.conversations import ConversationFactory, drive
from autotuner.measure.sendpool import SendPool
from autotuner.measure.steady import (
    SteadyRule,
    StopReason,
    WarmupRecord,
    Window,
    settled,
    window_of,
)
from autotuner.measure.synthetic import prefix_of
from autotuner.sla.bounds import MAX_REQUESTS
from autotuner.workload.requests import Api, Arrival, RequestFactory, RequestSpec

# Warm-up requests use their own prompts, so they cannot seed the prefix cache for the run.
_WARMUP_INDEX_BASE = 10_000_000

# A run bounded by its duration stops sending once its sends took this much longer than the
# duration: the level is undecided by then anyway (autotuner.measure.pacing.PACE_TOLERANCE),
# and a generator that cannot keep up (a rate of 1e5 req/s schedules 6 million requests in a
# minute) would otherwise go on sending, and keeping records, until the hard deadline.
OVERRUN = 0.05

# Every request opens its own connection (``force_close``): none is ever reused. A pooled
# connection can be written to just as the server's keep-alive (vLLM's and uvicorn's default:
# 5 s) closes it, and the request fails ("Connection reset by peer", "Server disconnected"),
# counted against the SLA. On the H200 two requests of a level failed so, 4.2 s into it, on
# connections the warm-up had left idle (benchmarks/keepalive_race.py reproduces it). Dropping
# connections idle for 2 s was not enough on a 2-core host that stops processes for up to
# 4.8 s (benchmarks/host_stalls.py): requests still failed so on it, in a closed loop and
# between a level's runs. A connection to the engine on 127.0.0.1 costs well under a
# millisecond, which TTFT then includes.


def client_session() -> aiohttp.ClientSession:
    """The load generator's HTTP session: no connection limit (an open loop never waits for a
    free connection), a new connection per request."""
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True)
    return aiohttp.ClientSession(connector=connector)


@dataclass(frozen=True)
class RequestRecord:
    """One request's timings (seconds) and outcome."""

    index: int
    sent_s: float  # offset from the start of the run
    lag_s: float  # how late it left compared with its scheduled time (client health)
    requested_tokens: int
    ttft_s: float | None = None
    itl_s: tuple[float, ...] = ()
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0
    error: str | None = None
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first one."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class LoadPlan:
    """A complete description of one load run."""

    api: Api
    factory: RequestFactory
    arrival: Arrival
    requests: int | None
    duration_s: float | None
    warmup_requests: int = 0
    request_timeout_s: float = 300.0
    deadline_s: float | None = None  # hard limit for the measured part
    conversation: ConversationFactory | None = None  # multi-turn: requests are turns
    # Warm up to steady state at this plan's own load before the measured part (the first
    # level of a launch; autotuner.measure.steady), ``warmup_requests`` as its floor. None:
    # only the ``warmup_requests`` (4 at a time), as before.
    steady: SteadyRule | None = None

    def __post_init__(self) -> None:
        if self.requests is None and self.duration_s is None:
            raise ValueError("a load plan needs a request count or a duration")

    def hard_deadline(self) -> float:
        """The given deadline, or the planned length plus one request time-out."""
        if self.deadline_s is not None:
            return self.deadline_s
        planned = self.duration_s
        if planned is None:
            assert self.requests is not None
            rate = self.arrival.rate if self.arrival.open_loop else None
            planned = self.requests / rate if rate else self.requests * 2.0
        if self.conversation is not None:  # the last conversation's later turns think first
            planned += (self.conversation.turns - 1) * self.conversation.think_time_s
        return planned + self.request_timeout_s

    def offsets(self) -> Iterator[float]:
        """Send times of an open-loop plan: the arrival's, or a replayed trace's."""
        replay = self.factory.replay
        if self.arrival.process == "trace" and replay is not None and self.arrival.rate:
            return replay.offsets(self.arrival.rate)
        return self.arrival.offsets(self.factory.seed)

    def describe(self) -> dict[str, Any]:
        replay = self.factory.replay
        return {
            "api": self.api,
            "arrival": asdict(self.arrival),
            "requests": self.requests,
            "duration_s": self.duration_s,
            "warmup_requests": self.warmup_requests,
            "seed": self.factory.seed,
            "input_len": asdict(self.factory.input_len) if self.factory.input_len else None,
            "output_len": asdict(self.factory.output_len),
            **({"replay": replay.describe()} if replay is not None else {}),
            **({"shared_prefix": p.describe()} if (p := prefix_of(self.factory)) else {}),
            **({"conversation": self.conversation.describe()} if self.conversation else {}),
        }


@dataclass(frozen=True)
class RunSpan:
    """One of the runs pooled into a :class:`LoadResult`: how many of its records are this
    run's, and the run's measured duration."""

    requests: int
    duration_s: float


@dataclass(frozen=True)
class LoadResult:
    """What one run measured. Percentiles are computed from the raw records on demand.

    A level measured again is pooled (:func:`autotuner.measure.levels.pooled`): the records of
    its runs one after the other, ``runs`` saying where each ends. Each run's times count from
    its own start, so their windows overlap: rates and slopes are taken run by run
    (:meth:`parts`); percentiles pool."""

    plan: dict[str, Any]
    records: tuple[RequestRecord, ...]
    duration_s: float
    warmup_failed: int = 0
    monitor: dict[str, Any] = field(default_factory=dict)
    warmup_s: float = 0.0  # wall seconds of the warm-up requests before the measured part
    # What the warm-up to steady state took (WarmupRecord.to_dict()); None: no such warm-up.
    warmup: dict[str, Any] | None = None
    runs: tuple[RunSpan, ...] = ()  # the pooled runs, in the order of ``records``; () one run
    # The requests the schedule held when the hard deadline cut the sending short, more than
    # were sent (an open loop that fell behind, its sends waiting for a slot of the pool:
    # autotuner.measure.sendpool); 0: every scheduled request was sent.
    scheduled: int = 0

    def __post_init__(self) -> None:
        # A level file is input: a run of no requests or an unmeasurable duration is refused,
        # not divided by.
        for r in self.runs:
            if r.requests < 1 or not (math.isfinite(r.duration_s) and r.duration_s >= 0):
                raise ValueError(f"a pooled run of {r.requests} requests in {r.duration_s} s")
        if self.runs and sum(r.requests for r in self.runs) != len(self.records):
            raise ValueError(
                f"the pooled runs hold {sum(r.requests for r in self.runs)} requests, "
                f"the result {len(self.records)}"
            )
        if self.scheduled < 0:
            raise ValueError(f"a schedule of {self.scheduled} requests")

    def schedule_sent(self) -> float | None:
        """The share of the schedule's requests that were sent; None when all were."""
        if self.scheduled <= len(self.records):
            return None
        return len(self.records) / self.scheduled

    def spans(self) -> tuple[RunSpan, ...]:
        """The runs in this result (one, unless pooled)."""
        return self.runs or (RunSpan(len(self.records), self.duration_s),)

    def parts(self) -> tuple[LoadResult, ...]:
        """Each run on its own, its times from its own start (just this result, unless
        pooled). A part keeps the plan and the records; the monitor and warm-up are the
        pool's, not split."""
        if len(self.runs) < 2:
            return (self,)
        out, start = [], 0
        for run in self.runs:
            end = start + run.requests
            out.append(LoadResult(self.plan, self.records[start:end], run.duration_s))
            start = end
        return tuple(out)

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.ok]

    @property
    def failed(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.ok]

    def errors(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.failed:
            assert r.error is not None
            counts[r.error] = counts.get(r.error, 0) + 1
        return counts

    def latencies_ms(self, metric: str) -> np.ndarray:
        """Successful requests' ``ttft``, ``tpot``, ``e2e`` per request, or every ``itl`` gap."""
        ok = self.ok
        if metric == "itl":
            values = [g for r in ok for g in r.itl_s]
        elif metric == "ttft":
            values = [r.ttft_s for r in ok if r.ttft_s is not None]
        elif metric == "tpot":
            values = [t for r in ok if (t := r.tpot_s) is not None]
        elif metric == "e2e":
            values = [r.e2e_s for r in ok if r.e2e_s is not None]
        else:
            raise KeyError(metric)
        return np.asarray(values, dtype=float) * 1000.0

    def percentile_ms(self, metric: str, q: float) -> float | None:
        values = self.latencies_ms(metric)
        return float(np.percentile(values, q)) if values.size else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "duration_s": self.duration_s,
            "warmup_failed": self.warmup_failed,
            "warmup_s": self.warmup_s,
            **({"warmup": self.warmup} if self.warmup is not None else {}),
            "monitor": self.monitor,
            "records": [asdict(r) for r in self.records],
            **({"runs": [asdict(r) for r in self.runs]} if self.runs else {}),
            **({"scheduled": self.scheduled} if self.scheduled else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadResult:
        records = tuple(RequestRecord(**{**r, "itl_s": tuple(r["itl_s"])}) for r in data["records"])
        duration_s = float(data["duration_s"])
        # A level file is input: a NaN or infinite time compares False with every limit, so it
        # is refused when read.
        if not (math.isfinite(duration_s) and duration_s >= 0):
            raise ValueError(f"a level of duration {duration_s} s")
        for r in records:
            times = [r.sent_s, r.lag_s, r.ttft_s, r.e2e_s, *r.itl_s]
            if not all(math.isfinite(float(t)) for t in times if t is not None):
                raise ValueError(f"request {r.index}: a time that is not a finite number")
        return cls(
            plan=data["plan"],
            records=records,
            duration_s=duration_s,
            warmup_failed=int(data.get("warmup_failed", 0)),
            monitor=dict(data.get("monitor", {})),
            warmup_s=float(data.get("warmup_s", 0.0)),
            warmup=data.get("warmup"),
            runs=(
                tuple(RunSpan(int(r["requests"]), float(r["duration_s"])) for r in data["runs"])
                if "runs" in data
                else _runs_by_index(records, float(data["duration_s"]))
            ),
            scheduled=int(data.get("scheduled", 0)),
        )


def _runs_by_index(records: Sequence[RequestRecord], duration_s: float) -> tuple[RunSpan, ...]:
    """The runs of a pooled result written before ``runs`` was: a run's records are sorted by
    index, from 0, so each later run starts where the index falls back. Their durations were
    kept only as a sum: split by requests."""
    starts = [0, *(i for i in range(1, len(records)) if records[i].index <= records[i - 1].index)]
    if len(starts) < 2:
        return ()
    sizes = [b - a for a, b in zip(starts, [*starts[1:], len(records)], strict=True)]
    return tuple(RunSpan(n, duration_s * n / len(records)) for n in sizes)


@dataclass(frozen=True)
class Progress:
    sent: int
    done: int
    failed: int
    total: int | None
    elapsed_s: float


class _Run:
    """State of one measured run (records, counters) shared by the request tasks."""

    def __init__(
        self, base_url: str | Sequence[str], model: str, api: Api, timeout_s: float
    ) -> None:
        path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        bases = [base_url] if isinstance(base_url, str) else list(base_url)
        # Several servers (engine replicas): request i goes to server i mod n, in turn.
        self.urls = [b.rstrip("/") + path for b in bases]
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=30)
        self.records: list[RequestRecord] = []
        self.sent = 0
        self.failed = 0
        self.t0 = time.perf_counter()
        self.last_end = 0.0
        # Answers' text by request index, kept only for conversations (their history).
        self.answers: dict[int, str] | None = None
        self.scheduled = 0  # see LoadResult.scheduled

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": spec.output_tokens,
            "ignore_eos": True,  # exact output length, whatever the weights say
            "temperature": 0.0,
            # Random weights decoding greedily can repeat a special token; skipped, it would
            # stream no text at all and leave nothing to time.
            "skip_special_tokens": False,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if spec.messages is not None:
            body["messages"] = spec.messages
        else:
            body["prompt"] = spec.prompt
        return body

    async def send(
        self, session: aiohttp.ClientSession, index: int, spec: RequestSpec, scheduled: float
    ) -> RequestRecord:
        """Send one request and record it; also records it when cancelled at the deadline."""
        start = time.perf_counter()
        self.sent += 1
        base: dict[str, Any] = {
            "index": index,
            "sent_s": start - self.t0,
            "lag_s": max(0.0, start - self.t0 - scheduled),
            "requested_tokens": spec.output_tokens,
        }
        try:
            timing = await self._stream(session, spec, start, index)
            record = RequestRecord(**base, **timing)
        except asyncio.CancelledError:
            self._add(RequestRecord(**base, error="deadline", detail="cut at the hard deadline"))
            raise
        except TimeoutError:
            record = RequestRecord(**base, error="timeout", detail="request time-out")
        except _HttpError as exc:
            record = RequestRecord(**base, error=f"http_{exc.status}", detail=exc.detail)
        except _Incomplete as exc:
            record = RequestRecord(**base, error="incomplete", detail=str(exc))
        except (aiohttp.ClientError, OSError) as exc:
            record = RequestRecord(**base, error="connection", detail=repr(exc)[:300])
        except (ValueError, KeyError, TypeError) as exc:
            record = RequestRecord(**base, error="bad_response", detail=repr(exc)[:300])
        self._add(record)
        return record

    def _add(self, record: RequestRecord) -> None:
        self.records.append(record)
        self.last_end = time.perf_counter() - self.t0
        if not record.ok:
            self.failed += 1

    async def _stream(
        self, session: aiohttp.ClientSession, spec: RequestSpec, start: float, index: int
    ) -> dict[str, Any]:
        pieces: list[str] | None = [] if self.answers is not None else None
        first: float | None = None
        last = start
        gaps: list[float] = []
        chunks = 0
        usage: dict[str, Any] | None = None
        done = False
        url = self.urls[index % len(self.urls)]
        async with session.post(url, json=self.body(spec), timeout=self.timeout) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                raise _HttpError(resp.status, text)
            async for raw in _body_lines(resp):
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                event = json.loads(payload)
                if event.get("error"):
                    raise _HttpError(500, json.dumps(event["error"])[:300])
                if event.get("usage"):
                    usage = event["usage"]
                if not _has_text(event):
                    continue
                if pieces is not None:
                    pieces.append(_text_of(event))
                chunks += 1
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
        end = time.perf_counter()
        if not done:
            raise _Incomplete(f"stream ended after {chunks} chunks without [DONE]")
        if first is None:
            raise _Incomplete("no token received")
        if pieces is not None and self.answers is not None:
            self.answers[index] = "".join(pieces)
        return {
            "ttft_s": first - start,
            "itl_s": tuple(gaps),
            "e2e_s": end - start,
            "prompt_tokens": usage.get("prompt_tokens") if usage else spec.input_tokens,
            "output_tokens": int(usage["completion_tokens"]) if usage else chunks,
        }


async def _body_lines(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body's lines; a connection lost after the headers makes the request incomplete."""
    try:
        async for raw in resp.content:
            yield raw
    except aiohttp.ClientError as exc:
        raise _Incomplete(f"connection lost mid-stream: {exc!r}"[:300]) from None


class _HttpError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class _Incomplete(Exception):
    pass


def _text_of(event: dict[str, Any]) -> str:
    out = []
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        out.append(choice.get("text") or delta.get("content") or "")
    return "".join(out)


def _has_text(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or ():
        if choice.get("text"):
            return True
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content"):
            return True
    return False


ProgressFn = Callable[[Progress], None]


async def run_load(
    base_url: str | Sequence[str],
    model: str,
    plan: LoadPlan,
    *,
    progress: ProgressFn | None = None,
    progress_every_s: float = 2.0,
    around: contextlib.AbstractAsyncContextManager[Any] | None = None,
) -> LoadResult:
    """Run ``plan`` against the server at ``base_url`` and return every request's record.
    Given several base URLs (engine replicas), request ``i`` goes to the ``i mod n``-th.

    ``around`` (e.g. a :class:`~autotuner.measure.monitor.Monitor`) is entered after the warm-up and
    left when the measured part ends, so what it observes matches the records.

    Returns at the latest ``plan.hard_deadline()`` seconds after the measured part starts
    (plus the warm-up): requests still open then are cancelled and recorded as ``deadline``.
    """
    async with client_session() as session:
        warm_start = time.monotonic()
        warmed: WarmupRecord | None = None
        if plan.steady is not None:
            warmed = await warm_to_steady(session, base_url, model, plan, plan.steady)
            warmup_failed = warmed.failed
        else:
            warmup_failed = await _warmup(session, base_url, model, plan)
        warmup_s = time.monotonic() - warm_start
        async with around or contextlib.nullcontext():
            run = _Run(base_url, model, plan.api, plan.request_timeout_s)
            ticker = asyncio.create_task(_tick(run, plan, progress, progress_every_s))
            try:
                if plan.conversation is not None:
                    await _conversations(run, session, plan, plan.conversation)
                elif plan.arrival.open_loop:
                    await _open_loop(run, session, plan)
                else:
                    await _closed_loop(run, session, plan)
            finally:
                ticker.cancel()
        if progress:
            progress(_progress(run, plan))
    records = tuple(sorted(run.records, key=lambda r: r.index))
    return LoadResult(
        plan=plan.describe(),
        records=records,
        duration_s=run.last_end,
        warmup_failed=warmup_failed,
        warmup_s=warmup_s,
        warmup=None if warmed is None else warmed.to_dict(),
        scheduled=run.scheduled,
    )


async def warm_to_steady(
    session: aiohttp.ClientSession,
    base_url: str | Sequence[str],
    model: str,
    plan: LoadPlan,
    rule: SteadyRule,
) -> WarmupRecord:
    """Warm-up requests at ``plan``'s own load (its arrival rate or concurrency, prompts of
    their own) until :func:`autotuner.measure.steady.settled` or the rule's bound; waits for
    the requests still running. See :mod:`autotuner.measure.steady`."""
    run = _Run(base_url, model, plan.api, plan.request_timeout_s)
    done: dict[int, tuple[float | None, float | None, bool]] = {}
    windows: list[Window] = []
    stop: list[StopReason] = []

    def decide() -> bool:
        """Whether to stop sending; adds the windows whose requests all ended."""
        while all(
            i in done for i in range(len(windows) * rule.window, (len(windows) + 1) * rule.window)
        ):
            first = len(windows) * rule.window
            windows.append(window_of([done[i] for i in range(first, first + rule.window)]))
        if not stop:
            if windows and windows[-1].failed >= rule.window:
                stop.append("failed")  # the engine is not serving: the level will say why
            elif run.sent >= rule.least and settled(windows, rule):
                stop.append("steady")
            elif run.sent >= rule.most:
                stop.append("max_requests")
            elif time.perf_counter() - run.t0 >= rule.max_s:
                stop.append("max_s")
        return bool(stop)

    async def one(i: int, scheduled: float) -> None:
        index = _WARMUP_INDEX_BASE + i
        rec = await run.send(session, index, plan.factory.make(index), scheduled)
        done[i] = (rec.tpot_s, rec.ttft_s, rec.ok)

    tasks: list[asyncio.Task[None]] = []
    try:
        if plan.arrival.open_loop:
            pool = SendPool()
            for i, offset in enumerate(plan.offsets()):
                delay = run.t0 + min(offset, rule.max_s) - time.perf_counter()
                # Due or not, the requests created so far start first: decide() counts them.
                await asyncio.sleep(max(0.0, delay))
                if decide():
                    break
                task = await pool.start(functools.partial(one, i, offset), run.t0 + rule.max_s)
                if task is None:  # the pool stayed full until the time bound
                    break
                tasks.append(task)
        else:
            counter = itertools.count()

            async def worker() -> None:
                while not decide():
                    await one(next(counter), time.perf_counter() - run.t0)

            tasks = [asyncio.create_task(worker()) for _ in range(plan.arrival.concurrency or 1)]
        if tasks:  # the requests still running: at most max_s more, then they are cut
            left = run.t0 + 2 * rule.max_s - time.perf_counter()
            await asyncio.wait(tasks, timeout=max(rule.max_s / 2, left))
    finally:
        await _cancel(tasks)
    decide()
    reason: StopReason = stop[0] if stop else "max_requests"  # a replayed trace ran out
    return WarmupRecord(
        requests=run.sent,
        seconds=round(time.perf_counter() - run.t0, 3),
        steady=reason == "steady",
        stopped_by=reason,
        load=plan.arrival.describe(),
        failed=run.failed,
        windows=windows,
    )


async def _warmup(
    session: aiohttp.ClientSession, base_url: str | Sequence[str], model: str, plan: LoadPlan
) -> int:
    if plan.warmup_requests <= 0:
        return 0
    run = _Run(base_url, model, plan.api, plan.request_timeout_s)
    queue = iter(range(plan.warmup_requests))

    async def worker() -> None:
        for i in queue:
            index = _WARMUP_INDEX_BASE + i
            await run.send(session, index, plan.factory.make(index), 0.0)

    await asyncio.gather(*(worker() for _ in range(min(4, plan.warmup_requests))))
    return run.failed


async def _open_loop(run: _Run, session: aiohttp.ClientSession, plan: LoadPlan) -> None:
    deadline = run.t0 + plan.hard_deadline()  # requests still running then are cut
    sending = deadline  # no send leaves after this
    if plan.duration_s is not None:
        sending = min(deadline, run.t0 + plan.duration_s * (1 + OVERRUN))
    tasks: list[asyncio.Task[RequestRecord]] = []
    count = itertools.count() if plan.requests is None else range(plan.requests)
    pool = SendPool()
    try:
        for i, offset in zip(count, plan.offsets(), strict=False):
            if plan.duration_s is not None and offset >= plan.duration_s:
                break
            if run.t0 + offset >= deadline:
                break
            delay = run.t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif time.perf_counter() >= sending:  # behind, and out of time
                run.scheduled = scheduled_requests(plan, len(tasks))
                break
            send = functools.partial(run.send, session, i, plan.factory.make(i), offset)
            task = await pool.start(send, sending)
            if task is None:  # the pool stayed full until the end of the sending
                run.scheduled = scheduled_requests(plan, len(tasks))
                break
            tasks.append(task)
        remaining = deadline - time.perf_counter()
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, remaining))
    finally:
        await _cancel(tasks)


def scheduled_requests(plan: LoadPlan, sent: int) -> int:
    """The requests ``plan``'s schedule holds (at least ``sent``): its request count, or those
    due within its duration (a Poisson schedule's expected number)."""
    n, span = plan.requests, plan.duration_s
    if span is not None:
        rate = plan.arrival.rate
        if plan.arrival.process != "trace" and rate:
            by_time = math.ceil(rate * span)
        else:  # a trace's own times: counted, as far as a level could go
            times = itertools.islice(plan.offsets(), MAX_REQUESTS)
            by_time = len([t for t in times if t < span])
        n = by_time if n is None else min(n, by_time)
    return max(n or 0, sent)


async def _conversations(
    run: _Run, session: aiohttp.ClientSession, plan: LoadPlan, factory: ConversationFactory
) -> None:
    answers: dict[int, str] = {}
    run.answers = answers

    async def send(index: int, spec: RequestSpec, scheduled: float) -> tuple[RequestRecord, str]:
        record = await run.send(session, index, spec, scheduled)
        return record, answers.pop(index, "")

    await drive(
        factory,
        send,
        arrival=plan.arrival,
        requests=plan.requests,
        duration_s=plan.duration_s,
        t0=run.t0,
        deadline=run.t0 + plan.hard_deadline(),
    )


async def _closed_loop(run: _Run, session: aiohttp.ClientSession, plan: LoadPlan) -> None:
    assert plan.arrival.concurrency is not None
    indexes = itertools.count()

    async def worker() -> None:
        for i in indexes:
            if plan.requests is not None and i >= plan.requests:
                return
            elapsed = time.perf_counter() - run.t0
            if plan.duration_s is not None and elapsed >= plan.duration_s:
                return
            await run.send(session, i, plan.factory.make(i), elapsed)

    tasks = [asyncio.create_task(worker()) for _ in range(plan.arrival.concurrency)]
    try:
        await asyncio.wait(tasks, timeout=plan.hard_deadline())
    finally:
        await _cancel(tasks)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


def _progress(run: _Run, plan: LoadPlan) -> Progress:
    return Progress(
        sent=run.sent,
        done=len(run.records),
        failed=run.failed,
        total=plan.requests,
        elapsed_s=time.perf_counter() - run.t0,
    )


async def _tick(run: _Run, plan: LoadPlan, progress: ProgressFn | None, every: float) -> None:
    if progress is None:
        return
    while True:
        await asyncio.sleep(every)
        progress(_progress(run, plan))
