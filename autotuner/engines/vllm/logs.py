"""Reading vLLM's log: why a launch failed (argparse, memory, CUDA), and KV-cache starvation."""

from __future__ import annotations

import re

from autotuner.engines.base import LaunchCause

_CAUSE_PATTERNS: list[tuple[LaunchCause, re.Pattern[str]]] = [
    (
        LaunchCause.UNKNOWN_FLAG,
        re.compile(
            r"unrecognized arguments|error: argument|invalid choice|no such option"
            r"|ambiguous option|expected one argument",
            re.I,
        ),
    ),
    (
        LaunchCause.OUT_OF_MEMORY,
        re.compile(
            r"out of memory|OutOfMemoryError|No available memory for the cache blocks"
            r"|insufficient memory|Cannot allocate memory|larger than the available KV cache"
            r"|not enough (?:KV cache|memory)|MemoryError|std::bad_alloc"
            r"|exceeds the available|free memory on device",
            re.I,
        ),
    ),
    (
        LaunchCause.CUDA_ERROR,
        re.compile(
            r"CUDA error|cudaError|CUDA driver|NVIDIA driver|no CUDA-capable device"
            r"|NCCL error|CUBLAS_STATUS|device-side assert|Found no NVIDIA driver",
            re.I,
        ),
    ),
]

# "not enough KV cache for one sequence": more memory for the cache would have helped.
KV_STARVED = re.compile(
    r"larger than the available KV cache|No available memory for the cache blocks"
    r"|KV cache is needed|not enough KV cache|max_model_len .* KV cache",
    re.I,
)


def classify_failure(log_tail: str) -> LaunchCause:
    """Map the last lines of an engine log to a :class:`LaunchCause`."""
    for cause, pattern in _CAUSE_PATTERNS:
        if pattern.search(log_tail):
            return cause
    return LaunchCause.OTHER
