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
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def off_loop(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on its own daemon thread; its result or exception here."""
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
            value = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the awaiting task, which decides
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle_error, exc)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle_result, value)

    threading.Thread(target=work, name=f"autotuner-{fn.__name__}", daemon=True).start()
    return await future
