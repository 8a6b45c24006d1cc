"""One launch's load levels without an engine: a fake engine and a fake load generator whose
latencies follow a queueing curve, so that run_trial's capacity search, level sizing,
per-level verdicts, re-measures of undecided levels and records are all exercised in seconds.

The real engine is covered by tests/integration/test_levels_real.py and test_tune_real.py.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest

from autotuner.engines import registry
from autotuner.engines.base import Endpoint
from autotuner.measure.loadgen import LoadPlan, LoadResult, RequestRecord
from autotuner.records.trial import TrialFile
from autotuner.search import trial as trial_mod
from autotuner.search.trial import SearchSettings, TrialResult, run_trial
from autotuner.sla.spec import parse_sla

SATURATION = 10.0  # req/s where the fake engine's queue never drains
BASE_TTFT_MS = 50.0
SIGMA = 0.2  # lognormal spread of one level's latencies


def sla_text(constraints: str, requests: int = 30, tune: str = "") -> str:
    return f"""
name: levels-unit
model: {{synth: tiny-llama}}
workload:
  input_tokens: 8
  output_tokens: 4
  arrival: {{process: poisson, rate: 2}}
  requests: {requests}
constraints: {{{constraints}}}
tune: {{{tune}}}
"""


def ttft_ms(rate: float, i: int, n: int) -> float:
    """Request i of n at ``rate``: a queueing curve times a deterministic lognormal spread
    (the (i + 0.5) / n quantile), so a level's percentiles are exact functions of the rate."""
    queue = BASE_TTFT_MS / max(1e-3, 1 - rate / SATURATION) if rate < SATURATION else 1e6
    z = NormalDist().inv_cdf((i + 0.5) / n)
    return queue * math.exp(SIGMA * z)


@dataclass
class FakeLoad:
    """Stands in for run_load: what each call was asked, and synthetic records."""

    plans: list[LoadPlan] = field(default_factory=list)
    fail_every: int | None = None  # every k-th request fails
    serves: float | None = None  # req/s the engine completes at most: above, a queue grows
    sends: float | None = None  # req/s the client can send at most: above, sends leave late
    slow_calls: frozenset[int] | None = None  # only these calls (1-based) are limited by sends

    async def __call__(self, base_url: str, model: str, plan: LoadPlan, **_: Any) -> LoadResult:
        self.plans.append(plan)
        rate = plan.arrival.rate or float(plan.arrival.concurrency or 1)
        n = plan.requests or 1
        records = []
        for i in range(n):
            if self.fail_every and (i + 1) % self.fail_every == 0:
                records.append(
                    RequestRecord(plan.factory.first_index + i, 0.0, 0.0, 4, error="timeout")
                )
                continue
            t = ttft_ms(rate, i, n) / 1000
            if self.serves is not None:  # one taken up every 1/serves s at most: FIFO
                t = max(t, (i + 1) / self.serves - i / rate)
            limited = self.slow_calls is None or len(self.plans) in self.slow_calls
            sent = i / min(rate, (self.sends if limited else None) or rate)
            records.append(
                RequestRecord(
                    plan.factory.first_index + i,
                    sent,
                    sent - i / rate,
                    4,
                    ttft_s=t,
                    itl_s=(0.01, 0.01, 0.01),
                    e2e_s=t + 0.03,
                    prompt_tokens=8,
                    output_tokens=4,
                )
            )
        return LoadResult(plan.describe(), tuple(records), n / rate)


class FakeMonitor:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        return {"peak_memory_bytes": None, "engine": {}, "engine_gpus": {}}


