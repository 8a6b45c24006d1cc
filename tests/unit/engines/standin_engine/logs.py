"""Reading the stand-in's log: why a launch failed, and the lines that say so.

The stand-in fails at start in three ways: argparse refuses its command line, its ``oom``
fault prints an engine's out-of-memory refusal, or it exits with a line of its own.
"""

from __future__ import annotations

import re

from autotuner.engines.base import LaunchCause

_CAUSE_PATTERNS: list[tuple[LaunchCause, re.Pattern[str]]] = [
    (
        LaunchCause.UNKNOWN_FLAG,
        re.compile(
            r"unrecognized arguments|error: argument|invalid choice|expected one argument"
            r"|the following arguments are required",
            re.I,
        ),
    ),
    (
        LaunchCause.OUT_OF_MEMORY,
        re.compile(r"out of memory|MemoryError|less than desired (?:CPU|GPU) memory", re.I),
    ),
]

# The stand-in's KV cache is a gauge, never a limit; the only refusal it prints about it is
# at start, for a cache of no tokens (StandinConfig's check, through argparse).
KV_STARVED = re.compile(r"kv_cache_tokens must be >= 1")

# A line that says why: a traceback's last line or argparse's refusal.
_CAUSE_LINE = re.compile(r"\b\w*(?:Error|Exception)\b:|: error: |stand-in: exiting")
ROOT_CAUSE_LINES = 3

# Sample log tails per cause, as the stand-in prints them (the contract suite's samples).
SAMPLE_LOGS: dict[LaunchCause, str] = {
    LaunchCause.UNKNOWN_FLAG: (
        "python -m autotuner.testing.standin: error: unrecognized arguments: --bogus 1"
    ),
    LaunchCause.OUT_OF_MEMORY: (
        "(EngineCore_DP0 pid=2187) ERROR 12-01 09:12:58 [core.py:1510] ValueError: Available"
        " memory on node 0 (9.23/10.96 GiB) on startup is less than desired CPU memory"
        " utilization (0.99, 10.85 GiB). Decrease memory utilization."
    ),
    LaunchCause.OTHER: "stand-in: exiting at start (fault 'exit')",
}


def classify_failure(log_tail: str) -> LaunchCause:
    """Map the last lines of the stand-in's log to a :class:`LaunchCause`."""
    for cause, pattern in _CAUSE_PATTERNS:
        if pattern.search(log_tail):
            return cause
    return LaunchCause.OTHER


def root_cause(log: str) -> list[str]:
    """The first lines of the log that say why the stand-in failed."""
    lines = [line.strip() for line in log.splitlines() if _CAUSE_LINE.search(line)]
    return lines[:ROOT_CAUSE_LINES]
