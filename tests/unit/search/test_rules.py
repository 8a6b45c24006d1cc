"""Pruning rules (both sides of every boundary) and the crash memory."""

from __future__ import annotations

from typing import Any

import pytest

from autotuner.core.hardware import GIB, CpuInfo, GpuInfo, HardwareProfile
from autotuner.engines import registry
from autotuner.engines.base import LaunchCause
from autotuner.models import synth
from autotuner.search.rules import CrashMemory, check

H200_TOTAL = 150_754_820_096
VLLM = registry.get("vllm")


def cfg(arch: str = "llama-3.1-8b", **changes: Any) -> dict[str, Any]:
    return {**synth.ARCHS[arch].config(), **changes}


def host(flags: set[str] | None = None) -> CpuInfo:
    return CpuInfo(
        model="test CPU",
        cores=8,
        logical_cpus=8,
        memory_total=32 * GIB,
        memory_available=30 * GIB,
        numa_memory=(32 * GIB,),
        numa_node_of_first_cpu=0,
        flags=frozenset({"avx2", "avx512f"} if flags is None else flags),
    )


def gpus(count: int = 1, cc: tuple[int, int] = (9, 0), total: int = H200_TOTAL) -> HardwareProfile:
    devices = tuple(
        GpuInfo(
            index=i, uuid=f"GPU-{i}", name="NVIDIA H200", compute_capability=cc, memory_total=total
        )
        for i in range(count)
    )
    return HardwareProfile(device="gpu", cpu=host(), gpus=devices)


def cpu(flags: set[str] | None = None) -> HardwareProfile:
    return HardwareProfile(device="cpu", cpu=host(flags))


def reasons(
    params: dict[str, Any],
    hw: HardwareProfile | None = None,
    model: dict[str, Any] | None = None,
    max_model_len: int | None = 4096,
) -> list[str]:
    return check(
        params,
        model_cfg=model if model is not None else cfg(),
        hardware=hw if hw is not None else gpus(),
        context_len=max_model_len,
        engine=VLLM,
    )


def tiny_reasons(params: dict[str, Any], hw: HardwareProfile | None = None) -> list[str]:
    params = {"gpu_memory_utilization": 0.3, **params}
    hw = hw or cpu()
    return check(params, model_cfg=cfg("tiny-llama"), hardware=hw, context_len=1024, engine=VLLM)


def test_a_plain_config_passes() -> None:
    assert reasons({}) == []
    assert reasons({"max_num_seqs": 256, "max_num_batched_tokens": 8192}) == []
    assert tiny_reasons({"max_num_seqs": 16}) == []


# --------------------------------------------------------------------------- batching


def test_without_chunked_prefill_the_budget_must_hold_max_model_len() -> None:
    off = {"enable_chunked_prefill": False}
    (msg,) = reasons({**off, "max_num_batched_tokens": 4095})
    assert msg.startswith("without chunked prefill, max_num_batched_tokens (4095) must be >= ")
    assert reasons({**off, "max_num_batched_tokens": 4096}) == []
    assert reasons({"enable_chunked_prefill": True, "max_num_batched_tokens": 2048}) == []
    assert reasons({"max_num_batched_tokens": 2048}) == []  # engine default: chunked


def test_max_model_len_comes_from_params_then_the_config() -> None:
    off = {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}
    assert reasons({**off, "max_model_len": 8192}, max_model_len=None) == []
    assert reasons({**off, "max_model_len": 8193}, max_model_len=None) != []
    assert reasons(off, max_model_len=None) != []  # the config's 131072


def test_long_prefill_threshold_needs_chunked_prefill() -> None:
    (msg,) = reasons({"enable_chunked_prefill": False, "long_prefill_token_threshold": 512})
    assert "only acts with chunked prefill" in msg
    assert reasons({"enable_chunked_prefill": True, "long_prefill_token_threshold": 512}) == []
    assert reasons({"enable_chunked_prefill": False, "long_prefill_token_threshold": 0}) == []


def test_max_num_seqs_must_not_exceed_the_token_budget() -> None:
    (msg,) = reasons({"max_num_seqs": 1025, "max_num_batched_tokens": 1024})
    assert msg.startswith("max_num_seqs (1025) must be <= max_num_batched_tokens (1024)")
    assert reasons({"max_num_seqs": 1024, "max_num_batched_tokens": 1024}) == []