class FakeEngine:
    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.cuda_devices = None
        self.stopped = False

    def processes(self) -> list[Any]:
        return []

    def argv(self) -> list[str]:
        return ["fake-engine"]

    async def launch(self) -> Endpoint:
        return Endpoint("http://127.0.0.1:9", "m", 1, ("fake-engine",), self.log_path, 1.0)

    async def stop(self) -> None:
        self.stopped = True

    def returncode(self) -> int | None:
        return None  # never exits on its own (a crash is tests/unit/cli/test_engine_faults.py)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeLoad:
    load = FakeLoad()
    monkeypatch.setattr(trial_mod, "run_load", load)
    monkeypatch.setattr(trial_mod, "Monitor", FakeMonitor)
    monkeypatch.setattr(
        trial_mod, "make_engine", lambda sla, py, md, p, log, cuda, engine: FakeEngine(log)
    )
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    return load


def run(
    tmp_path: Path,
    text: str,
    settings: SearchSettings | None = None,
    said: list[str] | None = None,
) -> TrialResult:
    sla = parse_sla(text)
    return run_trial(
        {},
        sla,
        python=Path("python"),
        model_dir=tmp_path / "model",
        run_dir=tmp_path / "run",
        cuda_devices=None,
        adapter=registry.get(sla.engine.kind),
        settings=settings or SearchSettings.of(sla),
        say=said.append if said is not None else lambda s: None,
    )


def true_capacity(limit_ms: float, q: float) -> float:
    """Where the fake engine's q-quantile of TTFT crosses ``limit_ms``."""
    factor = math.exp(SIGMA * NormalDist().inv_cdf(q))
    return SATURATION * (1 - BASE_TTFT_MS * factor / limit_ms)


def test_capacity_is_bracketed_to_the_resolution_with_fresh_prompts_per_level(
    fake: FakeLoad, tmp_path: Path
) -> None:
    result = run(tmp_path, sla_text("p90_ttft_ms: 150, max_error_rate: 0.0", requests=60))
    cap = result.capacity
    assert cap is not None and result.status == "complete" and result.feasible
    # Within the resolution, or the level budget says it stopped the search.
    assert (cap.width is not None and cap.width <= 0.03 + 1e-9) or (
        cap.stopped_by == "budget" and "tune.max_levels" in cap.note
    )
    assert cap.high is not None and cap.low <= cap.value <= cap.high
    # The order-statistic verdicts are conservative: the bracket sits at or below the truth.
    assert cap.low <= true_capacity(150, 0.9) * 1.01
    levels = result.levels
    assert levels[0].load == 2.0 and levels[0].verdict == "meets"
    assert result.best is not None and levels[result.best].load == cap.low
    assert result.max_load == cap.low and result.metric("capacity") == cap.value
    assert all(lv.verdict in ("meets", "misses", "undecided") for lv in levels)
    assert all(lv.feasible == (lv.verdict == "meets") for lv in levels)
    # Every level sent requests the engine had not seen: index ranges never overlap.
    spans = [(p.factory.first_index, p.factory.first_index + (p.requests or 0)) for p in fake.plans]
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start
    assert fake.plans[0].warmup_requests == 0 or spans[0][0] == 0
    # trial.json holds the capacity and each level's verdicts.
    saved = TrialFile.read(tmp_path / "run" / "trial.json")
    assert saved.schema_version == 2 and saved.capacity == cap
    assert saved.levels[0].verdicts == {"p90_ttft_ms": "meets", "max_error_rate": "meets"}
    assert saved.levels[0].requests == 60


def test_levels_grow_to_what_the_percentile_needs(fake: FakeLoad, tmp_path: Path) -> None:
    # p99 at 95 % needs 299 requests: 30 per level could never show it met.
    result = run(tmp_path, sla_text("p99_ttft_ms: 400", requests=30, tune="max_levels: 2"))
    assert [p.requests for p in fake.plans] == [299, 299]
    assert result.levels[0].requests == 299 and result.levels[0].verdict == "meets"


