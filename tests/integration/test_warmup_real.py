"""The warm-up to steady state on a real vLLM (issue 28, section 1): a real trial's record
holds what the warm-up before its first level took (requests, seconds, steady or the bound
that ended it) and the host's load before and during the trial. Measured on the suite's shared
engine (conftest's ``shared_engine``): the warm-up, not the launch, is under test (its own
launch cost ~45 s on 2 cores)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotuner.search.trial import SearchSettings, TrialResult, run_trial
from autotuner.sla.spec import parse_sla
from tests.unit.measure.test_steady_warmup import adapter_kw

from .conftest import SharedEngine, cpu_sla

pytestmark = pytest.mark.slow


def test_a_real_launch_records_its_warmup_and_the_hosts_load(
    shared_engine: SharedEngine,
    vllm_python: Path,
    tiny_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared_engine.serve_trials(monkeypatch)  # the trial runs on the shared engine
    workload = {
        "input_tokens": 32,
        "output_tokens": 8,
        "arrival": {"process": "poisson", "rate": 2.0},
        "requests": 16,
        "seed": 7,
    }
    sla = cpu_sla(
        "it-warmup",
        workload,
        params={"max_model_len": 1024},  # the shared engine's
        model={"path": str(tiny_model)},
        tune={"max_levels": 1, "warmup": {"max_s": 30}},
    )
    spec = parse_sla(yaml.safe_dump(sla))
    result = run_trial(
        dict(spec.engine.params),
        spec,
        python=vllm_python,
        model_dir=tiny_model,
        run_dir=tmp_path / "run",
        cuda_devices=None,
        **adapter_kw(spec),
        settings=SearchSettings(max_levels=1),
    )
    assert result.status in ("complete", "stopped_early"), (result.reason, result.extra)
    record = TrialResult.read(tmp_path / "run" / "trial.json")
    warm = record.levels[0].warmup
    assert warm is not None, record.levels[0]
    # 16-request levels: windows of 5, so at least 10 requests (warmup_requests 2 is below).
    assert warm["requests"] >= 10 and 0 < warm["seconds"] <= 30 + 60
    assert warm["stopped_by"] in ("steady", "max_requests", "max_s")
    assert warm["steady"] == (warm["stopped_by"] == "steady")
    assert warm["load"] == "poisson 2 req/s" and len(warm["windows"]) >= 2
    host = record.extra["host"]
    assert {"cores", "busy", "before"} <= set(host) and "others_share" in host["before"]
    assert record.gpu_seconds.get("warmup", 0) > 0  # the warm-up is its own phase
