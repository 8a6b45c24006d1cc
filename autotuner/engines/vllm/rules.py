"""vLLM's pruning rules: reasons a candidate config must not be launched.

``params`` are the engine options the launch would get (snake_case; missing options take
vLLM's defaults). The rules, each a small function in :data:`RULES`:

* batching: without chunked prefill ``max_num_batched_tokens >= max_model_len``;
  ``max_num_seqs <= max_num_batched_tokens``; ``max_num_active_seqs <= max_num_seqs``;
  ``long_prefill_token_threshold`` needs chunked prefill;
* precision: FP8 weights or KV cache need compute capability >= 8.9, bf16 needs >= 8.0; on
  the CPU engine FP8 KV cache needs AVX-512 or AMX and a head_dim divisible by 32, and FP8
  weight quantization is not available;
* parallelism: ``tensor_parallel_size`` <= the target's GPUs, dividing the attention heads
  (and the KV heads, or divisible by them); ``pipeline_parallel_size`` dividing the layers;
  the whole layout (tensor x pipeline x data parallel) <= the target's GPUs; on a CPU target
  at most one engine rank per core, and their memory budgets together within the host's;
* CPU engine: options it ignores (async scheduling, CUDA-graph sizes, interactivity mode) are
  rejected, so that no launch repeats another one;
* memory: :func:`autotuner.engines.vllm.memory.estimate` says the config does not fit.

:data:`CRASH_TRAITS` tells the crash memory (:mod:`autotuner.search.rules`) which options
size memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autotuner.core.hardware import HardwareProfile
from autotuner.engines.base import CrashTraits
from autotuner.engines.layout import Layout
from autotuner.engines.memory import ModelShape, model_max_len, parse_token_count
from autotuner.engines.vllm.defaults import engine_batch_defaults
from autotuner.engines.vllm.logs import KV_STARVED
from autotuner.engines.vllm.memory import estimate
from autotuner.engines.vllm.roles import ROLES

__all__ = ["CRASH_TRAITS", "RULES", "check"]

Params = Mapping[str, Any]

# On a CPU target every engine rank sizes its KV cache from the same host memory: together
# they may ask for at most this fraction of it (the rest: the OS, the tuner, the load).
CPU_SHARED_MEMORY_LIMIT = 0.8


@dataclass(frozen=True)
class _Ctx:
    cfg: Mapping[str, Any]
    hardware: HardwareProfile
    max_model_len: int
    env: Mapping[str, str]


def _is_fp8(value: Any) -> bool:
    return isinstance(value, str) and value.lower().startswith("fp8")


def _cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


# --------------------------------------------------------------------------- rules


def _chunked_prefill(p: Params, ctx: _Ctx) -> list[str]:
    out = []
    if p.get("enable_chunked_prefill") is False:
        tokens = parse_token_count(p.get("max_num_batched_tokens"))
        if tokens is not None and tokens < ctx.max_model_len:
            out.append(
                f"without chunked prefill, max_num_batched_tokens ({tokens}) must be >= "
                f"max_model_len ({ctx.max_model_len}): a whole prompt is prefilled in one step"
            )
        threshold = parse_token_count(p.get("long_prefill_token_threshold"))
        if threshold:
            out.append(
                "long_prefill_token_threshold only acts with chunked prefill "
                "(enable_chunked_prefill is false)"
            )
    return out


def _batch_sizes(p: Params, ctx: _Ctx) -> list[str]:
    out = []
    tokens = parse_token_count(p.get("max_num_batched_tokens"))
    seqs = parse_token_count(p.get("max_num_seqs"))
    if tokens is not None or seqs is not None:
        tp = parse_token_count(p.get("tensor_parallel_size")) or 1
        d_tokens, d_seqs = engine_batch_defaults(
            ctx.hardware, tensor_parallel_size=tp, performance_mode=p.get("performance_mode")
        )
        if tokens is None:  # vLLM's default, raised to max_model_len without chunking
            tokens = d_tokens
            if p.get("enable_chunked_prefill") is False:
                tokens = max(tokens, ctx.max_model_len)
        if seqs is None:  # vLLM lowers its default to fit the token budget
            seqs = min(d_seqs, tokens)
        if seqs > tokens:
            out.append(
                f"max_num_seqs ({seqs}) must be <= max_num_batched_tokens ({tokens}): "
                "every running sequence needs a token slot in a step"
            )
    active = parse_token_count(p.get("max_num_active_seqs"))
    if active is not None and seqs is not None and active > seqs:
        out.append(f"max_num_active_seqs ({active}) must be <= max_num_seqs ({seqs})")
    return out


def _precision(p: Params, ctx: _Ctx) -> list[str]:
    out = []
    hw = ctx.hardware
    kv_fp8 = _is_fp8(p.get("kv_cache_dtype"))
    w_fp8 = _is_fp8(p.get("quantization"))
    if hw.device == "gpu":
        cc = hw.compute_capability
        if cc is not None and cc < (8, 9):
            if kv_fp8:
                out.append(f"an FP8 KV cache needs compute capability >= 8.9 (have {_cc_text(cc)})")
            if w_fp8:
                out.append(f"FP8 weights need compute capability >= 8.9 (have {_cc_text(cc)})")
        # dtype auto falls back to float16 on such GPUs (vLLM >= 0.11); only an explicit
        # bfloat16 fails.
        if cc is not None and cc < (8, 0) and str(p.get("dtype")).lower() == "bfloat16":
            out.append(
                f"bfloat16 needs compute capability >= 8.0 (have {_cc_text(cc)}); "
                "use dtype auto or half"
            )
        return out
    if kv_fp8:
        flags = hw.cpu.flags
        if flags and not flags & {"avx512f", "amx_tile"}:
            out.append("an FP8 KV cache on the CPU engine needs x86 with AVX-512 or AMX")
        head_dim = ModelShape.of(ctx.cfg).head_dim
        if head_dim % 32:
            out.append(
                f"an FP8 KV cache on the CPU engine needs head_dim divisible by 32 "
                f"(have {head_dim})"
            )
    if w_fp8:
        out.append("FP8 weight quantization is not available on the CPU engine (CUDA kernels)")
    return out


def _parallel(p: Params, ctx: _Ctx) -> list[str]:
    layout = Layout.of(p, ROLES)
    tp, pp = layout.tp, layout.pp
    out = []
    hw = ctx.hardware
    shape = ModelShape.of(ctx.cfg)
    if pp > 1 and shape.layers % pp:
        out.append(
            f"pipeline_parallel_size {pp} does not divide num_hidden_layers ({shape.layers})"
        )
    if hw.device == "gpu" and tp * pp <= hw.gpu_count and layout.devices > hw.gpu_count:
        out.append(
            f"layout {layout.describe()} needs {layout.devices} GPUs, the target has {hw.gpu_count}"
        )
    if hw.device == "cpu":
        out += _cpu_layout(layout, p, ctx)
    if tp <= 1:
        return out
    if hw.device == "gpu" and tp > hw.gpu_count:
        out.append(f"tensor_parallel_size {tp} > the target's {hw.gpu_count} GPU(s)")
    if shape.heads % tp:
        out.append(f"tensor_parallel_size {tp} does not divide num_attention_heads ({shape.heads})")
    kv = shape.kv_heads
    if (tp <= kv and kv % tp) or (tp > kv and tp % kv):
        out.append(
            f"tensor_parallel_size {tp} and num_key_value_heads ({kv}) must divide one another"
        )
    return out


def _cpu_layout(layout: Layout, p: Params, ctx: _Ctx) -> list[str]:
    """Engine ranks on a CPU target: each needs its own core(s), and every rank's memory
    budget comes out of the same host memory."""
    out = []
    cores = ctx.hardware.cpu.cores
    if cores and layout.devices > cores:
        out.append(
            f"layout {layout.describe('rank')} runs {layout.devices} engine ranks, "
            f"the host has {cores} CPU core(s)"
        )
    if layout.devices > 1:
        util = float(p.get("gpu_memory_utilization") or 0.0)
        if util * layout.devices > CPU_SHARED_MEMORY_LIMIT:
            out.append(
                f"{layout.devices} engine ranks x gpu_memory_utilization {util:g} = "
                f"{util * layout.devices:.2g} of the host memory, more than "
                f"{CPU_SHARED_MEMORY_LIMIT:g}: the ranks share it"
            )
    return out


def _cpu_engine(p: Params, ctx: _Ctx) -> list[str]:
    if ctx.hardware.device != "cpu":
        return []
    out = []
    if p.get("async_scheduling") is True:
        out.append("async_scheduling: the CPU engine forces it off (same as false)")
    for name in ("max_cudagraph_capture_size", "cudagraph_capture_sizes"):
        if p.get(name) is not None:
            out.append(f"{name}: the CPU engine has no CUDA graphs")
    if p.get("performance_mode") == "interactivity":
        out.append(
            "performance_mode interactivity only changes CUDA graphs: same as balanced on CPU"
        )
    return out


def _memory(p: Params, ctx: _Ctx) -> list[str]:
    est = estimate(ctx.cfg, p, ctx.hardware, max_model_len=ctx.max_model_len, env=ctx.env)
    return [] if est.fits else [f"memory: {est.reason}"]


RULES: list[Callable[[Params, _Ctx], list[str]]] = [
    _chunked_prefill,
    _batch_sizes,
    _precision,
    _parallel,
    _cpu_engine,
    _memory,
]


def check(
    params: Params,
    *,
    model_cfg: Mapping[str, Any],
    hardware: HardwareProfile,
    max_model_len: int | None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Reasons ``params`` must not be launched on ``hardware`` (empty: fine).

    ``max_model_len`` None: ``params["max_model_len"]``, else the model config's.
    ``env`` is the engine's environment (the CPU engine reads ``VLLM_CPU_KVCACHE_SPACE``).
    """
    mml = max_model_len or parse_token_count(params.get("max_model_len"))
    ctx = _Ctx(model_cfg, hardware, mml or model_max_len(model_cfg), env or {})
    reasons: list[str] = []
    for rule in RULES:
        reasons += rule(params, ctx)
    return reasons


CRASH_TRAITS = CrashTraits(
    # Numeric options where a larger value needs more memory (at start-up or under load).
    memory_params=frozenset(
        {
            "gpu_memory_utilization",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "max_cudagraph_capture_size",
            "kv_cache_memory_bytes",
        }
    ),
    budget_params=frozenset({"gpu_memory_utilization", "kv_cache_memory_bytes"}),
    # Options that do not change memory use; a crash says nothing about them.
    neutral_params=frozenset(
        {
            "stream_interval",
            "scheduling_policy",
            "long_prefill_token_threshold",
            "long_prefill_token_threshold_adaptive",
            "watermark",
            "disable_log_requests",
        }
    ),
    kv_starved=KV_STARVED,
)
