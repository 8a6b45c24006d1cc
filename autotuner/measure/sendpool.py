"""The load generator's bound on the requests it holds in flight.

An open loop sends every request at its scheduled time, whatever the server does. Each request
in flight holds a task, a connection (a file descriptor) and its buffers. Scheduled at 1e8
req/s, every send of the warm-up was already due, so the loop created tasks without ever
yielding to the event loop: none of them started, the warm-up's stop rule never saw a request
sent, and the process grew to 9.5 GB and 20,000 open files while SIGTERM waited for a yield.

So a send first takes a slot of a :class:`SendPool`: at most :func:`in_flight_limit` requests
are in flight. A send due while every slot is taken waits for one, and leaves late: its lag
says so (a level sent behind its schedule is undecided, :mod:`autotuner.measure.pacing`).
Every send also yields to the event loop once, so the requests already sent, progress, the
deadline and a cancellation (SIGTERM) run however far behind the schedule is.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from autotuner.sla.bounds import MAX_CONCURRENCY

# File descriptors left to the rest of the process (logs, the engine monitor, the host watch,
# the engine's pipes): a generator that took them all made the host watch fail on "Too many
# open files".
FD_RESERVE = 256

T = TypeVar("T")


def in_flight_limit() -> int:
    """The most requests the generator holds at once: a connection each, within the process's
    open-file limit less :data:`FD_RESERVE`, and never more than a closed loop may keep
    (``MAX_CONCURRENCY``)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONCURRENCY
    return max(1, min(MAX_CONCURRENCY, soft - FD_RESERVE))


class SendPool:
    """Slots for requests in flight; :meth:`start` runs a send in one."""

    def __init__(self, size: int | None = None) -> None:
        self.size = size if size is not None else in_flight_limit()
        if self.size < 1:
            raise ValueError(f"a send pool needs at least one slot, got {self.size}")
        self._free = asyncio.Semaphore(self.size)
        self.in_flight = 0
        self.peak = 0  # the most requests in flight at once

    async def start(
        self, make: Callable[[], Coroutine[Any, Any, T]], until: float | None = None
    ) -> asyncio.Task[T] | None:
        """Start ``make()`` (a coroutine function of no arguments) as a task once a slot is
        free; the slot is freed when the task ends. None when ``until`` (a
        ``time.perf_counter()`` time) came first: nothing was started."""
        await asyncio.sleep(0)  # a due send still lets the running requests and a cancel in
        if self._free.locked():
            left = None if until is None else until - time.perf_counter()
            if left is not None and left <= 0:
                return None
            try:
                await asyncio.wait_for(self._free.acquire(), timeout=left)
            except TimeoutError:
                return None
        else:
            await self._free.acquire()  # free: returns at once
        task = asyncio.create_task(make())
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        task.add_done_callback(self._release)
        return task

    def _release(self, _: asyncio.Task[Any]) -> None:
        self.in_flight -= 1
        self._free.release()
