"""Shared-prefix and multi-turn traffic against a real vLLM (CPU build) serving the tiny model.

The suite's shared engine (conftest's ``shared_engine``, prefix cache on) serves both checks:
shared system prompts are served from the engine's prefix cache (its own counters say so), and
a conversation's turns leave in order, each after the previous answer plus the think time,
resending the history.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.engines import registry
from autotuner.measure.bench import build_plan
from autotuner.measure.cache import cache_note
from autotuner.measure.loadgen import LoadResult, run_load
from autotuner.measure.monitor import Monitor
from autotuner.sla.spec import load_sla

from .conftest import SHARED_PARAMS, SharedEngine, cpu_sla

pytestmark = pytest.mark.slow

PARAMS = SHARED_PARAMS
VLLM = registry.get("vllm")


def _sla(tmp_path: Path, name: str, workload: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cpu_sla(name, workload, params=PARAMS)))
    return path


def test_shared_prefixes_hit_the_cache_and_conversations_keep_their_turns(
    shared_engine: SharedEngine, tiny_model: Path, tmp_path: Path
) -> None:
    # 256 tokens: two whole KV blocks of the CPU backend (128 tokens), which is what it caches.
    shared = load_sla(
        _sla(
            tmp_path,
            "shared",
            {
                "input_tokens": 16,
                "output_tokens": 4,
                "shared_prefix": {"prompts": 2, "tokens": 256, "share": 1.0},
                "arrival": {"process": "constant", "rate": 4.0},
                "requests": 12,
            },
        )
    )
    chat = load_sla(
        _sla(
            tmp_path,
            "chat",
            {
                "api": "chat",
                "input_tokens": 16,
                "output_tokens": 8,
                "shared_prefix": {"prompts": 1, "tokens": 128, "share": 1.0},
                "conversation": {"turns": 3, "think_time_s": 0.3},
                "arrival": {"process": "poisson", "rate": 3.0},
                "requests": 6,
            },
        )
    )
    engine, endpoint = shared_engine.engine, shared_engine.endpoint

    async def measured(endpoint: Any, plan: Any) -> LoadResult:
        monitor = Monitor(endpoint.base_url, engine.processes, None, metrics=VLLM.metrics)
        result = await run_load(endpoint.base_url, endpoint.model, plan, around=monitor)
        return LoadResult(
            result.plan, result.records, result.duration_s, result.warmup_failed, monitor.summary()
        )

    async def scenario() -> tuple[LoadResult, LoadResult]:
        first = await measured(endpoint, build_plan(shared, tiny_model, roles=VLLM.roles))
        second = await measured(endpoint, build_plan(chat, tiny_model, roles=VLLM.roles))
        return first, second

    prefixed, talks = asyncio.run(asyncio.wait_for(scenario(), timeout=400))

    # Shared system prompts: the engine's own counters show most prompt tokens from cache.
    assert all(r.ok for r in prefixed.records) and len(prefixed.records) == 12
    assert {r.prompt_tokens for r in prefixed.records} == {256 + 16}
    eng = prefixed.monitor["engine"]
    assert eng["prompt_cached_share"] > 0.5, eng
    assert eng["prefix_cache_hit_rate"] > 0.5, eng
    assert cache_note(eng).startswith("prefix cache ")

    # Conversations: 2 of 3 turns, in order, each after the previous answer + think time,
    # each resending the history (a longer prompt), which the cache then serves.
    records = talks.records
    assert [r.index for r in records] == list(range(6)) and all(r.ok for r in records)
    for r in records:
        if r.index % 3:
            before = records[r.index - 1]
            assert before.e2e_s is not None and before.prompt_tokens is not None
            assert r.sent_s >= before.sent_s + before.e2e_s + 0.3
            assert r.prompt_tokens is not None
            # the previous prompt, its 8-token answer and 16 new tokens (give or take the
            # answer's re-tokenization)
            assert r.prompt_tokens > before.prompt_tokens + 16
    assert talks.plan["conversation"] == {"turns": 3, "think_time_s": 0.3}
    assert talks.monitor["engine"]["prompt_cached_share"] > 0.3, talks.monitor["engine"]
