"""Where trials run: in this process, one after the other, or as Ray tasks across a cluster.

The study loop only submits ``(params, trial_dir)`` and waits for results; it never knows
which executor it has. The local executor runs each trial when the loop waits for it. The
Ray executor (:mod:`autotuner.search.ray_executor`, imported only when asked for) runs each one as
a Ray task that holds the GPUs its parallelism needs.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Protocol

from autotuner.core.types import ParamValue
from autotuner.engines.base import OptionRoles
from autotuner.engines.layout import devices_used
from autotuner.search.trial import TrialResult


class RunTrial(Protocol):
    """Runs one trial: ``(params, trial_dir)``, and with ``start_load`` (a candidate raced
    against the incumbent) the first level at that load instead of the SLA's own."""

    def __call__(
        self, params: Mapping[str, ParamValue], trial_dir: Path, /, *, start_load: float = ...
    ) -> TrialResult: ...


class Executor(Protocol):
    """Runs trials for the study loop. The contract, which
    tests/unit/search/test_executor_contract.py checks for every executor:

    - ``capacity()`` is at least 1; the loop keeps at most that many trials in flight.
    - ``submit`` returns a handle that is hashable and new for every submission (the same
      params submitted twice are two trials).
    - ``wait_any``, called while a trial is in flight, returns at least one ``(handle,
      result)``; every handle comes back exactly once, with the result of its own params.
    - A trial that fails (the engine does not start, the worker running it is lost) comes
      back as a result with status ``failed`` and a ``cause``, not as an exception; the other
      trials go on.
    - ``close()`` drops what is still queued or running; calling it again does nothing.
    """

    name: str

    def capacity(self) -> int:
        """How many trials may be in flight at once now."""

    def submit(
        self, params: dict[str, ParamValue], trial_dir: Path, *, start_load: float | None = None
    ) -> Hashable:
        """Start a trial (or queue it); its artifacts end up in ``trial_dir``. ``start_load``:
        its first level's load (a candidate raced against the incumbent); None: the SLA's own."""

    def wait_any(self) -> list[tuple[Hashable, TrialResult]]:
        """Block until at least one submitted trial is settled; return those settled."""

    def close(self) -> None: ...


class LocalExecutor:
    """Runs trials in this process, one at a time (the engine owns the device)."""

    name = "local"

    def __init__(self, run: RunTrial) -> None:
        self.run = run
        self._queue: list[tuple[object, dict[str, ParamValue], Path, float | None]] = []

    def capacity(self) -> int:
        return 1

    def submit(
        self, params: dict[str, ParamValue], trial_dir: Path, *, start_load: float | None = None
    ) -> Hashable:
        handle = object()
        self._queue.append((handle, params, trial_dir, start_load))
        return handle

    def wait_any(self) -> list[tuple[Hashable, TrialResult]]:
        handle, params, trial_dir, start = self._queue.pop(0)
        if start is None:
            return [(handle, self.run(params, trial_dir))]
        return [(handle, self.run(params, trial_dir, start_load=start))]

    def close(self) -> None:
        self._queue.clear()


def gpus_needed(params: Mapping[str, ParamValue], roles: OptionRoles) -> int:
    """GPUs one config takes: tensor x pipeline x data parallel size (every replica), read
    through the engine's option ``roles``."""
    return devices_used(params, roles)
