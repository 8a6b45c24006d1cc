"""vLLM's own values of the options it decides per device (checked against 0.32).

The search space leaves these ``null`` (the engine decides at start-up); the memory model,
the pruning rules and the SLA's memory limit need the numbers the engine will pick.
"""

from __future__ import annotations

from autotuner.core.hardware import HardwareProfile
from autotuner.core.types import Params, ParamValue
from autotuner.engines.memory import GIB, parse_token_count

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vLLM's default since ~0.2x (0.9 before)
GPU_BLOCK_SIZE = 16  # tokens per KV block for most GPU attention backends
CPU_BLOCK_SIZE = 128


def engine_batch_defaults(
    hardware: HardwareProfile,
    *,
    tensor_parallel_size: int = 1,
    performance_mode: object = None,
) -> tuple[int, int]:
    """vLLM's API-server defaults ``(max_num_batched_tokens, max_num_seqs)`` (0.32).

    GPUs >= 160 GiB: 16384 / 1024; >= 70 GiB except A100: 8192 / 1024; others: 2048 / 256.
    CPU: 2048 x world / 128 x world. ``performance_mode=throughput`` doubles both.
    """
    if hardware.device == "cpu":
        tokens, seqs = 2048 * tensor_parallel_size, 128 * tensor_parallel_size
    else:
        total = hardware.device_memory_total
        name = hardware.gpus[0].name.lower() if hardware.gpus else ""
        if total >= 160 * GIB:
            tokens, seqs = 16384, 1024
        elif total >= 70 * GIB and "a100" not in name:
            tokens, seqs = 8192, 1024
        else:
            tokens, seqs = 2048, 256
    if performance_mode == "throughput":
        tokens, seqs = tokens * 2, seqs * 2
    return tokens, seqs


def defaults(hardware: HardwareProfile, params: Params | None = None) -> dict[str, ParamValue]:
    """The values vLLM picks on ``hardware`` for the options it decides per device.

    ``params`` are the other options of the launch (tensor parallelism and the performance
    mode change the batch sizes; ``max_num_seqs`` never exceeds the token budget).
    """
    p = params or {}
    tp = parse_token_count(p.get("tensor_parallel_size")) or 1
    tokens, seqs = engine_batch_defaults(
        hardware, tensor_parallel_size=tp, performance_mode=p.get("performance_mode")
    )
    cpu = hardware.device == "cpu"
    return {
        "gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION,
        "max_num_batched_tokens": tokens,
        "max_num_seqs": min(seqs, tokens),
        "block_size": CPU_BLOCK_SIZE if cpu else GPU_BLOCK_SIZE,
    }
