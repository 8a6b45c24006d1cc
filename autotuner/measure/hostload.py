"""The host is part of the measurement: its load before and during a launch (issue 28).

A CPU engine's latency follows the host's load (docs/benchmarks/warmup.md: on a shared 2-core
host the same level's mean TPOT ranged 8-73 ms with the 1-minute load average at 3.6-11.2,
and the quick start measured the defaults at 0 and at 4.27 req/s ten minutes apart), and the
load generator shares the host on every target. So every launch records, before the engine
starts and while it runs: the 1-minute load average (``os.getloadavg``) and the share of the
host's cores that processes other than the engine and the tuner used (``psutil``: their CPU
seconds over the wall seconds times the cores).

"Ours" is this process, its descendants (the engine's processes, replicas, compile workers)
and its ancestors (the command that started the tuner). The load average counts our own
processes too (and, for a minute, the previous launch's engine), so it is recorded but does
not decide; the other processes' CPU share does: a host is **busy** when they used more than
:data:`BUSY_SHARE` (a quarter) of its cores, before the launch or on average during it. A
process that starts or ends between two samples (5 s apart during a launch) is not counted,
so a host busy with many short processes reads quieter than it is.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psutil

from autotuner.core import procs

BUSY_SHARE = 0.25  # other processes using more than this share of the cores: a busy host

_Key = tuple[int, float]  # (pid, start stamp): one process, even after its pid is reused


def _ours(extra: Iterable[int] = ()) -> set[int]:
    """This process, its ancestors and descendants, and ``extra`` pids (with theirs)."""
    pids = {os.getpid(), *extra}
    try:
        me = psutil.Process()
        pids |= {p.pid for p in me.parents()}
        pids |= {p.pid for p in me.children(recursive=True)}
    except psutil.Error:
        pass
    for pid in list(extra):
        try:
            pids |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            continue
    return pids


def _cpu_seconds(exclude: set[int]) -> dict[_Key, float]:
    """CPU seconds (user + system) so far of every process not in ``exclude``."""
    out: dict[_Key, float] = {}
    for p in psutil.process_iter(["pid", "cpu_times"]):
        info = p.info
        if info["pid"] in exclude or info["cpu_times"] is None:
            continue
        # Not create_time(): it moves with the wall clock, and the process would look new.
        stamp = procs.start_stamp(info["pid"])
        if stamp is not None:
            t = info["cpu_times"]
            out[(info["pid"], stamp)] = t.user + t.system
    return out


def _share(a: dict[_Key, float], b: dict[_Key, float], wall_s: float, cores: int) -> float:
    """The share of ``cores`` the processes in both snapshots used between them."""
    if wall_s <= 0:
        return 0.0
    used = sum(max(0.0, b[k] - a[k]) for k in b.keys() & a.keys())
    return used / (wall_s * cores)


def cores() -> int:
    """The cores this process may run on (the host's when affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class HostSample:
    """The host at one moment: 1-minute load average, other processes' share of the cores."""

    load1: float
    others_share: float
    cores: int

    @property
    def busy(self) -> bool:
        return self.others_share > BUSY_SHARE

    def describe(self) -> str:
        """``other processes used 1.3 of 2 cores (65%), load average 3.10``."""
        used = self.others_share * self.cores
        return (
            f"other processes used {used:.1f} of {self.cores} cores ({self.others_share:.0%}), "
            f"load average {self.load1:.2f}"
        )


def sample(interval_s: float = 1.0, exclude: Iterable[int] = ()) -> HostSample:
    """The host now, other processes' CPU share measured over ``interval_s`` (blocks)."""
    ours = _ours(exclude)
    n = cores()
    t0, a = time.monotonic(), _cpu_seconds(ours)
    time.sleep(interval_s)
    t1, b = time.monotonic(), _cpu_seconds(_ours(exclude))
    return HostSample(os.getloadavg()[0], _share(a, b, t1 - t0, n), n)


class HostWatch:
    """Samples the host in a background thread while a launch runs (:meth:`start`,
    :meth:`stop`); :meth:`record` is what the trial record keeps under ``extra["host"]``."""

    def __init__(self, every_s: float = 5.0, before_s: float = 0.5) -> None:
        self.every_s = every_s
        self.before_s = before_s
        self.before: HostSample | None = None
        self._loads: list[float] = []
        self._shares: list[tuple[float, float]] = []  # (share, wall seconds it covers)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Sample the host before the launch (blocks ``before_s``), then watch it."""
        try:
            self.before = sample(self.before_s)
        except (psutil.Error, OSError):
            self.before = None
        self._thread = threading.Thread(target=self._watch, name="host-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        n = cores()
        try:
            t0, a = time.monotonic(), _cpu_seconds(_ours())
        except (psutil.Error, OSError):
            return
        while not self._stop.wait(self.every_s):
            self._take(n, t0, a)
            t0, a = time.monotonic(), _cpu_seconds(_ours())
        self._take(n, t0, a)

    def _take(self, n: int, t0: float, a: dict[_Key, float]) -> None:
        try:
            t1, b = time.monotonic(), _cpu_seconds(_ours())
        except (psutil.Error, OSError):
            return
        if t1 - t0 >= 0.2:
            self._shares.append((_share(a, b, t1 - t0, n), t1 - t0))
            self._loads.append(os.getloadavg()[0])

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        return self.record()

    def record(self) -> dict[str, Any]:
        """``{cores, busy, before: {load1, others_share}, during: {...}}`` (see the module
        docstring; ``during`` is absent when the launch ended before a sample)."""
        out: dict[str, Any] = {"cores": cores(), "busy_share": BUSY_SHARE}
        busy = False
        if self.before is not None:
            out["before"] = {
                "load1": round(self.before.load1, 2),
                "others_share": round(self.before.others_share, 3),
            }
            busy = self.before.busy
        if self._shares:
            wall = sum(w for _, w in self._shares)
            mean = sum(s * w for s, w in self._shares) / wall if wall else 0.0
            out["during"] = {
                "load1_max": round(max(self._loads), 2),
                "load1_mean": round(sum(self._loads) / len(self._loads), 2),
                "others_share_mean": round(mean, 3),
                "others_share_max": round(max(s for s, _ in self._shares), 3),
                "samples": len(self._shares),
            }
            busy = busy or mean > BUSY_SHARE
        out["busy"] = busy
        return out


def describe(record: dict[str, Any]) -> str:
    """A trial record's ``host`` in words: ``busy host: other processes used 45% of 2 cores
    before the launch, 38% during it (load average up to 3.4)``."""
    n = record.get("cores", "?")
    before = record.get("before") or {}
    during = record.get("during") or {}
    parts = []
    if "others_share" in before:
        parts.append(f"{before['others_share']:.0%} before the launch")
    if "others_share_mean" in during:
        parts.append(f"{during['others_share_mean']:.0%} during it")
    load = during.get("load1_max", before.get("load1"))
    head = "busy host" if record.get("busy") else "quiet host"
    said = f"{head}: other processes used {', '.join(parts) or '?'} of {n} cores"
    return said + (f" (load average up to {load:.2f})" if load is not None else "")


def busy_warning(device: str, found: HostSample | None = None) -> str | None:
    """``tune``'s warning when other processes use the cores now (sampled over a second
    unless ``found`` is given); None on a quiet host."""
    try:
        found = found or sample(1.0)
    except (psutil.Error, OSError):
        return None
    if not found.busy:
        return None
    what = "the CPU engine's latency" if device == "cpu" else "the load generator's sending"
    return (
        f"{found.describe()}: {what} follows their load, so capacities measured now may not "
        "hold on a quiet host; each launch records the host's load and `report` marks those "
        "measured on a busy host"
    )