def test_too_few_requests_leave_the_level_undecided_and_say_so(
    fake: FakeLoad, tmp_path: Path
) -> None:
    # The cap keeps levels at 100 requests: the p99's upper bound does not exist, every level
    # is undecided, is measured once more (pooled: 200 requests, still short of 299) and then
    # counts as a miss: the config is not shown to meet the SLA, and the reason says why.
    text = sla_text("p99_ttft_ms: 400", requests=30, tune="max_requests_per_level: 100")
    result = run(tmp_path, text)
    assert result.status == "stopped_early" and not result.feasible
    assert [(lv.load, lv.verdict, lv.runs, lv.requests) for lv in result.levels] == [
        (2.0, "undecided", 1, 100),
        (2.0, "undecided", 2, 200),
    ]
    assert result.capacity is not None and result.capacity.stopped_by == "undecided"
    assert result.reason is not None and "could not tell whether it meets the SLA" in result.reason
    assert "p99_ttft_ms undecided after 200 requests" in result.reason
    assert result.metric("capacity") == 0.0
    # The re-measure sent fresh requests, and its level file holds both runs.
    assert fake.plans[1].factory.first_index == 100
    pooled = json.loads((tmp_path / "run" / "level-1.json").read_text())
    assert len(pooled["records"]) == 200


def test_a_miss_that_less_load_does_not_shrink_stops_one_level_below(
    fake: FakeLoad, tmp_path: Path
) -> None:
    fake.fail_every = 3  # a third of the requests fail at any rate: the limit 0 misses
    result = run(tmp_path, sla_text("p90_ttft_ms: 1000, max_error_rate: 0.0", requests=30))
    assert [lv.load for lv in result.levels] == pytest.approx([2.0, 2.0 / 1.5])
    assert result.status == "stopped_early" and not result.feasible
    assert all(lv.verdicts["max_error_rate"] == "misses" for lv in result.levels)
    assert result.reason is not None
    assert result.reason.startswith("misses the SLA at poisson 2 req/s (max_error_rate); ")
    cap = result.capacity
    assert cap is not None and cap.stopped_by == "infeasible_at_start" and cap.value == 0
    assert cap.sustainable is not None and cap.sustainable.not_by_load
    assert cap.sustainable.value == 0 and "does not shrink with the load" in result.reason


# p90 TTFT limit at which the fake engine holds only ~1.4 req/s against the SLA's 2.
SHORT_LIMIT_MS = 75.0


def test_a_launch_that_misses_its_own_load_on_latency_measures_how_far_below_it_holds(
    fake: FakeLoad, tmp_path: Path
) -> None:
    said: list[str] = []
    text = sla_text(f"p90_ttft_ms: {SHORT_LIMIT_MS:g}", requests=300)
    result = run(tmp_path, text, said=said)
    cap = result.capacity
    assert cap is not None and cap.value == 0 and cap.stopped_by == "infeasible_at_start"
    assert result.best is None and not result.feasible and result.status == "stopped_early"
    assert result.metric("capacity") == 0.0
    held = cap.sustainable
    assert held is not None and held.target == 2.0 and held.unit == "req/s"
    below = result.levels[1:]
    assert 1 <= len(below) <= 3 and held.levels == len(below)
    assert all(lv.load < 2.0 for lv in below)
    # Claims only a level that met every limit, at or below the truth.
    assert any(lv.verdict == "meets" and lv.load == held.value for lv in below)
    assert 0 < held.value <= true_capacity(SHORT_LIMIT_MS, 0.9) * 1.01
    assert held.high is not None and held.value < held.high <= 2.0
    assert result.reason is not None and held.describe() in result.reason
    assert held.describe().startswith("holds the SLA's limits up to ")
    assert any("measuring below it" in line for line in said)
    # trial.json keeps it, and reads back the same.
    saved = TrialFile.read(tmp_path / "run" / "trial.json")
    assert saved.capacity == cap and saved.capacity.sustainable == held
    assert TrialResult.read(tmp_path / "run" / "trial.json").capacity == cap


