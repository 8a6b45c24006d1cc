"""Watches an engine while it is under load: peak memory and the engine's own metrics.

Memory is the engine's GPU memory from NVML on a GPU target (per process where the driver
reports it, else the whole device), and the resident memory of its process tree on CPU.
The engine's Prometheus ``/metrics`` is scraped before and after the run (counter deltas,
mean queue / prefill / decode times) and sampled during it (peak KV-cache use, queue depth);
which sample names mean what is the engine adapter's :class:`~autotuner.engines.base.MetricNames`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

from autotuner.core.hardware import nvml_text
from autotuner.engines.base import MetricNames
from autotuner.measure.cache import cached_share

logger = logging.getLogger(__name__)

Samples = dict[str, float]


def parse_metrics(text: str, shares: frozenset[str] = frozenset()) -> Samples:
    """Prometheus text -> ``{sample name: value summed over label sets}``; a share (a
    fraction of one engine's KV cache, one label set per data-parallel rank) takes the
    highest of its label sets instead: summed, two ranks' 60 % read as 120 %."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            if sample.name in shares and sample.name in out:
                out[sample.name] = max(out[sample.name], value)
            else:
                out[sample.name] = out.get(sample.name, 0.0) + value
    return out


def merge_samples(parts: Sequence[Samples], gauges: frozenset[str]) -> Samples:
    """Several servers' scrapes as one (engine replicas): counters and histograms add up;
    a gauge (a share of one server's KV cache, its queue) is the highest of them."""
    out: Samples = {}
    for part in parts:
        for name, value in part.items():
            if name in gauges and name in out:
                out[name] = max(out[name], value)
            else:
                out[name] = out.get(name, 0.0) + value
    return out


def _first(samples: Samples, names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in samples:
            return samples[name]
    return None


def engine_summary(
    before: Samples,
    after: Samples,
    peaks: dict[str, float],
    metrics: MetricNames,
) -> dict[str, Any]:
    """Counter deltas, mean phase times and peaks from two scrapes and the sampled gauges.

    ``metrics``: the engine's metric names (its adapter's).
    """
    names_of = metrics
    out: dict[str, Any] = {}
    for key, names in names_of.counters.items():
        a, b = _first(after, names), _first(before, names)
        if a is not None:
            out[key] = a - (b or 0.0)
    if out.get("prefix_cache_queries"):
        out["prefix_cache_hit_rate"] = (
            out.get("prefix_cache_hits", 0.0) / out["prefix_cache_queries"]
        )
    if (share := cached_share(out)) is not None:
        out["prompt_cached_share"] = share
    for phase, name in names_of.phases.items():
        count = after.get(name + "_count", 0.0) - before.get(name + "_count", 0.0)
        total = after.get(name + "_sum", 0.0) - before.get(name + "_sum", 0.0)
        if count > 0:
            out[f"mean_{phase}_ms"] = 1000.0 * total / count
    for key, value in peaks.items():
        out[f"peak_{key}"] = value
    return out


class GpuMemory:
    """Reads GPU memory through NVML for the target devices (indexes or UUIDs), and notes on
    which of all the host's GPUs the engine's processes hold memory: the record of which GPU
    really ran a trial, whatever ``CUDA_VISIBLE_DEVICES`` said."""

    def __init__(self, devices: list[str]) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._all: dict[str, Any] = {}  # UUID -> handle, every GPU of the host
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            self._all[nvml_text(pynvml.nvmlDeviceGetUUID(handle))] = handle
        self.targets: list[str] = []
        for dev in devices:
            if dev.isdigit():
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(dev))
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(dev)
            uuid = nvml_text(pynvml.nvmlDeviceGetUUID(handle))
            self._all.setdefault(uuid, handle)
            self.targets.append(uuid)
        self.engine_peaks: dict[str, int] = {}  # UUID -> peak bytes held by the engine's PIDs

    def used_bytes(self, pids: set[int]) -> int:
        """The engine's memory on the target GPU that holds the most of it."""
        mine: dict[str, int] = {}
        for uuid, handle in self._all.items():
            held = 0
            with contextlib.suppress(self._nvml.NVMLError):
                for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid in pids and proc.usedGpuMemory:
                        held += int(proc.usedGpuMemory)
            mine[uuid] = held
            if held:
                self.engine_peaks[uuid] = max(self.engine_peaks.get(uuid, 0), held)
        # Per GPU, the most any one of them holds: the SLA's memory limit is per GPU, and a
        # layout over several GPUs holds about the same on each.
        most = 0
        for uuid in self.targets:
            held = mine[uuid]
            if held == 0:
                # In a container the driver may not show our PIDs: count the whole device.
                held = int(self._nvml.nvmlDeviceGetMemoryInfo(self._all[uuid]).used)
            most = max(most, held)
        return most

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


class Monitor:
    """Async context manager around a load run; ``summary()`` afterwards."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        processes: Callable[[], list[psutil.Process]],
        gpu_devices: list[str] | None = None,
        interval_s: float = 0.5,
        *,
        metrics: MetricNames,
    ) -> None:
        """``metrics``: the engine's metric names (its adapter's).
        Several base URLs (engine replicas): each is scraped and the scrapes merged
        (:func:`merge_samples`)."""
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.base_urls = [u.rstrip("/") for u in urls]
        self.base_url = self.base_urls[0]
        self.metrics = metrics
        self.processes = processes
        self.gpu_devices = gpu_devices
        self.interval_s = interval_s
        self.peak_memory_bytes = 0
        self.memory_source = "nvml" if gpu_devices else "rss"
        self.before: Samples = {}
        self.after: Samples = {}
        self.peaks: dict[str, float] = {}
        self._gpu: GpuMemory | None = None
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Monitor:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        if self.gpu_devices:
            self._gpu = GpuMemory(self.gpu_devices)
        self.before = await self.scrape()
        self._sample_memory()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._task:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._sample_memory()
            self.after = await self.scrape()
        finally:
            # Also when the run is cancelled here (a tune stopped by SIGTERM mid-level):
            # an open session is reported by aiohttp at exit and holds a connection.
            if self._session:
                await self._session.close()
            if self._gpu:
                self._gpu.close()

    async def scrape(self) -> Samples:
        """One scrape of ``/metrics`` of every server, merged; empty when none answers."""
        if len(self.base_urls) == 1:
            return await self._scrape(self.base_url)
        parts = await asyncio.gather(*(self._scrape(u) for u in self.base_urls))
        gauges = frozenset(n for names in self.metrics.gauges.values() for n in names)
        return merge_samples(parts, gauges)

    async def _scrape(self, base_url: str) -> Samples:
        assert self._session is not None
        try:
            async with self._session.get(base_url + "/metrics") as resp:
                if resp.status != 200:
                    logger.debug("%s/metrics answered HTTP %d", base_url, resp.status)
                    return {}
                shares = frozenset(self.metrics.gauges.get("kv_cache_usage", ()))
                return parse_metrics(await resp.text(), shares)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            logger.debug("%s/metrics not scraped: %r", base_url, exc)
            return {}

    def _sample_memory(self) -> None:
        procs = self.processes()
        if self._gpu is not None:
            used = self._gpu.used_bytes({p.pid for p in procs})
        else:
            used = 0
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    used += proc.memory_info().rss
        self.peak_memory_bytes = max(self.peak_memory_bytes, used)

    async def _loop(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(self.interval_s)
            await asyncio.to_thread(self._sample_memory)
            ticks += 1
            if ticks % 4 == 0:  # gauges every ~2 s: cheap for the engine
                samples = await self.scrape()
                for key, names in self.metrics.gauges.items():
                    value = _first(samples, names)
                    if value is not None:
                        self.peaks[key] = max(self.peaks.get(key, 0.0), value)

    def summary(self) -> dict[str, Any]:
        return {
            "peak_memory_bytes": self.peak_memory_bytes or None,
            "memory_source": self.memory_source,
            # GPUs where NVML saw the engine's processes (empty when it hides their PIDs)
            "engine_gpus": dict(self._gpu.engine_peaks) if self._gpu else {},
            "engine": engine_summary(self.before, self.after, self.peaks, self.metrics),
        }
