"""A data-parallel layout run as two engine replicas on the real CPU vLLM.

``search.data_parallel: replicas`` with ``data_parallel_size: 2``: the tuner starts two vLLM
servers of the generated tiny model, each bound to its own core, and the load generator sends
requests to their endpoints in turn. One launch (two servers), two short load levels.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from autotuner.engines import registry
from autotuner.search.trial import SearchSettings, run_trial
from autotuner.sla.spec import parse_sla

from .conftest import KV_BYTES, TAG_VAR, assert_no_leftovers, cpu_sla

pytestmark = pytest.mark.slow

WARMUP = 2
COMPLETION = re.compile(r'"POST /v1/completions HTTP/1\.1" 200')


def test_two_replicas_share_the_load_and_capacity_per_gpu_counts_both(
    vllm_python: Path, tiny_model: Path, tag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TAG_VAR, tag)
    workload = {
        "input_tokens": 64,
        "output_tokens": 8,
        "arrival": {"process": "poisson", "rate": 2.0},
        "requests": 16,
        "seed": 3,
    }
    sla = cpu_sla(
        "it-replicas",
        workload,
        # a share each: the two servers share the host's memory (a rule)
        params={"kv_cache_memory_bytes": KV_BYTES},
        model={"path": str(tiny_model)},
        search={"data_parallel": "replicas", "params": {"data_parallel_size": {"values": [1, 2]}}},
    )
    spec = parse_sla(yaml.safe_dump(sla))
    run_dir = tmp_path / "run"
    result = run_trial(
        {**spec.engine.params, "data_parallel_size": 2},
        spec,
        python=vllm_python,
        model_dir=tiny_model,
        run_dir=run_dir,
        cuda_devices=None,
        adapter=registry.get(spec.engine.kind),
        settings=SearchSettings(max_levels=2),
    )
    assert result.status == "complete", (result.reason, result.extra.get("log_tail"))
    # The engine's flag was not passed: the tuner ran the copies itself.
    assert "--data-parallel-size" not in result.argv
    logs = [run_dir / "engine.log", run_dir / "engine-r1.log"]
    served = [len(COMPLETION.findall(log.read_text())) for log in logs]
    # The first level sends the warm-up first (later levels and re-measures do not): until
    # the engine is steady, at least the SLA's warmup_requests; its record says how many.
    warm = sum(int((lv.warmup or {}).get("requests", 0)) for lv in result.levels)
    assert warm >= WARMUP
    sent = warm + sum(lv.requests or 0 for lv in result.levels)
    # Every request reached one of the two servers, and they took turns.
    assert sum(served) == sent, served
    runs = sum(lv.runs for lv in result.levels)  # each run's odd request may tilt by one
    assert abs(served[0] - served[1]) <= 1 + runs, served
    # The engine's readings are of both servers: every prompt token was looked up in one of
    # the two prefix caches (one server's alone would be about half).
    for level in result.levels:
        assert level.requests is not None
        assert level.engine["prefix_cache_queries"] >= 0.75 * level.requests * 64, level.engine
    cap = result.metric("capacity")
    per_gpu = result.metric("capacity_per_gpu")
    assert cap is not None and cap > 0 and per_gpu is not None
    assert per_gpu == pytest.approx(cap / 2)
    assert_no_leftovers(tag)
