"""vLLM's own profiler: how each release is told to write torch profiler traces.

vLLM 0.13 and later take ``--profiler-config`` (JSON; read in vllm/config/profiler.py of
0.31.0 and 0.32.0: ``profiler``, ``torch_profiler_dir``, ``torch_profiler_with_stack``,
``ignore_frontend``); older releases the ``VLLM_TORCH_PROFILER_DIR`` variable. Either way the
server then has ``POST /start_profile`` and ``POST /stop_profile``, and each worker writes
``<rank>.<time>.pt.trace.json.gz`` into the directory when it stops.
"""

from __future__ import annotations

import json
from pathlib import Path

from autotuner.engines.base import ProfilerSetup
from autotuner.space import parse_version

CONFIG_FLAG_SINCE = (0, 13)
# `ignore_frontend` (no trace of the API server's own CPU work) is in every release checked
# from 0.31 on; earlier ones get the plain config and their frontend trace is skipped by name.
IGNORE_FRONTEND_SINCE = (0, 31)
ENV_VAR = "VLLM_TORCH_PROFILER_DIR"
FRONTEND_TRACE = "async_llm"  # in the name of the API server's own trace file


def setup(version: str, trace_dir: Path) -> ProfilerSetup | None:
    """The profiler launch of vLLM ``version`` writing to ``trace_dir`` (None: the version
    string is not one we can read, so we cannot tell which way it is configured)."""
    try:
        v = parse_version(version)
    except ValueError:
        return None
    where = str(trace_dir.absolute())
    if v < CONFIG_FLAG_SINCE:
        # Stack recording off: it multiplies the trace size and the profiler's overhead.
        env = {ENV_VAR: where, "VLLM_TORCH_PROFILER_WITH_STACK": "0"}
        return ProfilerSetup(args=(), env=env, skip=(FRONTEND_TRACE,))
    config: dict[str, object] = {
        "profiler": "torch",
        "torch_profiler_dir": where,
        "torch_profiler_with_stack": False,
    }
    if v >= IGNORE_FRONTEND_SINCE:
        config["ignore_frontend"] = True
    flag = json.dumps(config, separators=(",", ":"))
    return ProfilerSetup(args=("--profiler-config", flag), env={}, skip=(FRONTEND_TRACE,))