def test_the_search_below_stays_within_the_level_budget(fake: FakeLoad, tmp_path: Path) -> None:
    text = sla_text(f"p90_ttft_ms: {SHORT_LIMIT_MS:g}", requests=60, tune="max_levels: 2")
    result = run(tmp_path, text)
    assert len(result.levels) == 2
    cap = result.capacity
    assert cap is not None and cap.sustainable is not None and cap.sustainable.levels == 1
    assert len(run(tmp_path, sla_text("p90_ttft_ms: 75", tune="max_levels: 1")).levels) == 1


class MemoryMonitor(FakeMonitor):
    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "peak_memory_bytes": 5 * 2**30}


@pytest.mark.parametrize(
    "constraints", [f"p90_ttft_ms: {SHORT_LIMIT_MS:g}, max_gpu_memory_gib: 4", "min_goodput: 3"]
)
def test_a_miss_less_load_cannot_fix_does_not_go_below(
    fake: FakeLoad, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, constraints: str
) -> None:
    monkeypatch.setattr(trial_mod, "Monitor", MemoryMonitor)
    result = run(tmp_path, sla_text(constraints, requests=60))
    assert len(result.levels) == 1
    assert result.capacity is not None and result.capacity.sustainable is None


def test_a_raced_candidate_that_misses_does_not_go_below(fake: FakeLoad, tmp_path: Path) -> None:
    text = sla_text(f"p90_ttft_ms: {SHORT_LIMIT_MS:g}", requests=60)
    result = run(tmp_path, text, SearchSettings(start_load=3.0))
    assert [lv.load for lv in result.levels] == [3.0]
    assert result.capacity is not None and result.capacity.sustainable is None


def test_the_level_budget_that_stopped_the_search_is_named(fake: FakeLoad, tmp_path: Path) -> None:
    result = run(tmp_path, sla_text("p90_ttft_ms: 150", requests=60, tune="max_levels: 3"))
    cap = result.capacity
    assert cap is not None and cap.stopped_by == "budget" and len(result.levels) == 3
    assert "tune.max_levels = 3" in cap.note


def test_a_confirmation_replicate_searches_around_its_claim_not_below_the_sla_load(
    fake: FakeLoad, tmp_path: Path
) -> None:
    text = sla_text("p90_ttft_ms: 150", requests=60)
    claim = 4.0
    result = run(tmp_path, text, SearchSettings(max_levels=4, around=claim))
    loads = [lv.load for lv in result.levels]
    assert loads[0] == pytest.approx(claim / 1.03)
    assert all(load >= 2.0 for load in loads)  # never below the SLA's own rate
    # A claim below the SLA's own load starts at it, not under it.
    fake.plans.clear()
    low = run(tmp_path, text, SearchSettings(max_levels=2, around=1.0))
    assert low.levels[0].load >= 2.0


def test_a_closed_loop_workload_searches_whole_concurrencies(
    fake: FakeLoad, tmp_path: Path
) -> None:
    text = sla_text("p90_ttft_ms: 150", requests=60).replace(
        "{process: poisson, rate: 2}", "{process: concurrency, concurrency: 2}"
    )
    result = run(tmp_path, text)
    cap = result.capacity
    assert cap is not None and cap.unit == "concurrent requests"
    assert all(float(lv.load).is_integer() for lv in result.levels)
    assert [p.arrival.concurrency for p in fake.plans][:3] == [2, 3, 5]
    # Whole requests: the search ends when no concurrency lies strictly inside the bracket.
    assert (cap.high is not None and cap.high - cap.low <= 1) or cap.stopped_by == "budget"


