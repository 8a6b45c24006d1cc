"""The monitor: engine metrics (Prometheus text) and memory sampling, against the stand-in."""

from __future__ import annotations

import asyncio
import sys
import types
from typing import Any

import psutil
import pytest

from autotuner.engines import registry
from autotuner.measure.loadgen import LoadPlan, run_load
from autotuner.measure.monitor import GpuMemory, Monitor, engine_summary, parse_metrics
from autotuner.testing.standin import StandinConfig, StandinServer
from autotuner.workload.requests import Arrival, LengthDist, PromptSource, RequestFactory

METRICS = registry.get("vllm").metrics  # where the readings are in the stand-in's /metrics

TEXT = """
# HELP vllm:num_preemptions_total Preemptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="m",engine="0"} 3.0
vllm:num_preemptions_total{model_name="m",engine="1"} 2.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{le="+Inf",model_name="m"} 4.0
vllm:request_queue_time_seconds_count{model_name="m"} 4.0
vllm:request_queue_time_seconds_sum{model_name="m"} 2.0
"""


def test_parse_sums_label_sets() -> None:
    s = parse_metrics(TEXT)
    assert s["vllm:num_preemptions_total"] == 5.0
    assert s["vllm:request_queue_time_seconds_count"] == 4.0


def test_a_kv_share_per_data_parallel_rank_is_the_highest_not_the_sum() -> None:
    text = """
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.6
vllm:kv_cache_usage_perc{model_name="m",engine="1"} 0.7
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="1"} 4.0
"""
    s = parse_metrics(text, frozenset({"vllm:kv_cache_usage_perc"}))
    assert s["vllm:kv_cache_usage_perc"] == pytest.approx(0.7)
    assert s["vllm:num_requests_running"] == 7.0  # requests on both ranks
    assert parse_metrics(text)["vllm:kv_cache_usage_perc"] == pytest.approx(1.3)


def test_summary_is_deltas_and_means() -> None:
    before = {
        "vllm:num_preemptions_total": 1.0,
        "vllm:request_queue_time_seconds_count": 2.0,
        "vllm:request_queue_time_seconds_sum": 0.5,
    }
    after = parse_metrics(TEXT)
    out = engine_summary(before, after, {"kv_cache_usage": 0.4}, METRICS)
    assert out["preemptions"] == 4.0
    assert out["mean_queue_ms"] == pytest.approx(1000 * 1.5 / 2)
    assert out["peak_kv_cache_usage"] == 0.4
    assert "prefix_cache_hit_rate" not in out  # the engine did not report it


def test_prefix_cache_hit_rate_is_over_the_measured_part() -> None:
    before = {"vllm:prefix_cache_queries_total": 1000.0, "vllm:prefix_cache_hits_total": 900.0}
    after = {"vllm:prefix_cache_queries_total": 3000.0, "vllm:prefix_cache_hits_total": 1400.0}
    out = engine_summary(before, after, {}, METRICS)
    assert out["prefix_cache_queries"] == 2000.0 and out["prefix_cache_hits"] == 500.0
    assert out["prefix_cache_hit_rate"] == pytest.approx(0.25)


def test_monitor_sees_the_run_and_the_memory() -> None:
    cfg = StandinConfig(itl_s=0.02, max_concurrency=2)
    plan = LoadPlan(
        api="completions",
        factory=RequestFactory(
            "completions", PromptSource(100), LengthDist.fixed(8), LengthDist.fixed(30), 0
        ),
        arrival=Arrival("constant", rate=20.0),
        requests=10,
        duration_s=None,
        warmup_requests=2,
    )

    async def go() -> Monitor:
        async with StandinServer(cfg) as server:
            me = psutil.Process()
            monitor = Monitor(server.base_url, lambda: [me], None, 0.05, metrics=METRICS)
            await run_load(server.base_url, cfg.model, plan, around=monitor)
        return monitor

    monitor = asyncio.run(go())
    summary = monitor.summary()
    engine = summary["engine"]
    # Counters cover the measured part only: the 2 warm-up requests came before "before".
    assert engine["generation_tokens"] == 10 * 30
    assert engine["prompt_tokens"] == 10 * 8
    assert engine["peak_running"] == 2
    assert engine["peak_waiting"] >= 1
    assert summary["memory_source"] == "rss"
    assert summary["peak_memory_bytes"] >= psutil.Process().memory_info().rss // 2


def test_a_run_cancelled_while_leaving_still_closes_the_session() -> None:
    async def go() -> Monitor:
        async with StandinServer(StandinConfig()) as server:
            me = psutil.Process()
            monitor = Monitor(server.base_url, lambda: [me], None, 0.05, metrics=METRICS)
            await monitor.__aenter__()

            async def cancelled() -> dict[str, float]:
                raise asyncio.CancelledError

            monitor.scrape = cancelled  # type: ignore[method-assign]
            with pytest.raises(asyncio.CancelledError):
                await monitor.__aexit__(None, None, None)
        return monitor

    monitor = asyncio.run(go())
    assert monitor._session is not None and monitor._session.closed
    assert monitor._task is not None and monitor._task.done()


class _FakeNvml(types.ModuleType):
    """Two GPUs; ``held[uuid]`` lists (pid, bytes) of the compute processes on each."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.uuids = ["GPU-aaa", "GPU-bbb"]
        self.held: dict[str, list[tuple[int, int]]] = {u: [] for u in self.uuids}
        self.device_used = {u: 7 << 30 for u in self.uuids}

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return self.uuids[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:
        return handle.encode()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.held[handle]]

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return types.SimpleNamespace(used=self.device_used[handle])


def test_gpu_memory_records_which_gpus_the_engine_really_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpu = GpuMemory(["1"])  # the target is GPU 1 (GPU-bbb)
    nvml.held["GPU-bbb"] = [(10, 3 << 30), (11, 1 << 30), (99, 5 << 30)]  # 99: not ours
    assert gpu.used_bytes({10, 11}) == 4 << 30
    # The engine also spills onto GPU 0, which it was not given: recorded, not counted.
    nvml.held["GPU-aaa"] = [(11, 2 << 30)]
    nvml.held["GPU-bbb"] = [(10, 2 << 30)]
    assert gpu.used_bytes({10, 11}) == 2 << 30
    assert gpu.engine_peaks == {"GPU-aaa": 2 << 30, "GPU-bbb": 4 << 30}
    # PIDs hidden (a container): the whole target device counts, nothing is attributed.
    nvml.held = {u: [] for u in nvml.uuids}
    assert gpu.used_bytes({10, 11}) == 7 << 30
    assert gpu.engine_peaks == {"GPU-aaa": 2 << 30, "GPU-bbb": 4 << 30}
