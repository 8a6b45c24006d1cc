"""The kernel breakdown without an engine: classification, self times and phases of small
traces written here, the CSV, the SVG panel, the adapter's profiler flags per vLLM version
and the SLA switch ``tune.profile``."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from autotuner.bundle.report import LatencyProfile, latency_breakdown_svg
from autotuner.engines import registry
from autotuner.measure.kernel_profile import enabled, worker_traces
from autotuner.measure.kernels import (
    ALL,
    TraceError,
    aggregate,
    breakdown_csv,
    classify,
    read_trace,
    step_phase,
)
from autotuner.sla.spec import SlaError, parse_sla

PREFILL = "execute_context_1(64)_generation_0(0)"
DECODE = "execute_context_0(0)_generation_2(2)"


def op(
    name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1, **args: Any
) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
    event.update(pid=7, tid=tid)
    if args:
        event["args"] = args
    return event


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("aten::mm", "gemm"),
        ("aten::addmm", "gemm"),
        ("aten::linear", "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "gemm"),
        ("flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64>>", "attention"),
        ("_C_cpu::cpu_attention_with_kv_cache", "attention"),
        ("vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>", "attention"),
        ("aten::scaled_dot_product_attention", "attention"),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "communication",
        ),
        ("vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>", "communication"),
        ("Memcpy HtoD (Pinned -> Device)", "memory_copy"),
        ("aten::copy_", "memory_copy"),
        ("_C::rms_norm", "norm_activation"),
        ("vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel>", "norm_activation"),
        ("aten::silu", "norm_activation"),
        ("aten::argmax", "sampling"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4>", "sampling"),
        ("aten::empty", "other"),
        ("aten::add", "other"),
    ],
)
def test_names_get_their_class(name: str, cls: str) -> None:
    assert classify(name) == cls


def test_step_annotations_give_the_phase() -> None:
    assert step_phase(PREFILL) == "prefill"
    assert step_phase(DECODE) == "decode"
    assert step_phase("execute_context_1(12)_generation_3(3)") == "mixed"
    detailed = "execute_70_context_1(sq64sk64sqsq4096sqsk4096)_generation_6(sq6sk900sqsq6sqsk900)"
    assert step_phase(detailed) == "mixed"
    assert step_phase("execute_context_0(0)_generation_0(0)") is None
    assert step_phase("aten::mm") is None


def cpu_trace() -> list[dict[str, Any]]:
    """A CPU worker: a prefill step with linear > addmm > empty, attention with a copy inside,
    a silu; a decode step with one mm and an argmax; one copy outside any step."""
    return [
        op(PREFILL, 0, 1000, cat="user_annotation"),
        op("aten::linear", 10, 400),
        op("aten::addmm", 20, 380),
        op("aten::empty", 30, 10),
        op("_C_cpu::cpu_attention_with_kv_cache", 420, 300),
        op("aten::copy_", 430, 50),
        op("aten::silu", 750, 100),
        op(DECODE, 1000, 600, cat="user_annotation"),
        op("aten::mm", 1010, 200),
        op("aten::argmax", 1300, 40),
        op("aten::copy_", 2000, 30),
        # Another thread, nothing to do with the first one's nesting.
        op("aten::mm", 15, 100, tid=2),
        {"ph": "i", "cat": "cpu_op", "name": "instant"},  # not a span: ignored
    ]


def test_cpu_operators_are_counted_by_self_time_with_phases() -> None:
    b = aggregate([cpu_trace()], window_s=2.5)
    assert b.timed == "cpu operators (self time)" and b.traces == 1 and b.window_s == 2.5
    # linear 400 = its own 20 + addmm's own 370 + the empty inside, which inherits GEMM;
    # the decode mm 200 and the other thread's mm 100.
    assert b.time_us("gemm") == pytest.approx(400 + 200 + 100)
    assert b.time_us("attention") == pytest.approx(250)  # 300 minus its copy
    assert b.time_us("memory_copy") == pytest.approx(50 + 30)
    assert b.time_us("norm_activation") == pytest.approx(100)
    assert b.time_us("sampling") == pytest.approx(40)
    assert b.total_us() == pytest.approx(1170)
    assert b.share("gemm") == pytest.approx(700 / 1170)
    assert b.time_us("gemm", "prefill") == pytest.approx(500)
    assert b.time_us("gemm", "decode") == pytest.approx(200)
    assert b.time_us("memory_copy", "outside steps") == pytest.approx(30)
    assert b.steps == {"prefill": 1, "decode": 1}
    assert b.phases() == ["prefill", "decode", "outside steps"]
    gemm = next(r for r in b.rows if r.kernel_class == "gemm" and r.phase == ALL)
    assert gemm.calls == 5 and gemm.top[0][0] == "aten::addmm"
    assert gemm.top[0][1] == pytest.approx(370)
    assert b.summary().startswith("GEMM 60 %, attention 21 %, normalization / activation 9 %")


def test_gpu_kernels_win_over_cpu_operators_and_take_the_phase_of_their_step() -> None:
    trace = [
        op(PREFILL, 0, 500, cat="gpu_user_annotation"),
        op("sm90_xmma_gemm_bf16", 10, 200, cat="kernel"),
        op("flash_fwd_kernel", 220, 100, cat="kernel"),
        op(DECODE, 600, 300, cat="gpu_user_annotation"),
        op("Memcpy DtoH (Device -> Pinned)", 610, 20, cat="gpu_memcpy"),
        op("Memset (Device)", 640, 5, cat="gpu_memset"),
        op("ncclDevKernel_AllReduce_Sum", 650, 50, cat="kernel"),
        op("aten::mm", 0, 5000),  # the CPU side: not device time
    ]
    rank1 = [op("sm90_xmma_gemm_bf16", 10, 100, cat="kernel")]  # no annotations at all
    b = aggregate([trace, rank1])
    assert b.timed == "gpu kernels" and b.traces == 2
    assert b.time_us("gemm") == pytest.approx(300)
    assert b.time_us("memory_copy") == pytest.approx(25)
    assert b.time_us("communication") == pytest.approx(50)
    assert b.total_us() == pytest.approx(475)
    assert b.time_us("attention", "prefill") == pytest.approx(100)
    assert b.time_us("communication", "decode") == pytest.approx(50)
    # Rank 1 has no step annotations: its kernels count in the whole window only.
    assert b.time_us("gemm", "prefill") == pytest.approx(200)
    assert b.time_us("gemm", "outside steps") == 0


def test_without_gpu_annotations_a_kernel_takes_the_phase_of_its_launch() -> None:
    trace = [
        op(DECODE, 0, 100, cat="user_annotation"),
        op("cudaLaunchKernel", 10, 5, cat="cuda_runtime", correlation=42),
        op("gemv_kernel", 300, 30, cat="kernel", correlation=42),  # runs after the step ended
        op("gemv_kernel", 400, 30, cat="kernel", correlation=43),  # launch not in the trace
    ]
    b = aggregate([trace])
    assert b.time_us("gemm", "decode") == pytest.approx(30)
    assert b.time_us("gemm", "outside steps") == pytest.approx(30)


def test_traces_are_read_gzipped_or_plain_and_bad_ones_are_refused(tmp_path: Path) -> None:
    gz = tmp_path / "rank0.1.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(json.dumps({"traceEvents": cpu_trace()}).encode()))
    plain = tmp_path / "rank1.1.pt.trace.json"
    plain.write_text(json.dumps({"traceEvents": cpu_trace()}))
    front = tmp_path / "host_1.async_llm.1.pt.trace.json.gz"
    front.write_bytes(gz.read_bytes())
    assert worker_traces(tmp_path, ["async_llm"]) == [gz, plain]
    b = aggregate([read_trace(gz), read_trace(plain)])
    assert b.time_us("gemm") == pytest.approx(1400)
    for text, why in [(b"\x1f\x8b\x08 truncated", "not a readable"), (b"{}", "no traceEvents")]:
        bad = tmp_path / "bad.json"
        bad.write_bytes(text)
        with pytest.raises(TraceError, match=why):
            read_trace(bad)
    with pytest.raises(TraceError, match="neither"):
        aggregate([[op("python_function", 0, 10, cat="python_function")]])


def test_the_csv_has_a_row_per_config_phase_and_class_with_shares() -> None:
    b = aggregate([cpu_trace()], window_s=1.0)
    rows = list(csv.DictReader(io.StringIO(breakdown_csv([("promoted (trial 3)", b)]))))
    whole = [r for r in rows if r["phase"] == ALL]
    assert {r["kernel_class"] for r in whole} == {
        "gemm",
        "attention",
        "memory_copy",
        "norm_activation",
        "sampling",
    }
    for phase in (ALL, "prefill", "decode"):
        shares = [float(r["share"]) for r in rows if r["phase"] == phase]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    gemm = next(r for r in whole if r["kernel_class"] == "gemm")
    assert gemm["config"] == "promoted (trial 3)" and float(gemm["time_ms"]) == pytest.approx(0.7)
    assert gemm["timed"] == "cpu operators (self time)" and "aten::addmm" in gemm["top_names"]


def test_the_latency_breakdown_gets_a_kernel_panel() -> None:
    prof = LatencyProfile("promoted (trial 3)", {"ttft": {"p50": 10.0, "p99": 30.0}})
    b = aggregate([cpu_trace()], window_s=1.0)
    svg = latency_breakdown_svg([prof], kernels=[("promoted (trial 3)", b)])
    root = ElementTree.fromstring(svg)
    bars = [e for e in root.iter() if e.get("class") == "kernel"]
    whole = {
        e.get("data-class"): float(e.get("width") or 0) for e in bars if e.get("data-phase") == ALL
    }
    assert set(whole) == {"gemm", "attention", "memory_copy", "norm_activation", "sampling"}
    assert whole["gemm"] == pytest.approx(460 * 700 / 1170, abs=0.01)  # share of the 460 px
    assert {e.get("data-phase") for e in bars} == {ALL, "prefill", "decode", "outside steps"}
    assert "Time by kernel class (cpu operators (self time), profiled)" in svg
    assert not [
        e
        for e in ElementTree.fromstring(latency_breakdown_svg([prof])).iter()
        if e.get("class") == "kernel"
    ]


def test_vllm_profiles_through_the_config_flag_from_0_13_and_the_variable_before(
    tmp_path: Path,
) -> None:
    vllm = registry.get("vllm")
    new = vllm.profiler("0.32.0", tmp_path)
    assert new is not None and new.env == {} and new.args[0] == "--profiler-config"
    config = json.loads(new.args[1])
    assert config == {
        "profiler": "torch",
        "torch_profiler_dir": str(tmp_path),
        "torch_profiler_with_stack": False,
        "ignore_frontend": True,
    }
    gpu = vllm.profiler("0.26.0", tmp_path)  # the H200's release: the flag, no ignore_frontend
    assert gpu is not None and "ignore_frontend" not in json.loads(gpu.args[1])
    old = vllm.profiler("0.11.2", tmp_path)
    assert (
        old is not None and old.args == () and old.env["VLLM_TORCH_PROFILER_DIR"] == str(tmp_path)
    )
    assert new.start_path == "/start_profile" and new.stop_path == "/stop_profile"
    assert "async_llm" in new.skip
    assert vllm.profiler("unknown", tmp_path) is None


SLA = """\
model: {synth: tiny-llama}
target: TARGET
workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 1}, requests: 4}
TUNE
"""


@pytest.mark.parametrize(
    ("target", "tune", "on"),
    [
        ("cpu", "", False),
        ("{gpu: 0}", "", True),
        ("cpu", "tune: {profile: true}", True),
        ("{gpu: 0}", "tune: {profile: false}", False),
    ],
)
def test_profiling_is_on_for_gpu_targets_unless_the_sla_says(
    target: str, tune: str, on: bool
) -> None:
    assert enabled(parse_sla(SLA.replace("TARGET", target).replace("TUNE", tune))) is on


def test_tune_profile_takes_only_a_boolean() -> None:
    with pytest.raises(SlaError, match=r"x\.yaml:4: tune\.profile: must be true or false") as info:
        parse_sla(SLA.replace("TARGET", "cpu").replace("TUNE", "tune: {profile: 'yes'}"), "x.yaml")
    assert info.value.exit_code == 2
