"""vLLM backend pieces that need no engine: argv, environment, failure classification."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.engines.base import LaunchCause
from autotuner.engines.process import tail
from autotuner.engines.vllm.flags import params_to_args
from autotuner.engines.vllm.launcher import VllmEngine
from autotuner.engines.vllm.logs import classify_failure


def engine(**kw: object) -> VllmEngine:
    args: dict[str, object] = {
        "python": Path("/venv/bin/python"),
        "model": Path("/models/tiny"),
        "served_name": "tiny",
        "params": {"max_num_seqs": 8},
        "extra_args": [],
        "env": {},
        "cuda_devices": None,
        "log_path": Path("/tmp/x.log"),
    }
    args.update(kw)
    return VllmEngine(**args)  # type: ignore[arg-type]


def test_params_to_args() -> None:
    assert params_to_args(
        {
            "max_num_seqs": 8,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "kv_cache_dtype": "fp8",
            "block_size": None,
            "gpu_memory_utilization": 0.3,
            "compilation_config": {"level": 3},
        }
    ) == [
        "--max-num-seqs",
        "8",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--kv-cache-dtype",
        "fp8",
        "--gpu-memory-utilization",
        "0.3",
        "--compilation-config",
        '{"level":3}',
    ]


@pytest.mark.parametrize("key", ["host", "port", "model", "served_model_name"])
def test_the_tuner_owns_host_port_and_model(key: str) -> None:
    with pytest.raises(ValueError, match="set by the tuner"):
        params_to_args({key: "x"})


@pytest.mark.parametrize("arg", ["--host", "--port=1", "--model"])
def test_extra_args_cannot_rebind(arg: str) -> None:
    with pytest.raises(ValueError, match="set by the tuner"):
        engine(extra_args=[arg, "0.0.0.0"])


def test_argv_binds_loopback_on_a_free_port_without_a_shell() -> None:
    e = engine(extra_args=["--seed", "1"])
    argv = e.argv()
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert int(argv[argv.index("--port") + 1]) == e.port > 0
    assert argv[-4:] == ["--max-num-seqs", "8", "--seed", "1"]


def test_environment_pins_devices_and_stays_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNER_VLLM_PYTHON", "/somewhere")
    cpu = engine().child_env()
    assert cpu["CUDA_VISIBLE_DEVICES"] == ""
    assert cpu["HF_HUB_OFFLINE"] == "1"
    assert "AUTOTUNER_VLLM_PYTHON" not in cpu
    gpu = engine(cuda_devices=["GPU-abc", "GPU-def"], env={"VLLM_X": "1"}).child_env()
    assert gpu["CUDA_VISIBLE_DEVICES"] == "GPU-abc,GPU-def"
    assert gpu["VLLM_X"] == "1"


# Log tails as vLLM prints them (argparse, CUDA, CPU worker, KV-cache check).
@pytest.mark.parametrize(
    ("log", "cause"),
    [
        ("api_server.py: error: unrecognized arguments: --bogus-flag", LaunchCause.UNKNOWN_FLAG),
        (
            "api_server.py: error: argument --kv-cache-dtype: invalid choice: 'fp9'",
            LaunchCause.UNKNOWN_FLAG,
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            LaunchCause.OUT_OF_MEMORY,
        ),
        (
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.",
            LaunchCause.OUT_OF_MEMORY,
        ),
        (
            "ValueError: To serve at least one request with the models's max seq len (8192), "
            "(1.00 GiB KV cache is needed, which is larger than the available KV cache memory",
            LaunchCause.OUT_OF_MEMORY,
        ),
        ("RuntimeError: CUDA error: no kernel image is available", LaunchCause.CUDA_ERROR),
        ("RuntimeError: Found no NVIDIA driver on your system.", LaunchCause.CUDA_ERROR),
        ("KeyError: 'model_type'", LaunchCause.OTHER),
    ],
)
def test_failure_classification(log: str, cause: LaunchCause) -> None:
    assert classify_failure("INFO starting\n" + log + "\n") == cause


def test_tail_reads_the_last_lines(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert tail(p, 3) == "line 997\nline 998\nline 999"
    assert tail(tmp_path / "missing") == ""
