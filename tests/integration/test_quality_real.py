"""The quality gate against the real CPU engine: the generated tiny model (real, saved BF16
weights) as the lossless baseline, its INT8 W8A8 copy as the lossy candidate.

The CPU build has no fp8 on a host without AVX-512 or AMX (this CI machine: AVX2), but it
runs INT8 W8A8 checkpoints anywhere, so that is the lossy setting measured here. The baseline
(the suite's shared engine, serving the BF16 model) answers the prompts twice (the gate's
noise floor), the candidate (its own launch) once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.core.types import ParamValue
from autotuner.engines import registry
from autotuner.engines.base import EngineProcess
from autotuner.measure import gate
from autotuner.measure.gate import run_gate
from autotuner.measure.launch import make_engine
from autotuner.models.w8a8 import int8_copy
from autotuner.sla.spec import Sla, parse_sla

from .conftest import (
    SHARED_PARAMS,
    TAG_VAR,
    BorrowedEngine,
    SharedEngine,
    assert_no_leftovers,
    cpu_sla,
)

pytestmark = pytest.mark.slow


def test_gate_measures_int8_against_bf16(
    shared_engine: SharedEngine,
    vllm_python: Path,
    tiny_model: Path,
    tag: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TAG_VAR, tag)
    lossy = int8_copy(tiny_model, tmp_path / "tiny-llama-w8a8")
    launch = make_engine  # the real one, for the candidate

    def engine_for(
        sla: Sla,
        python: Path,
        model: Path,
        params: Mapping[str, ParamValue],
        *args: Any,
        **kwargs: Any,
    ) -> EngineProcess | BorrowedEngine:
        if model == tiny_model:  # the baseline: the shared engine serves the BF16 model
            return shared_engine.borrowed(dict(params))
        return launch(sla, python, model, params, *args, **kwargs)

    monkeypatch.setattr(gate, "make_engine", engine_for)
    data = cpu_sla(
        "gate",
        {
            "input_tokens": 16,
            "output_tokens": 8,
            "arrival": {"process": "poisson", "rate": 1.0},
            "requests": 4,
        },
        model={"path": str(tiny_model)},
        params={"max_model_len": SHARED_PARAMS["max_model_len"]},  # what the shared one runs
        quality={"prompts": 8, "max_tokens": 24, "min_token_agreement": 0.99},
    )
    sla = parse_sla(yaml.safe_dump(data))
    lines: list[str] = []
    result = run_gate(
        sla,
        engine=registry.get(sla.engine.kind),
        python=vllm_python,
        model_dir=tiny_model,
        baseline={},
        candidate={},
        candidate_model_dir=lossy,
        run_dir=tmp_path / "gate",
        say=lines.append,
    )
    assert_no_leftovers(tag)

    # The baseline repeats itself exactly: greedy, one request at a time, same engine.
    assert result.repeat_agreement == 1.0, lines
    assert result.repeat_mean_kl is not None and result.repeat_mean_kl < 1e-6
    # INT8 moves the log-probabilities: measured, not zero, and the near-flat logits of random
    # weights flip some greedy tokens.
    assert result.prompts == 8 and result.positions >= 8
    assert result.mean_kl is not None and result.mean_kl > 0
    assert result.token_agreement is not None and result.token_agreement < 1.0
    assert result.verdict == "fail"  # 0.99 agreement asked; the reason says by how much
    assert "token agreement" in result.reason and "< 99.0%" in result.reason
    saved = json.loads((tmp_path / "gate" / "quality.json").read_text())
    assert saved["result"]["verdict"] == "fail"
    assert len(saved["prompts"]) == 8
    assert any(row["baseline"] != row["candidate"] for row in saved["prompts"])
    assert (tmp_path / "gate" / "candidate" / "engine.log").read_text().count("compressed")
