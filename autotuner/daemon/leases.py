"""Device leases: one job per GPU set at a time, and a GPU is reused only once it is free.

A job asks for the devices its SLA targets (``cpu`` is one device of its own: trials on a
shared CPU would measure each other). A GPU is leasable when it is not excluded by the
config, not held by another job, shows no compute process of anyone else, and — after a
job released it — NVML shows its memory back under the idle threshold (an engine's memory is
freed some time after its process group is gone; a trial started earlier would measure
less memory than it has and could fail with out-of-memory).

Leases are host-wide: with ``host`` locks (:mod:`autotuner.daemon.hostlocks`), a device
another daemon on the host holds is not leasable either, whatever its state directory.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from autotuner.core.errors import BadInput
from autotuner.daemon.hostlocks import DeviceBusy, HostLocks


class GpuView(Protocol):
    """What the leases need from NVML (a fake in tests)."""

    def resolve(self, device: str) -> str | None:
        """Index or UUID -> canonical index as a string; None if there is no such GPU."""

    def memory_used_mib(self, index: str) -> float: ...

    def foreign_pids(self, index: str, ours: set[int]) -> list[int]:
        """PIDs of compute processes on the GPU that are not in ``ours``."""


class NvmlView:
    """The real GPUs, through pynvml (nvidia-ml-py)."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()

    def _handle(self, index: str) -> object:
        return self._nvml.nvmlDeviceGetHandleByIndex(int(index))

    def resolve(self, device: str) -> str | None:
        nv = self._nvml
        try:
            if device.isdigit():
                return device if int(device) < nv.nvmlDeviceGetCount() else None
            handle = nv.nvmlDeviceGetHandleByUUID(device)
            return str(nv.nvmlDeviceGetIndex(handle))
        except nv.NVMLError:
            return None

    def memory_used_mib(self, index: str) -> float:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle(index))
        return float(info.used) / 2**20

    def foreign_pids(self, index: str, ours: set[int]) -> list[int]:
        procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle(index))
        return [p.pid for p in procs if p.pid not in ours]


def open_gpu_view() -> GpuView | None:
    """NVML if a driver is there, else None (a CPU-only host)."""
    with contextlib.suppress(Exception):
        return NvmlView()
    return None


class LeaseError(BadInput):
    """The job can never get its devices (excluded or nonexistent): fail it, do not wait."""


@dataclass
class Leases:
    gpus: GpuView | None
    exclude: Sequence[str] = ()
    idle_mib: float = 1024.0
    free_timeout_s: float = 120.0
    holders: dict[str, int] = field(default_factory=dict)  # device -> job id
    draining: dict[str, float] = field(default_factory=dict)  # device -> released at
    stuck: set[str] = field(default_factory=set)  # never freed after a release
    host: HostLocks | None = None  # host-wide locks shared with other daemons

    def devices_for(self, target_kind: str, devices: Sequence[str]) -> list[str]:
        """Canonical device names for an SLA target; raises LeaseError when impossible."""
        if target_kind == "cpu":
            return ["cpu"]
        if self.gpus is None:
            raise LeaseError("the SLA targets a GPU but this host has no NVIDIA driver (NVML)")
        excluded = {self.gpus.resolve(d) or d for d in self.exclude}
        out = []
        for d in devices:
            index = self.gpus.resolve(d)
            if index is None:
                raise LeaseError(f"no GPU {d!r} on this host")
            if index in excluded:
                raise LeaseError(f"GPU {d} is excluded in the daemon's config (exclude_gpus)")
            out.append(f"gpu{index}")
        return out

    def available(self, wanted: Sequence[str], ours: set[int]) -> str | None:
        """None if every device can be leased now, else why not (for the status page)."""
        for dev in wanted:
            if dev in self.holders:
                return f"{dev} is leased to job {self.holders[dev]}"
            if self.host is not None:
                try:
                    free = self.host.free(dev)
                except OSError as exc:
                    return f"{dev}: its host-wide lock file can't be used: {exc}"
                if not free:
                    who = self.host.holder(dev)
                    return f"{dev} is leased by another autotuner daemon on this host ({who})"
            if dev == "cpu" or self.gpus is None:
                continue
            index = dev.removeprefix("gpu")
            foreign = self.gpus.foreign_pids(index, ours)
            if foreign:
                return f"{dev} is used by other processes (pids {foreign[:5]})"
            if dev in self.draining:
                used = self.gpus.memory_used_mib(index)
                if used > self.idle_mib:
                    if time.monotonic() - self.draining[dev] > self.free_timeout_s:
                        self.stuck.add(dev)
                    return f"{dev} still shows {used:.0f} MiB used after the last job"
                del self.draining[dev]
                self.stuck.discard(dev)
        return None

    def acquire(self, wanted: Sequence[str], job_id: int) -> None:
        """Lease ``wanted`` to ``job_id``, all or none. Raises DeviceBusy when another daemon
        on the host took one of them since ``available`` said yes."""
        for dev in wanted:
            if dev in self.holders:
                raise RuntimeError(f"{dev} already leased to job {self.holders[dev]}")
        taken: list[str] = []
        for dev in wanted:
            if self.host is not None:
                try:
                    ok = self.host.take(dev)
                except OSError as exc:
                    ok, why = False, f"{dev}: its host-wide lock file can't be used: {exc}"
                else:
                    why = f"{dev} is leased by another autotuner daemon on this host"
                if not ok:
                    for t in taken:
                        self.host.drop(t)
                    raise DeviceBusy(why)
                taken.append(dev)
        for dev in wanted:
            self.holders[dev] = job_id

    def release(self, job_id: int, *, used: bool = True) -> None:
        """Free the devices of ``job_id``; ``used=False`` when its process never started (a
        GPU needs no time to drain then)."""
        for dev, holder in list(self.holders.items()):
            if holder == job_id:
                del self.holders[dev]
                if self.host is not None:
                    self.host.drop(dev)
                if dev != "cpu" and used:
                    self.draining[dev] = time.monotonic()

    def snapshot(self) -> dict[str, object]:
        return {
            "held": dict(self.holders),
            "draining": sorted(self.draining),
            "not_freed": sorted(self.stuck),
            "excluded": list(self.exclude),
            "lock_dir": str(self.host.dir) if self.host is not None else None,
        }


def our_pids() -> set[int]:
    """This daemon and all its descendants (job processes, their engines)."""
    import psutil

    me = psutil.Process(os.getpid())
    with contextlib.suppress(psutil.Error):
        return {me.pid, *(p.pid for p in me.children(recursive=True))}
    return {me.pid}
