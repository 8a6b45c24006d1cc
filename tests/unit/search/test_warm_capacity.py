"""The warm start from the load that matters (issue 28, section 3): sized from the requests in
flight at the incumbent's capacity, and the limit that bounded that capacity (the first miss
above it) choosing among a knob's directions, as the search-space file states them."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotuner.records.trial import CapacityRecord, TrialRecord
from autotuner.search.priors import (
    SearchPlan,
    Situation,
    binding_limit,
    capacity_measured,
    warm_candidates,
)
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import parse_sla
from autotuner.space import ParamValue, load_space

SLA = parse_sla("""
name: unit
model: {synth: tiny-llama}
workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 8}, requests: 4}
constraints: {p99_tpot_ms: 10, p99_ttft_ms: 2000}
""")
SPACE = load_space(
    "vllm", "0.26.0", device="gpu", gpu_count=1, compute_capability=(9, 0),
    allow_lossy=False, overrides={},
)  # fmt: skip
# The H200 defaults' capacity: 17.8 req/s served, 5.06 s after the first token: 90 in flight.
AT_CAPACITY: dict[str, float | None] = {
    "request_rate": 17.8,
    "mean_e2e_ms": 5120.0,
    "mean_ttft_ms": 60.0,
}


def _level(load: float, verdicts: dict[str, str], sustained: bool = True) -> Level:
    met = all(v == "meets" for v in verdicts.values()) and sustained
    margins: dict[str, float | None] = {
        k: (-0.2 if v == "meets" else 0.3) for k, v in verdicts.items()
    }
    return Level(
        load, met, dict(AT_CAPACITY), margins, {}, {}, "level.json",
        verdict="meets" if met else "misses", verdicts=verdicts,  # type: ignore[arg-type]
        served_rate=17.8 if load < 18 else None, sustained=sustained,
    )  # fmt: skip


def _launch(above: dict[str, str], sustained: bool = True) -> TrialResult:
    ok = {"p99_tpot_ms": "meets", "p99_ttft_ms": "meets"}
    levels = (_level(8.0, ok), _level(17.8, ok), _level(18.4, above, sustained))
    cap = CapacityRecord(value=17.8, low=17.8, high=18.4, unit="req/s", stopped_by="resolution")
    return TrialResult({}, "complete", "rate", levels, 1, capacity=cap)


def test_the_first_miss_above_the_capacity_names_the_bounding_limit() -> None:
    assert binding_limit(_launch({"p99_tpot_ms": "misses", "p99_ttft_ms": "meets"}), SLA) == "tpot"
    assert binding_limit(_launch({"p99_tpot_ms": "meets", "p99_ttft_ms": "misses"}), SLA) == "ttft"
    ok = {"p99_tpot_ms": "meets", "p99_ttft_ms": "meets"}
    assert binding_limit(_launch(ok, sustained=False), SLA) == "served_rate"
    open_bracket = TrialResult({}, "complete", "rate", (_level(8.0, ok),), 0)
    assert binding_limit(open_bracket, SLA) is None  # nothing above it missed


def test_sized_from_the_requests_in_flight_at_the_incumbents_capacity() -> None:
    measured, bound = capacity_measured(_launch({"p99_tpot_ms": "misses"}), SLA)
    assert measured["capacity_concurrency"] == pytest.approx(17.8 * 5.06)  # not at 8 req/s
    assert bound == "tpot"


def _warm(measured: dict[str, float], bound: str | None) -> list[dict[str, ParamValue]]:
    s = Situation.of(SLA, "gpu", measured, bound)
    return [c for *_, c in warm_candidates(SPACE, {}, s)]


def test_the_bounding_limit_chooses_each_knobs_direction() -> None:
    flight = {"concurrency": 8 * 5.06, "capacity_concurrency": 17.8 * 5.06}  # 40.5 and 90.1
    tpot = _warm(flight, "tpot")  # cap the batch just above the mean in flight; shorter steps
    assert tpot[:3] == [
        {"max_num_seqs": 113},
        {"max_num_seqs": 144},
        {"max_num_batched_tokens": 4096},
    ]
    assert {"max_num_batched_tokens": 16384} not in tpot
    ttft = _warm(flight, "ttft")  # room to admit waiting requests; longer prefill steps
    assert ttft[:3] == [
        {"max_num_seqs": 180},
        {"max_num_seqs": 270},
        {"max_num_batched_tokens": 16384},
    ]
    assert {"max_num_batched_tokens": 4096} not in ttft
    unknown = _warm(flight, None)  # no limit known: the prior's own factors, both directions
    assert unknown[:2] == [{"max_num_seqs": 180}, {"max_num_seqs": 135}]
    # Never from the SLA's own rate (the 62 and 41 slots of issue 28): below the in flight at
    # the incumbent's capacity whatever bounded it.
    for cands in (tpot, ttft, unknown):
        seqs = [float(c["max_num_seqs"] or 0) for c in cands if "max_num_seqs" in c]
        assert min(seqs) > 90


def test_the_plan_reads_the_incumbents_capacity_from_its_trial_file(tmp_path: Path) -> None:
    study = optuna.create_study(directions=["maximize"])
    result = _launch({"p99_tpot_ms": "misses", "p99_ttft_ms": "meets"})
    result.write(tmp_path / "t0" / "trial.json")
    trial = study.ask()
    TrialRecord(role="baseline", result_file="t0/trial.json", capacity=result.capacity).save(
        trial.set_user_attr
    )
    trial.set_user_attr("constraints", {"p99_tpot_ms": -0.2})
    study.tell(trial, [17.8])
    plan = SearchPlan(SPACE, SLA, tmp_path)
    plan.measured = {"concurrency": 40.5}
    s = plan.situation(study)
    assert s.bound == "tpot"
    assert s.measured["capacity_concurrency"] == pytest.approx(17.8 * 5.06)
    assert s.measured["concurrency"] == 40.5  # the hopeless rules keep the SLA-rate one
    assert any("when the incumbent's capacity ended at tpot/itl" in x for x in plan.describe())