def test_max_num_seqs_against_the_engine_default_budget() -> None:
    # CPU engine default: 2048 batched tokens.
    assert tiny_reasons({"max_num_seqs": 2049}) != []
    assert tiny_reasons({"max_num_seqs": 2048}) == []
    # A small budget lowers vLLM's default max_num_seqs instead of failing.
    assert tiny_reasons({"max_num_batched_tokens": 64}) == []


def test_active_seqs_must_not_exceed_max_num_seqs() -> None:
    (msg,) = reasons({"max_num_seqs": 64, "max_num_active_seqs": 65})
    assert msg == "max_num_active_seqs (65) must be <= max_num_seqs (64)"
    assert reasons({"max_num_seqs": 64, "max_num_active_seqs": 64}) == []


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize("param", [{"kv_cache_dtype": "fp8"}, {"quantization": "fp8"}])
def test_fp8_needs_compute_capability_8_9(param: dict[str, Any]) -> None:
    (msg,) = reasons(param, gpus(cc=(8, 6)))
    assert "compute capability >= 8.9 (have 8.6)" in msg
    assert reasons(param, gpus(cc=(8, 9))) == []


def test_bfloat16_needs_compute_capability_8_0() -> None:
    (msg,) = reasons({"dtype": "bfloat16"}, gpus(cc=(7, 5), total=32 * GIB))
    assert msg.startswith("bfloat16 needs compute capability >= 8.0 (have 7.5)")
    assert reasons({"dtype": "bfloat16"}, gpus(cc=(8, 0), total=32 * GIB)) == []
    assert reasons({"dtype": "auto"}, gpus(cc=(7, 5), total=32 * GIB)) == []  # falls back


def test_fp8_kv_on_cpu_needs_avx512_or_amx() -> None:
    (msg,) = tiny_reasons({"kv_cache_dtype": "fp8"}, cpu({"avx2"}))
    assert msg == "an FP8 KV cache on the CPU engine needs x86 with AVX-512 or AMX"
    assert tiny_reasons({"kv_cache_dtype": "fp8"}, cpu({"avx2", "avx512f"})) == []
    assert tiny_reasons({"kv_cache_dtype": "fp8"}, cpu({"amx_tile"})) == []