def test_a_level_the_engine_did_not_keep_up_with_misses_and_says_so(
    fake: FakeLoad, tmp_path: Path
) -> None:
    # The engine takes up 3 req/s at most; its TTFT grows over a level above that, but stays
    # inside a loose limit: only the served rate shows that it fell behind.
    fake.serves = 3.0
    said: list[str] = []
    text = sla_text("p90_ttft_ms: 10000", requests=30, tune="max_levels: 3")
    result = run(tmp_path, text, said=said)
    first, second = result.levels[:2]
    assert (first.load, first.verdict, first.sustained) == (2.0, "meets", True)
    assert (second.load, second.verdict, second.sustained) == (3.0, "meets", True)
    third = result.levels[2]
    assert third.load == 4.5 and third.verdicts == {"p90_ttft_ms": "meets"}
    assert third.verdict == "misses" and third.sustained is False
    assert third.sent_rate == pytest.approx(4.5)
    assert third.served_rate is not None and third.served_rate == pytest.approx(3.0, rel=0.05)
    note = third.sustain_note()
    assert note == f"not sustained: served {third.served_rate:.3g} of 4.5 req/s sent"
    assert any(line.startswith("    level 3:") and f"misses SLA ({note})" in line for line in said)
    cap = result.capacity
    assert cap is not None and cap.low == 3.0 and cap.high == 4.5
    # The record keeps the rates; one written before them still loads.
    saved = json.loads((tmp_path / "run" / "trial.json").read_text())
    assert saved["levels"][2]["sustained"] is False
    for level in saved["levels"]:
        for key in ("sent_rate", "served_rate", "sustained"):
            del level[key]
    old = TrialResult.from_dict(saved)
    assert [lv.sustained for lv in old.levels] == [None] * 3
    assert old.levels[2].sustain_note() is None


def test_a_level_the_load_generator_fell_behind_on_is_undecided_and_measured_afresh(
    fake: FakeLoad, tmp_path: Path
) -> None:
    # The client sends 4 req/s at most: the level at 4.5 req/s leaves late (every request
    # after the first), where the engine itself would have met the SLA.
    fake.sends = 4.0
    said: list[str] = []
    text = sla_text("p90_ttft_ms: 10000", requests=30, tune="max_levels: 5")
    result = run(tmp_path, text, said=said)
    loads = [lv.load for lv in result.levels]
    assert loads[:4] == [2.0, 3.0, 4.5, 4.5]
    assert [lv.generator_behind for lv in result.levels[:2]] == [False, False]
    third, again = result.levels[2:4]
    assert third.verdicts == {"p90_ttft_ms": "meets"} and third.verdict == "undecided"
    assert third.generator_behind and third.rate_kept == pytest.approx(4.0 / 4.5)
    note = third.pacing_note()
    assert note is not None and note.startswith("load generator behind: sent at 89% ")
    assert any(line.startswith("    level 3:") and f"undecided ({note})" in line for line in said)
    # Measured once more on fresh requests, not pooled with the late run (a stall can pass);
    # behind again, it bounds the capacity and the next level refines below it.
    assert (again.runs, again.requests, again.verdict) == (1, 30, "undecided")
    assert 3.0 < loads[4] < 4.5
    cap = result.capacity
    assert cap is not None and cap.high is not None and cap.high <= 4.5
    saved = json.loads((tmp_path / "run" / "trial.json").read_text())
    assert saved["levels"][2]["generator_behind"] is True
    assert TrialResult.from_dict(saved).levels[2].pacing_note() == note


def test_a_level_measured_again_after_a_stall_counts_when_the_client_kept_up(
    fake: FakeLoad, tmp_path: Path
) -> None:
    # The client stalls once, at the third level: its re-measure keeps the schedule and meets.
    fake.sends, fake.slow_calls = 4.0, frozenset({3})
    result = run(tmp_path, sla_text("p90_ttft_ms: 10000", requests=30, tune="max_levels: 4"))
    third, again = result.levels[2:4]
    assert (third.load, third.verdict, third.generator_behind) == (4.5, "undecided", True)
    assert (again.load, again.verdict, again.generator_behind) == (4.5, "meets", False)
    assert again.runs == 1 and again.requests == 30
    cap = result.capacity
    assert cap is not None and cap.low == 4.5
