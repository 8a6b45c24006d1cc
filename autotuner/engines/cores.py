"""Which CPU cores an engine on a CPU target may run on: all the tuner may use but one, which
the load generator keeps.

A load generator that shares its cores with the engine measures the engine's scheduling, not
its latency. The CPU engine measured on this project's 2-core host binds its compute threads
to core 0 and leaves core 1 to its API server, where another of its processes polls for the
compute's results. A process that shares core 1 with them then waits for seconds, as long as
the engine is busy: a sleeping probe there woke 2 s late every 2 s (one 768-token answer), the
load generator sent late and saw whole answers arrive at once (TTFT = end-to-end time). With
every engine process on core 0 the probe's longest delay was 10 ms and no stream stalled
(``benchmarks/engine_cores.py``, results in ``benchmarks/README.md``).

So every process of the engine gets the usable cores but the last (the process affinity,
which its children inherit), when that leaves a core for each engine rank; else the engine
gets them all and the load generator shares them, as it would otherwise. An SLA that pins
the engine's threads itself (the engine's binding variable in ``engine.env``) keeps its own
placement: the tuner then pins nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass


def usable_cpus() -> list[int]:
    """The CPU cores this process may run on (its affinity), in order."""
    return sorted(os.sched_getaffinity(0))


@dataclass(frozen=True)
class CoreShare:
    """The engine's cores and those kept for the load generator (empty: it shares them)."""

    engine: tuple[int, ...]
    kept: tuple[int, ...]


def share_cores(cpus: Sequence[int], ranks: int) -> CoreShare:
    """How an engine of ``ranks`` ranks (a core each at least) and the load generator share
    ``cpus``."""
    if ranks < 1:
        raise ValueError("an engine has at least one rank")
    ordered = tuple(sorted(set(cpus)))
    if len(ordered) - 1 < ranks:
        return CoreShare(ordered, ())
    return CoreShare(ordered[:-1], ordered[-1:])
