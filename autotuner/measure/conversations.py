"""Multi-turn conversations: turns that resend the history, in order, with think time.

Each conversation sends ``turns`` requests. Turn ``t`` carries the system prompt (when the
workload has shared prefixes), every earlier user message and the answer the engine actually
gave to it, and a new user message; it leaves ``think_time_s`` after the previous answer
arrived, never before. So the engine sees what a chat service sees: a growing prompt whose
front it has computed before.

New conversations start by the workload's arrival process at ``rate / turns``: the request
rate stays the SLA's ``rate`` (requests per second, as capacity is measured), and a closed loop
keeps ``concurrency`` conversations going. Request ``c * turns + t`` is turn ``t`` of
conversation ``c``; a level sends its ``requests`` turns (the last conversation may be cut
short). Prompts are words (the history must be text: the answer comes back as text), for the
completions API joined into one prompt, for chat as messages.

A failed turn does not end its conversation: the next one follows with an empty answer in the
history, so every level sends the turns it planned and the failure counts against the SLA.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from autotuner.measure.sendpool import SendPool
from autotuner.measure.synthetic import SharedPrefix, prefix_of, with_prefix
from autotuner.workload.requests import Arrival, RequestFactory, RequestSpec

if TYPE_CHECKING:
    from autotuner.measure.loadgen import RequestRecord
    from autotuner.sla.spec import Workload

# Key of the user messages' seeded stream (apart from single requests').
_TURN = 0xC0F

Send = Callable[[int, RequestSpec, float], Awaitable[tuple["RequestRecord", str]]]


@dataclass(frozen=True)
class Turn:
    """One turn as sent: the request, and the user message it adds to the history."""

    spec: RequestSpec
    user: str


@dataclass(frozen=True)
class ConversationFactory:
    """Builds turn ``t`` of conversation ``c`` from ``(seed, c * turns + t)`` and the history."""

    base: RequestFactory  # api, prompt source, lengths, seed, first index, system prompts
    turns: int
    think_time_s: float = 0.0

    def turn(self, c: int, t: int, history: list[tuple[str, str]]) -> Turn:
        """``history``: the earlier turns' (user message, answer)."""
        b = self.base
        index = b.first_index + c * self.turns + t
        rng = np.random.default_rng([b.seed, index, _TURN])
        assert b.input_len is not None, "conversations need synthetic prompts"
        n_in = b.input_len.sample(rng)
        out = b.output_len.sample(rng)
        user, _ = b.source.text(n_in, rng)
        prefix = prefix_of(b)
        # The system prompt is that of the conversation's first request.
        first = b.first_index + c * self.turns
        system = prefix.text(b.source, b.seed, first)[0] if prefix else None
        if b.api == "chat":
            messages: list[dict[str, Any]] = []
            if system is not None:
                messages.append({"role": "system", "content": system})
            for said, answer in history:
                messages.append({"role": "user", "content": said})
                messages.append({"role": "assistant", "content": answer})
            messages.append({"role": "user", "content": user})
            return Turn(RequestSpec(out, messages=messages), user)
        parts = [system] if system is not None else []
        for said, answer in history:
            parts += [said, answer]
        parts.append(user)
        return Turn(RequestSpec(out, prompt=" ".join(p for p in parts if p)), user)

    def describe(self) -> dict[str, Any]:
        return {"turns": self.turns, "think_time_s": self.think_time_s}

    def conversation_arrival(self, arrival: Arrival) -> Arrival:
        """New conversations' arrivals: the open-loop rate divided by the turns."""
        if not arrival.open_loop or arrival.rate is None:
            return arrival
        return Arrival(arrival.process, arrival.rate / self.turns)


def synthetic_traffic(
    w: Workload, factory: RequestFactory
) -> tuple[RequestFactory, ConversationFactory | None]:
    """The workload's shared system prompts and conversations around ``factory``."""
    p = w.shared_prefix
    factory = with_prefix(factory, SharedPrefix(p.prompts, p.tokens, p.share) if p else None)
    c = w.conversation
    return factory, ConversationFactory(factory, c.turns, c.think_time_s) if c else None


async def drive(
    factory: ConversationFactory,
    send: Send,
    *,
    arrival: Arrival,
    requests: int | None,
    duration_s: float | None,
    t0: float,
    deadline: float,
) -> None:
    """Run the conversations until ``requests`` turns are sent or ``duration_s`` has passed.

    ``t0``: the run's start (``time.perf_counter()``); ``deadline``: the absolute time at which
    turns still open are cancelled.
    """
    turns = factory.turns
    conversations = None if requests is None else math.ceil(requests / turns)

    def late(offset: float) -> bool:
        return (duration_s is not None and offset >= duration_s) or t0 + offset >= deadline

    async def talk(c: int, start: float) -> None:
        history: list[tuple[str, str]] = []
        scheduled = start
        for t in range(turns):
            index = c * turns + t
            if requests is not None and index >= requests:
                return
            if t > 0:
                scheduled = time.perf_counter() - t0 + factory.think_time_s
                if late(scheduled):
                    return
                await asyncio.sleep(factory.think_time_s)
            turn = factory.turn(c, t, history)
            record, answer = await send(index, turn.spec, scheduled)
            history.append((turn.user, answer if record.ok else ""))

    tasks: list[asyncio.Task[None]] = []
    try:
        if arrival.open_loop:
            starts = factory.conversation_arrival(arrival).offsets(factory.base.seed)
            count = itertools.count() if conversations is None else range(conversations)
            pool = SendPool()  # a conversation holds one request in flight at a time
            for c, offset in zip(count, starts, strict=False):
                if late(offset):
                    break
                delay = t0 + offset - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = await pool.start(functools.partial(talk, c, offset), deadline)
                if task is None:  # the pool stayed full until the deadline
                    break
                tasks.append(task)
        else:
            assert arrival.concurrency is not None
            numbers = itertools.count()

            async def worker() -> None:
                for c in numbers:
                    elapsed = time.perf_counter() - t0
                    if (conversations is not None and c >= conversations) or late(elapsed):
                        return
                    await talk(c, elapsed)

            tasks = [asyncio.create_task(worker()) for _ in range(arrival.concurrency)]
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
    finally:
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*pending, return_exceptions=True)
