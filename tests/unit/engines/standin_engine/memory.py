"""The stand-in's memory model: no weights, no device memory, a KV cache of tokens only.

The stand-in is one small Python process whatever the model: it reads no weights and holds
no tensors; its KV cache is a count (``kv_cache_tokens``) behind a usage gauge. So a config
fits when one full-length sequence fits that count, and it claims no device memory ahead on
a CPU target; on a GPU target it claims its process's nominal size (it never touches the
GPU, but a claim of nothing would say the target's memory limit cannot apply).
"""

from __future__ import annotations

from autotuner.core.hardware import HardwareProfile
from autotuner.core.types import Params
from autotuner.engines.base import MemoryClaim
from autotuner.engines.memory import GIB, MemoryEstimate

PROCESS_BYTES = 64 << 20  # an aiohttp server in CPython, measured order of magnitude
DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_KV_CACHE_TOKENS = 65536


def _int(params: Params, name: str, default: int) -> int:
    value = params.get(name)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _total(hardware: HardwareProfile) -> int:
    if hardware.device == "gpu" and hardware.gpus:
        return int(hardware.gpus[0].memory_total)
    return int(hardware.cpu.memory_total)


def estimate(params: Params, hardware: HardwareProfile, context_len: int | None) -> MemoryEstimate:
    """What ``params`` take on ``hardware``: the process, and a KV cache of tokens."""
    kv_tokens = _int(params, "kv_cache_tokens", DEFAULT_KV_CACHE_TOKENS)
    context = context_len or _int(params, "max_model_len", DEFAULT_MAX_MODEL_LEN)
    slots = _int(params, "max_concurrency", kv_tokens)
    fits = context <= kv_tokens
    reason = "" if fits else f"one sequence of {context} tokens exceeds kv_cache_tokens {kv_tokens}"
    return MemoryEstimate(
        device=hardware.device,
        total_bytes=_total(hardware),
        requested_bytes=PROCESS_BYTES,
        weights_bytes=0,
        overhead_bytes=PROCESS_BYTES,
        kv_budget_bytes=0,
        kv_bytes_per_token=0,
        kv_block=1,
        kv_tokens=kv_tokens,
        context_len=context,
        slots=slots,
        step_tokens=kv_tokens,
        fits=fits,
        reason=reason,
    )


def claim(params: Params, hardware: HardwareProfile) -> MemoryClaim | None:
    """Device memory taken up front: none on a CPU target, the process's on a GPU one."""
    if hardware.device == "cpu":
        return None
    return MemoryClaim(PROCESS_BYTES / GIB, f"the stand-in process, {PROCESS_BYTES >> 20} MiB")
