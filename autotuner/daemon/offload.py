"""Blocking work off the daemon's event loop, on a thread a stop never waits for.

Parsing an SLA (YAML, validation, reading a dataset) can take seconds; on the event loop it
would stall the API, job supervision and SIGTERM. ``asyncio.to_thread`` would move it off the
loop, but its executor's threads are joined when the loop closes, so one stuck parse would
still hold the daemon's exit. These threads are daemon threads: the process exits without
them, and nothing they hold needs saving (a parse writes nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def off_loop(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on its own daemon thread; its result or exception here."""
    return await _on_thread(lambda: fn(*args, **kwargs), getattr(fn, "__name__", "work"))


def _on_thread(call: Callable[[], T], name: str) -> asyncio.Future[T]:
    """Start ``call`` on a daemon thread now; the future of its result on this loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle_result(value: T) -> None:
        if not future.done():
            future.set_result(value)

    def settle_error(exc: BaseException) -> None:
        if not future.done():
            future.set_exception(exc)

    def work() -> None:
        try:
            value = call()
        except BaseException as exc:  # handed to the awaiting task, which decides
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle_error, exc)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle_result, value)

    threading.Thread(target=work, name=f"autotuner-{name}", daemon=True).start()
    return future


class ParsesBusy(Exception):
    """No validation slot will be free soon: the caller answers 503 at once."""


@dataclass
class _Parse:
    done: bool = False  # its thread ended
    abandoned: bool = False  # its caller stopped waiting first


class ParseSlots:
    """At most ``limit`` validation threads at once, each counted until its thread *ends*.

    A caller may stop waiting for a parse (its time-out: a 503), but the thread can't be
    stopped and keeps its CPU and memory, so it keeps its slot too: a flood of slow
    submissions holds ``limit`` threads, never one per request. Callers wait for a slot on the
    event loop, within their time-out; :meth:`run` refuses at once when every slot is held by
    a parse whose caller gave up (it may run for long), or ``max_waiting`` callers wait already.
    """

    def __init__(self, limit: int, max_waiting: int) -> None:
        self.limit = limit
        self.max_waiting = max_waiting
        self._lock = threading.Lock()  # parse threads change the counts too
        self._alive = 0  # parse threads running
        self._abandoned = 0  # of which their caller stopped waiting
        self._waiting = 0  # callers waiting for a slot
        self._freed: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def busy(self) -> str | None:
        """Why a new caller is refused right now, or None."""
        with self._lock:
            if self._abandoned >= self.limit:
                return (
                    f"the daemon is still running {self._abandoned} earlier validations that "
                    "went past their time limit"
                )
            if self._waiting >= self.max_waiting:
                return f"{self._waiting} submissions are already waiting to be validated"
        return None

    def _event(self) -> asyncio.Event:
        """Set when a slot frees (one event per loop: tests run several loops in turn)."""
        loop = asyncio.get_running_loop()
        if self._freed is None or self._freed[0] is not loop:
            self._freed = (loop, asyncio.Event())
        return self._freed[1]

    def _take(self) -> bool:
        with self._lock:
            if self._alive >= self.limit:
                return False
            self._alive += 1
            return True

    def _end(self, parse: _Parse) -> None:
        """On the parse thread, as it ends."""
        with self._lock:
            parse.done = True
            self._alive -= 1
            if parse.abandoned:
                self._abandoned -= 1
            freed = self._freed
        if freed is not None:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits on it
                freed[0].call_soon_threadsafe(freed[1].set)

    async def _slot(self, deadline: float) -> None:
        """Wait until a slot is taken for this caller (TimeoutError, ParsesBusy)."""
        loop = asyncio.get_running_loop()
        while not self._take():
            freed = self._event()
            freed.clear()  # in the step that found no slot, so a release after it sets it
            with self._lock:
                stuck = self._abandoned >= self.limit
            if stuck:
                raise ParsesBusy(self.busy() or "no validation slot is free")
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(freed.wait(), min(left, 1.0))

    async def run(
        self, timeout_s: float, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(*args, **kwargs)`` on a daemon thread once a slot is free. ParsesBusy when
        refused at once; TimeoutError when waiting and running took over ``timeout_s`` (the
        thread then runs on, holding its slot)."""
        why = self.busy()
        if why is not None:
            raise ParsesBusy(why)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        with self._lock:
            self._waiting += 1
        try:
            await self._slot(deadline)
        finally:
            with self._lock:
                self._waiting -= 1
        parse = _Parse()

        def work() -> T:
            try:
                return fn(*args, **kwargs)
            finally:
                self._end(parse)

        # started here, not in a task a time-out could cancel first: its slot comes back
        running = _on_thread(work, getattr(fn, "__name__", "work"))
        try:
            return await asyncio.wait_for(running, max(0.0, deadline - loop.time()))
        except BaseException:  # time-out or cancelled: the thread runs on without its caller
            with self._lock:
                if not parse.done:
                    parse.abandoned = True
                    self._abandoned += 1
            raise
