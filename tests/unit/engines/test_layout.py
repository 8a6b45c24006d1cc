"""Layouts: tensor x data parallel over the target's devices, replicas, rules, deploy, plan."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from autotuner.bundle.promote import Context, _write_deploy
from autotuner.cli.check import check_main
from autotuner.core.hardware import CpuInfo, HardwareProfile
from autotuner.engines import registry
from autotuner.engines.base import (
    Endpoint,
    EngineLaunchError,
    EngineProcess,
    LaunchCause,
    LaunchSpec,
)
from autotuner.engines.layout import Layout, devices_used, resolve_mode
from autotuner.engines.replicas import ReplicaSet, rank_binding, replica_specs
from autotuner.measure.loadgen import run_load
from autotuner.models import synth
from autotuner.records.trial import CapacityRecord
from autotuner.search import rules
from autotuner.search.confirm import Replicate, per_gpu_replicate, per_gpu_scale
from autotuner.search.executors import gpus_needed
from autotuner.search.layout_plan import assumed_gpus, plan
from autotuner.search.pareto import Candidate
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import SlaError, parse_sla
from autotuner.space import load_space_for
from autotuner.testing.standin import StandinConfig, StandinServer
from tests.unit.measure.test_loadgen import plan as load_plan

from .test_memory import gpu_profile

ROOT = Path(__file__).resolve().parents[3]
GIB = 2**30
VLLM = registry.get("vllm")
ROLES = VLLM.roles
SLA_BASE = {
    "model": {"synth": "tiny-llama"},
    "workload": {
        "input_tokens": 16,
        "output_tokens": 8,
        "arrival": {"process": "poisson", "rate": 1},
        "requests": 4,
    },
}


def sla_of(**sections: Any) -> Any:
    return parse_sla(yaml.safe_dump({**SLA_BASE, **sections}))


# --------------------------------------------------------------------------- the layout


def test_layout_counts_devices_and_replicas() -> None:
    params = {"tensor_parallel_size": 2, "data_parallel_size": 2}
    assert Layout.of(params, ROLES).devices == 4 and Layout.of(params, ROLES).replicas == 1
    replicas = Layout.of(params, ROLES, "replicas")
    assert replicas.replicas == 2 and replicas.ranks == 2
    assert replicas.describe() == "TP=2 x DP=2 (4 GPUs, 2 replicas)"
    assert replicas.engine_params(params) == {"tensor_parallel_size": 2}
    assert Layout.of(params, ROLES).engine_params(params) == params  # the engine's own flag
    assert gpus_needed(params, ROLES) == 4
    assert gpus_needed({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, ROLES) == 4


def test_replicas_get_disjoint_device_slices() -> None:
    layout = Layout(tp=2, dp=2, mode="replicas")
    assert layout.slices(["a", "b", "c", "d"]) == [["a", "b"], ["c", "d"]]
    assert Layout(tp=2, dp=1).slices(["a", "b", "c", "d"]) == [["a", "b"]]
    with pytest.raises(ValueError, match="needs 4 devices, the target has 3"):
        layout.slices(["a", "b", "c"])


def test_auto_takes_the_engine_flag_where_there_is_one() -> None:
    assert resolve_mode("auto", True) == "engine"
    assert resolve_mode("auto", False) == "replicas"
    assert resolve_mode("replicas", True) == "replicas"


def _spec(tmp_path: Path, *, cuda: tuple[str, ...] | None, env: Mapping[str, str] = {}) -> Any:
    return LaunchSpec(
        python=Path("/py"),
        model=Path("/m"),
        served_name="m",
        params={},
        log_path=tmp_path / "engine.log",
        env=dict(env),
        cuda_devices=cuda,
    )


def test_replica_launches_split_gpus_and_logs(tmp_path: Path) -> None:
    specs = replica_specs(
        _spec(tmp_path, cuda=("0", "1", "2", "3")), Layout(tp=2, dp=2, mode="replicas"), "B", [0]
    )
    assert [s.cuda_devices for s in specs] == [("0", "1"), ("2", "3")]
    assert [s.log_path.name for s in specs] == ["engine.log", "engine-r1.log"]
    assert all("B" not in s.env for s in specs)  # GPU servers are not pinned to cores


def test_cpu_replicas_get_their_own_cores(tmp_path: Path) -> None:
    two = Layout(dp=2, mode="replicas")
    specs = replica_specs(_spec(tmp_path, cuda=None), two, "BIND", [0, 1, 2, 3])
    assert [s.env["BIND"] for s in specs] == ["0,1", "2,3"]
    tp2 = Layout(tp=2, dp=2, mode="replicas")  # two ranks per replica: one core each
    specs = replica_specs(_spec(tmp_path, cuda=None), tp2, "BIND", [0, 1, 2, 3])
    assert [s.env["BIND"] for s in specs] == ["0|1", "2|3"]
    # The SLA's own binding wins; too few cores is an error.
    mine = replica_specs(_spec(tmp_path, cuda=None, env={"BIND": "5"}), two, "BIND", [0, 1])
    assert [s.env["BIND"] for s in mine] == ["5", "5"]
    with pytest.raises(ValueError, match="2 engine replicas need 2 CPU cores, 1 are usable"):
        replica_specs(_spec(tmp_path, cuda=None), two, "BIND", [0])


def test_one_cpu_server_of_two_ranks_binds_a_core_per_rank(tmp_path: Path) -> None:
    spec = _spec(tmp_path, cuda=None)
    assert rank_binding(spec, Layout(tp=2), "BIND", [0, 1]).env == {"BIND": "0|1"}
    assert rank_binding(spec, Layout(), "BIND", [0, 1]).env == {}
    assert rank_binding(_spec(tmp_path, cuda=("0", "1")), Layout(tp=2), "BIND", [0, 1]).env == {}


class FakeServer:
    """An engine process that comes up at ``url`` (or fails) without a process."""

    kind = "fake"
    cuda_devices: list[str] | None = None

    def __init__(self, url: str, fail: bool = False) -> None:
        self.url, self.fail, self.stopped = url, fail, 0
        self.log_path = Path(f"/logs/{url}")

    def argv(self) -> list[str]:
        return [self.url]

    @property
    def pid(self) -> int | None:
        return None

    async def launch(self) -> Endpoint:
        if self.fail:
            raise EngineLaunchError(LaunchCause.OUT_OF_MEMORY, "no memory", "", 1)
        return Endpoint(self.url, "m", 1, (self.url,), self.log_path, 2.0)

    async def stop(self) -> None:
        self.stopped += 1

    def kill_now(self) -> None: ...

    def processes(self) -> list[Any]:
        return []

    def returncode(self) -> int | None:
        return None


def test_a_replica_set_serves_every_endpoint_or_fails_whole() -> None:
    a, b = FakeServer("http://a"), FakeServer("http://b")
    endpoint = asyncio.run(ReplicaSet([cast(EngineProcess, a), cast(EngineProcess, b)]).launch())
    assert endpoint.urls == ("http://a", "http://b") and endpoint.base_url == "http://a"
    ok, bad = FakeServer("http://a"), FakeServer("http://b", fail=True)
    with pytest.raises(EngineLaunchError, match="no memory"):
        asyncio.run(ReplicaSet([cast(EngineProcess, ok), cast(EngineProcess, bad)]).launch())
    assert ok.stopped == 1  # the one that came up is stopped


def test_the_load_generator_takes_the_endpoints_in_turn() -> None:
    config = StandinConfig()

    async def go() -> tuple[int, int, int]:
        async with StandinServer(config) as one, StandinServer(config) as two:
            result = await run_load(
                [one.base_url, two.base_url], config.model, load_plan(requests=9, warmup=2)
            )
            return len(result.ok), one.stats.received, two.stats.received

    ok, first, second = asyncio.run(go())
    assert ok == 9 and first + second == 11 and abs(first - second) <= 1


# --------------------------------------------------------------------------- the SLA


def test_data_parallel_and_baseline_in_the_sla() -> None:
    sla = sla_of(
        search={
            "data_parallel": "replicas",
            "params": {"data_parallel_size": {"values": [1, 2]}},
            "baseline": {"data_parallel_size": 2},
        }
    )
    assert sla.search.data_parallel == "replicas" and sla.search.baseline == {
        "data_parallel_size": 2
    }
    with pytest.raises(SlaError, match="'max_num_seqs' is not searched by this SLA"):
        sla_of(search={"baseline": {"max_num_seqs": 8}})
    with pytest.raises(SlaError, match="data_parallel"):
        sla_of(search={"data_parallel": "sometimes"})


# --------------------------------------------------------------------------- rules and memory


def _reasons(params: dict[str, Any], hw: HardwareProfile, arch: str = "llama-3.1-8b") -> list[str]:
    cfg = synth.ARCHS[arch].config()
    return rules.check(params, model_cfg=cfg, hardware=hw, context_len=4096, engine=VLLM)


def test_a_layout_past_the_gpus_is_dropped_with_why() -> None:
    (why,) = _reasons({"tensor_parallel_size": 2, "data_parallel_size": 2}, gpu_profile(count=2))
    assert why == "layout TP=2 x DP=2 (4 GPUs) needs 4 GPUs, the target has 2"
    assert (
        _reasons({"tensor_parallel_size": 2, "data_parallel_size": 2}, gpu_profile(count=4)) == []
    )


def test_pipeline_stages_must_divide_the_layers() -> None:
    msgs = _reasons({"pipeline_parallel_size": 3}, gpu_profile(count=4))  # 32 layers
    assert "pipeline_parallel_size 3 does not divide num_hidden_layers (32)" in msgs
    assert _reasons({"pipeline_parallel_size": 2}, gpu_profile(count=2)) == []


def test_cpu_ranks_need_their_own_cores_and_share_the_memory() -> None:
    host = HardwareProfile("cpu", CpuInfo("x", 2, 2, 24 * GIB, 20 * GIB))
    small = {"gpu_memory_utilization": 0.3}
    assert _reasons({**small, "data_parallel_size": 2}, host, "tiny-llama") == []
    (why,) = _reasons({"gpu_memory_utilization": 0.1, "data_parallel_size": 4}, host, "tiny-llama")
    assert why == "layout TP=1 x DP=4 (4 ranks) runs 4 engine ranks, the host has 2 CPU core(s)"
    (why,) = _reasons({"gpu_memory_utilization": 0.5, "data_parallel_size": 2}, host, "tiny-llama")
    assert why.startswith("2 engine ranks x gpu_memory_utilization 0.5 = 1 of the host memory")


def test_memory_is_per_gpu_and_70b_needs_two_h200s() -> None:
    cfg = synth.ARCHS["llama-3.1-70b"].config()
    adapter = registry.get("vllm")
    hw = gpu_profile(count=4)
    one = adapter.estimate_memory(cfg, {"tensor_parallel_size": 1}, hw, context_len=4096)
    two = adapter.estimate_memory(cfg, {"tensor_parallel_size": 2}, hw, context_len=4096)
    pp2 = adapter.estimate_memory(cfg, {"pipeline_parallel_size": 2}, hw, context_len=4096)
    assert not one.fits and two.fits
    assert two.weights_bytes == pytest.approx(one.weights_bytes / 2, abs=1)
    assert pp2.weights_bytes == two.weights_bytes  # a stage holds half the layers
    # data parallel copies each hold the whole of their own: nothing changes per GPU
    dp2 = adapter.estimate_memory(
        cfg, {"tensor_parallel_size": 2, "data_parallel_size": 2}, hw, context_len=4096
    )
    assert dp2.weights_bytes == two.weights_bytes and dp2.kv_tokens == two.kv_tokens


# --------------------------------------------------------------------------- capacity per GPU


def _result(params: dict[str, Any], capacity: float) -> TrialResult:
    level = Level(2.0, True, {}, {}, {}, {}, "level-0.json", verdict="meets")
    cap = CapacityRecord(value=capacity, low=capacity, high=None, unit="req/s", stopped_by="budget")
    devices = devices_used(params, ROLES)  # as run_trial records it
    return TrialResult(params, "complete", "rate", (level,), 0, capacity=cap, devices=devices)


def test_capacity_per_gpu_divides_by_the_layout() -> None:
    one = _result({}, 10.0)
    tp2 = _result({"tensor_parallel_size": 2}, 13.0)
    dp2 = _result({"data_parallel_size": 2}, 20.0)
    assert one.metric("capacity_per_gpu") == 10.0
    assert tp2.metric("capacity_per_gpu") == 6.5  # 30 % more than TP=1, worse per GPU
    assert dp2.metric("capacity_per_gpu") == 10.0


def test_confirmation_compares_per_gpu_when_that_is_the_objective() -> None:
    per_gpu = sla_of(objectives=[{"maximize": "capacity_per_gpu"}])
    plain = sla_of()
    assert per_gpu_scale(per_gpu, {"tensor_parallel_size": 2}, ROLES) == 0.5
    assert per_gpu_scale(plain, {"tensor_parallel_size": 2}, ROLES) == 1.0
    r = Replicate("trial-1", 0, 13.0, 12.0, 14.0, "resolution", None, True, {}, "x")
    scaled = per_gpu_replicate(r, 0.5)
    assert (scaled.capacity, scaled.low, scaled.high) == (6.5, 6.0, 7.0)


# --------------------------------------------------------------------------- deploy


def _deploy_context(sla: Any, hw: HardwareProfile, tmp_path: Path) -> Context:
    """What the deploy files need of a promotion (no study, no space)."""
    rest: Any = (None, tmp_path, None, hw, tmp_path / "m", "0.26.0", tmp_path / "py", "")
    return Context(sla, *rest, VLLM)


def test_deploy_renders_replicas_with_their_gpus_and_ports(tmp_path: Path) -> None:
    sla = sla_of(
        target={"gpus": 4},
        search={"data_parallel": "replicas", "params": {"data_parallel_size": {"values": [1, 2]}}},
    )
    hw = gpu_profile(count=4)
    ctx = _deploy_context(sla, hw, tmp_path)
    chosen = Candidate(1, (1.0,), True, params={"tensor_parallel_size": 2, "data_parallel_size": 2})
    out = tmp_path / "deploy"
    out.mkdir()
    _write_deploy(ctx, out, chosen)
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "compose.yaml",
        "docker-run-r0.sh",
        "docker-run-r1.sh",
        "k8s.yaml",
        "serve-r0.sh",
        "serve-r1.sh",
    ]
    services = yaml.safe_load((out / "compose.yaml").read_text())["services"]
    assert list(services) == ["replica-0", "replica-1"]
    r1_service = services["replica-1"]
    assert r1_service["ports"] == ["127.0.0.1:8001:8000"]
    (device,) = r1_service["deploy"]["resources"]["reservations"]["devices"]
    assert device["device_ids"] == ["GPU-2", "GPU-3"]
    assert "--data-parallel-size" not in r1_service["command"]
    r1 = (out / "serve-r1.sh").read_text()
    assert "--port 8001" in r1 and "--tensor-parallel-size 2" in r1
    assert "--data-parallel-size" not in r1 and "GPUs GPU-2,GPU-3" in r1
    assert "device=GPU-2,GPU-3" in (out / "docker-run-r1.sh").read_text()
    deployment = next(yaml.safe_load_all((out / "k8s.yaml").read_text()))
    assert deployment["spec"]["replicas"] == 2
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 2


def test_deploy_passes_the_engine_flag_for_engine_data_parallelism(tmp_path: Path) -> None:
    sla = sla_of(target={"gpus": 4})
    hw = gpu_profile(count=4)
    ctx = _deploy_context(sla, hw, tmp_path)
    chosen = Candidate(1, (1.0,), True, params={"tensor_parallel_size": 2, "data_parallel_size": 2})
    out = tmp_path / "deploy"
    out.mkdir()
    _write_deploy(ctx, out, chosen)
    serve = (out / "serve.sh").read_text()
    assert "--data-parallel-size 2" in serve and "layout: TP=2 x DP=2 (4 GPUs)" in serve
    (service,) = yaml.safe_load((out / "compose.yaml").read_text())["services"].values()
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["device_ids"] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    deployment = next(yaml.safe_load_all((out / "k8s.yaml").read_text()))
    assert deployment["spec"]["replicas"] == 1
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 4


# --------------------------------------------------------------------------- the 70B plan


def test_the_70b_plan_keeps_three_layouts_on_four_h200s() -> None:
    from autotuner.sla.spec import load_sla

    sla = load_sla(ROOT / "objectives" / "llama3-70b-4xh200.yaml")
    hw = assumed_gpus("h200", len(sla.target.devices))
    space = load_space_for(
        "vllm",
        "0.26.0",
        hw,
        allow_lossy=False,
        overrides=sla.search.params,
        engine_params=sla.engine.params,
    )
    verdicts = plan(
        space,
        model_cfg=synth.ARCHS["llama-3.1-70b"].config(),
        hardware=hw,
        engine=registry.get("vllm"),
        env={},
        baseline=sla.search.baseline,
        mode="engine",
    )
    by = {(v.layout.tp, v.layout.dp): v for v in verdicts}
    assert {k for k, v in by.items() if v.kept} == {(2, 1), (2, 2), (4, 1)}
    assert by[(4, 1)].baseline and not by[(2, 1)].baseline
    assert "leave no KV cache" in by[(1, 1)].why  # 70B in bf16 does not fit one H200
    assert by[(4, 2)].why == "layout TP=4 x DP=2 (8 GPUs) needs 8 GPUs, the target has 4"


def test_check_layouts_prints_the_plan_and_refuses_an_unknown_gpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(ROOT / "objectives" / "llama3-70b-4xh200.yaml")
    code = check_main([path], layouts=True, assume_gpu="h200", engine_version="0.26.0")
    out = capsys.readouterr().out
    assert code == 0
    assert "layouts on 4 x NVIDIA H200 (vLLM 0.26.0, data parallel: engine; 3 kept of 10)" in out
    assert "keep  TP=4 x DP=1 (4 GPUs) [baseline]: per GPU 32.9 GiB of weights" in out
    assert check_main([path], layouts=True, assume_gpu="b300", engine_version="0.26.0") == 2
    assert "unknown GPU model 'b300'" in capsys.readouterr().err


def test_the_study_report_shows_capacity_per_gpu(tmp_path: Path) -> None:
    from autotuner.bundle.summary import render
    from tests.unit.bundle.test_promote import Scenario, _study

    sc = Scenario(confirm={})
    ctx = _study(tmp_path, sc)
    text = render(ctx.study, ctx.study_dir, ROLES)
    header = next(line for line in text.splitlines() if "bracket" in line)
    assert "per GPU" in header
    # One-engine configs on a CPU target: capacity per GPU (per engine rank) is the capacity.
    cap_end = header.index("capacity") + len("capacity")
    per_end = header.index("per GPU") + len("per GPU")
    rows = [line for line in text.splitlines() if line[:3].strip().isdigit()]
    measured = [r for r in rows if " meets SLA " in r]  # a status that fits its column
    assert measured
    for row in measured:
        assert row[cap_end - 8 : cap_end] == row[per_end - 8 : per_end], row


def test_a_target_of_two_gpus_is_leased_whole() -> None:
    from autotuner.daemon.leases import Leases
    from tests.unit.daemon.test_daemon import FakeGpus

    sla = sla_of(target={"gpus": 2})
    leases = Leases(FakeGpus(), idle_mib=1024, free_timeout_s=0.0)
    wanted = leases.devices_for(sla.target.kind, sla.target.devices)
    assert wanted == ["gpu0", "gpu1"]
    leases.acquire(wanted, 1)
    # A job that wants either GPU waits for the whole layout's job to end.
    assert "leased to job 1" in str(leases.available(["gpu1"], set()))
    leases.release(1)
    assert leases.available(["gpu1"], set()) is None


def test_replicas_scrapes_add_counters_and_keep_the_highest_gauge() -> None:
    from autotuner.measure.monitor import merge_samples

    a = {"requests_total": 10.0, "kv_usage": 0.5}
    b = {"requests_total": 7.0, "kv_usage": 0.75, "only_b": 1.0}
    merged = merge_samples([a, b], frozenset({"kv_usage"}))
    assert merged == {"requests_total": 17.0, "kv_usage": 0.75, "only_b": 1.0}


def test_a_cpu_plan_counts_engine_ranks_and_the_shared_memory() -> None:
    host = HardwareProfile("cpu", CpuInfo("x", 2, 2, 24 * GIB, 20 * GIB))
    space = load_space_for(
        "vllm",
        "0.32.0",
        host,
        allow_lossy=False,
        overrides=sla_of(
            search={"params": {"data_parallel_size": {"values": [1, 2]}}}
        ).search.params,
        engine_params={"gpu_memory_utilization": 0.5, "max_model_len": 512},
    )
    verdicts = plan(
        space,
        model_cfg=synth.ARCHS["tiny-llama"].config(),
        hardware=host,
        engine=registry.get("vllm"),
        env={},
        baseline={},
        mode="replicas",
    )
    by = {(v.layout.tp, v.layout.dp): v for v in verdicts}
    assert [k for k, v in by.items() if v.kept] == [(1, 1)]
    assert "2 engine ranks x gpu_memory_utilization 0.5" in by[(1, 2)].why
    assert by[(1, 2)].line().startswith("drop  TP=1 x DP=2 (2 ranks, 2 replicas): ")
