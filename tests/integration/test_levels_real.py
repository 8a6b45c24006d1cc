"""Load levels on one engine against a real vLLM: each level must measure the prefill.

On the H200 every load level re-sent the first level's prompts, and vLLM's prefix cache
(on by default) served the later levels' prefills from the cache: mean prefill 42 ms at the
first level, 14 ms at the second, p99 TTFT 105 ms against 40 ms at a higher rate. Here the
engine's own prefix-cache counters must show no hit at any level.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotuner.search.trial import SearchSettings, run_trial
from autotuner.sla.spec import parse_sla

from .conftest import TAG_VAR, assert_no_leftovers, cpu_sla

pytestmark = pytest.mark.slow

# 400-token prompts: whole KV blocks (128 tokens on the CPU backend) that the cache could serve.
INPUT_TOKENS = 400
REQUESTS = 16


def test_every_load_level_sends_prompts_the_engine_has_not_cached(
    vllm_python: Path, tiny_model: Path, tag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TAG_VAR, tag)
    workload = {
        "input_tokens": INPUT_TOKENS,
        "output_tokens": 8,
        "arrival": {"process": "poisson", "rate": 2.0},
        "requests": REQUESTS,
        "seed": 5,
    }
    sla = cpu_sla(
        "it-levels",
        workload,
        # p90: resolvable from 29 requests per level (a p99 would need 299)
        constraints={"p90_ttft_ms": 60000, "max_error_rate": 0.0},
        params={"max_model_len": 1024},
        model={"path": str(tiny_model)},
    )
    spec = parse_sla(yaml.safe_dump(sla))
    # The SLA's fixed engine params, as tune passes them: without them vLLM asks for its
    # default 0.92 of the host's RAM and refuses to start on a machine that is not idle.
    result = run_trial(
        dict(spec.engine.params),
        spec,
        python=vllm_python,
        model_dir=tiny_model,
        run_dir=tmp_path / "run",
        cuda_devices=None,
        settings=SearchSettings(max_levels=3),
    )
    assert result.status == "complete", (result.reason, result.extra.get("log_tail"))
    assert len(result.levels) == 3
    # Levels grew from 16 requests to the 29 a p90 needs; every level met the loose limit,
    # so the level budget stopped the capacity search, and the record says so.
    assert [lv.requests for lv in result.levels] == [29, 29, 29]
    assert [lv.verdict for lv in result.levels] == ["meets"] * 3
    cap = result.capacity
    assert cap is not None and cap.stopped_by == "budget" and cap.high is None
    assert cap.low == result.levels[-1].load and "tune.max_levels = 3" in cap.note
    for level in result.levels:
        engine = level.engine
        assert engine["prefix_cache_queries"] >= REQUESTS * INPUT_TOKENS, engine
        assert engine["prefix_cache_hit_rate"] < 0.05, engine
    assert_no_leftovers(tag)
