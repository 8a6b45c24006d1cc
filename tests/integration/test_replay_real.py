"""A timed trace and a dataset replayed on a real vLLM (CPU build) serving the tiny model.

On the suite's shared engine (conftest's ``shared_engine``): two load levels of a Mooncake
trace at two replay speeds (as a capacity search on a trace loads the engine), then a ShareGPT
dataset over the chat API. A second test runs
``autotuner tune`` on the trace: its capacity search runs over the replay speed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.engines import registry
from autotuner.engines.vllm.metrics import METRICS
from autotuner.measure.bench import build_plan
from autotuner.measure.loadgen import LoadPlan, LoadResult, run_load
from autotuner.measure.monitor import Monitor
from autotuner.sla.spec import Sla, load_sla
from autotuner.workload.requests import Arrival
from autotuner.workload.traces import TraceRecord, read_trace

from .conftest import SharedEngine, cpu_sla, run_cli

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "objectives" / "examples"
ROLES = registry.get("vllm").roles


def _sla(tmp_path: Path, name: str, workload: dict[str, Any]) -> Sla:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cpu_sla(name, workload, params={"max_model_len": 1024})))
    return load_sla(path)


def _shared_tokens(records: list[TraceRecord], block: int) -> int:
    """Prompt tokens an earlier request of the same pass already sent: an upper bound on the
    prefix cache's hits (the rest of every prompt is random)."""
    total = 0
    for i, a in enumerate(records):
        best = 0
        for b in records[:i]:
            k = 0
            while k < min(len(a.hash_ids), len(b.hash_ids)) and a.hash_ids[k] == b.hash_ids[k]:
                k += 1
            best = max(best, min(k * block, a.input_tokens, b.input_tokens))
        total += best
    return total


def test_a_trace_and_a_dataset_replayed_on_one_engine(
    shared_engine: SharedEngine, tiny_model: Path, tmp_path: Path
) -> None:
    trace_file = EXAMPLES / "mooncake-trace.jsonl"
    # 30 requests: the 24-record trace wraps once per level (a p90 level needs 29).
    trace_sla = _sla(
        tmp_path,
        "tr",
        {"trace": str(trace_file), "arrival": {"process": "trace"}, "requests": 30},
    )
    data_sla = _sla(
        tmp_path,
        "ds",
        {
            "api": "chat",
            "dataset": str(EXAMPLES / "sharegpt.json"),
            "arrival": {"process": "poisson", "rate": 4.0},
            "requests": 16,
            "seed": 3,
        },
    )
    engine, endpoint = shared_engine.engine, shared_engine.endpoint
    speeds = (0.5, 0.75)

    async def scenario() -> tuple[list[tuple[LoadPlan, LoadResult]], LoadPlan, LoadResult]:
        levels = []
        for level, speed in enumerate(speeds):
            at = Arrival("trace", rate=speed)
            plan = build_plan(trace_sla, tiny_model, at, level, roles=ROLES)
            monitor = Monitor(endpoint.base_url, engine.processes, None, metrics=METRICS)
            result = await run_load(endpoint.base_url, endpoint.model, plan, around=monitor)
            seen = monitor.summary()
            levels.append((plan, LoadResult(result.plan, result.records, 0.0, 0, seen)))
        plan = build_plan(data_sla, tiny_model, roles=ROLES)
        return levels, plan, await run_load(endpoint.base_url, endpoint.model, plan)

    levels, data_plan, data = asyncio.run(scenario())

    trace = read_trace(trace_file)
    n = len(trace.records)
    for speed, (_, result) in zip(speeds, levels, strict=True):
        recs = result.records
        assert len(recs) == 30 and not result.failed, result.errors()
        assert result.plan["replay"]["format"] == "mooncake"
        sent = [trace.records[k % n] for k in range(30)]
        # Exact prompt lengths as the engine counted them, the trace's output lengths.
        assert [r.prompt_tokens for r in recs] == [t.input_tokens for t in sent]
        assert [r.output_tokens for r in recs] == [t.output_tokens for t in sent]
        # Sent at the trace's times divided by the speed (the second pass after its span).
        scheduled = [r.sent_s - r.lag_s for r in recs]
        want = [(k // n * trace.span_s + trace.records[k % n].time_s) / speed for k in range(30)]
        assert scheduled == pytest.approx(want, abs=0.05)
        # Requests naming the same hash ids share those blocks in the engine's prefix cache,
        # and only within their own pass and level: the bound counts nothing across them.
        hits = result.monitor["engine"]["prefix_cache_hits"]
        bound = _shared_tokens(sent[:n], trace.block_tokens) + _shared_tokens(
            sent[n:], trace.block_tokens
        )
        assert 0.3 * bound <= hits <= bound, (speed, hits, bound)

    # The dataset: the conversation longer than the context dropped, every prompt counted by
    # the engine exactly as the tuner counted it through the chat template.
    assert data.plan["replay"]["dropped"] == 1 and data.plan["replay"]["used"] == 12
    assert len(data.records) == 16 and not data.failed, data.errors()
    expected = [data_plan.factory.make(i).input_tokens for i in range(16)]
    assert [r.prompt_tokens for r in data.records] == expected
    assert len(set(expected)) > 5  # different conversations, not one repeated


def test_tune_searches_capacity_on_a_trace_by_replay_speed(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    workload = {
        "trace": str(EXAMPLES / "mooncake-trace.jsonl"),
        "arrival": {"process": "trace", "speed": 0.5},
        "requests": 30,
    }
    sla = tmp_path / "tune-trace.yaml"
    body = cpu_sla(
        "tune-trace", workload, params={"max_model_len": 1024}, tune={"trials": 1, "max_levels": 3}
    )
    sla.write_text(yaml.safe_dump(body))
    trials = tmp_path / "trials"
    r = run_cli(["tune", str(sla), "--trials-dir", str(trials)], cli_env, timeout_s=900)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    record = json.loads((trials / "tune-trace" / "trial-000" / "trial.json").read_text())
    loads = [lv["load"] for lv in record["levels"]]
    # The SLA's own speed first, then x1.5: a capacity search over how fast the trace plays.
    # (Three levels: a busy host can leave the first undecided, and its re-measure at the same
    # speed, pooled with it, must not use up the budget before the climb.)
    assert loads[0] == 0.5 and list(dict.fromkeys(loads))[:2] == [0.5, 0.75], record["levels"]
    assert all(lv["requests"] == 30 * lv.get("runs", 1) for lv in record["levels"])
    assert record["capacity"]["unit"] == "x trace speed"
    assert "x trace speed" in r.stdout