def test_fp8_kv_on_cpu_needs_head_dim_divisible_by_32() -> None:
    odd = cfg("tiny-llama", head_dim=48)
    params = {"kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.3}
    (msg,) = check(params, model_cfg=odd, hardware=cpu(), context_len=1024, engine=VLLM)
    assert "head_dim divisible by 32 (have 48)" in msg
    tiny = cfg("tiny-llama")
    assert check(params, model_cfg=tiny, hardware=cpu(), context_len=1024, engine=VLLM) == []


def test_fp8_weights_are_not_available_on_cpu() -> None:
    (msg,) = tiny_reasons({"quantization": "fp8"})
    assert "not available on the CPU engine" in msg
    assert tiny_reasons({"quantization": None}) == []


# --------------------------------------------------------------------------- parallelism


def test_tensor_parallel_size_at_most_the_gpus() -> None:
    (msg,) = reasons({"tensor_parallel_size": 2}, gpus(count=1))
    assert msg == "tensor_parallel_size 2 > the target's 1 GPU(s)"
    assert reasons({"tensor_parallel_size": 2}, gpus(count=2)) == []


def test_tensor_parallel_size_divides_the_heads() -> None:
    odd = cfg(num_attention_heads=24, head_dim=128)  # 24 heads, 8 KV heads
    msgs = reasons({"tensor_parallel_size": 16}, gpus(count=16), model=odd)
    assert "tensor_parallel_size 16 does not divide num_attention_heads (24)" in msgs
    assert reasons({"tensor_parallel_size": 8}, gpus(count=8), model=odd) == []


def test_tensor_parallel_size_and_kv_heads_divide_one_another() -> None:
    six_kv = cfg(num_key_value_heads=6)
    (msg,) = reasons({"tensor_parallel_size": 4}, gpus(count=4), model=six_kv)
    assert msg == "tensor_parallel_size 4 and num_key_value_heads (6) must divide one another"
    assert reasons({"tensor_parallel_size": 2}, gpus(count=2), model=six_kv) == []
    # More ranks than KV heads is fine when the heads replicate evenly (16 = 2 x 8).
    assert reasons({"tensor_parallel_size": 16}, gpus(count=16)) == []


# --------------------------------------------------------------------------- CPU engine


@pytest.mark.parametrize(
    ("bad", "good"),
    [
        ({"async_scheduling": True}, {"async_scheduling": False}),
        ({"max_cudagraph_capture_size": 256}, {"max_cudagraph_capture_size": None}),
        ({"performance_mode": "interactivity"}, {"performance_mode": "balanced"}),
    ],
)
def test_options_the_cpu_engine_ignores(bad: dict[str, Any], good: dict[str, Any]) -> None:
    assert len(tiny_reasons(bad)) == 1
    assert tiny_reasons(good) == []
    assert reasons(bad) == []  # meaningful on a GPU


# --------------------------------------------------------------------------- memory


def test_memory_rule() -> None:
    (msg,) = reasons({}, model=cfg("llama-3.1-70b"))
    assert msg.startswith("memory: weights (131.")
    assert reasons({}, model=cfg("llama-3.1-8b")) == []
    (msg,) = reasons({"gpu_memory_utilization": 0.13}, max_model_len=131072)
    assert msg.startswith("memory: needs at least max_model_len=131072 tokens of KV cache")
    assert reasons({"gpu_memory_utilization": 0.13}, max_model_len=8192) == []


# --------------------------------------------------------------------------- crash memory

CRASHED = {"gpu_memory_utilization": 0.9, "max_num_seqs": 256, "block_size": 16}


def oom_memory(detail: str = "torch.OutOfMemoryError: CUDA out of memory") -> CrashMemory:
    mem = CrashMemory(traits=VLLM.crash_traits)
    mem.record(CRASHED, LaunchCause.OUT_OF_MEMORY, detail, label="trial 3")
    return mem


def test_near_an_oom_crash_when_every_memory_knob_is_at_least_as_large() -> None:
    mem = oom_memory()
    msg = mem.near_crash({**CRASHED, "gpu_memory_utilization": 0.95, "max_num_seqs": 512})
    assert msg == (
        "near a config that ran out of memory at launch (trial 3): "
        "gpu_memory_utilization 0.95 >= 0.9, max_num_seqs 512 >= 256"
    )
    assert mem.near_crash(CRASHED) is not None  # the same config
    assert mem.near_crash({**CRASHED, "gpu_memory_utilization": 0.85}) is None
    assert mem.near_crash({**CRASHED, "max_num_seqs": 255}) is None


def test_other_options_must_match() -> None:
    mem = oom_memory()
    assert mem.near_crash({**CRASHED, "block_size": 32}) is None
    assert mem.near_crash({**CRASHED, "kv_cache_dtype": "fp8"}) is None  # only on one side
    assert mem.near_crash({**CRASHED, "stream_interval": 8}) is not None  # memory-neutral


def test_missing_options_use_the_defaults() -> None:
    mem = CrashMemory(defaults={"gpu_memory_utilization": 0.92}, traits=VLLM.crash_traits)
    mem.record({"max_num_seqs": 256}, "out_of_memory")
    assert mem.near_crash({"max_num_seqs": 256, "gpu_memory_utilization": 0.92}) is not None
    assert mem.near_crash({"max_num_seqs": 256, "gpu_memory_utilization": 0.9}) is None
    plain = CrashMemory(traits=VLLM.crash_traits)
    plain.record({"max_num_seqs": 256}, "out_of_memory")
    assert plain.near_crash({"max_num_seqs": 256, "gpu_memory_utilization": 0.95}) is None


def test_only_out_of_memory_crashes_block() -> None:
    mem = CrashMemory(traits=VLLM.crash_traits)
    mem.record(CRASHED, LaunchCause.CUDA_ERROR, "CUDA error: illegal memory access")
    mem.record(CRASHED, "unknown_flag")
    assert len(mem.crashes) == 2
    assert mem.near_crash(CRASHED) is None


def test_a_kv_starved_crash_blocks_lower_utilization_instead() -> None:
    detail = (
        "ValueError: To serve at least one request with the models's max seq len (131072), "
        "(16.0 GiB KV cache is needed, which is larger than the available KV cache memory"
    )
    mem = oom_memory(detail)
    assert mem.near_crash({**CRASHED, "gpu_memory_utilization": 0.95}) is None
    msg = mem.near_crash({**CRASHED, "gpu_memory_utilization": 0.85})
    assert msg is not None and "gpu_memory_utilization 0.85 <= 0.9" in msg
