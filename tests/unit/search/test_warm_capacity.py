"""The warm start from the load that matters (issue 28, section 3): sized from the requests in
flight at the incumbent's capacity, and the limit that bounded that capacity (the first miss
above it) choosing among a knob's directions, as the search-space file states them."""

from __future__ import annotations

import dataclasses
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
from autotuner.space import ParamOverride, ParamValue, load_space

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


# The engine defaults missed the SLA at its own load, 8 req/s, with 40 requests in flight
# (8 req/s served, 5 s after the first token): no config has a capacity yet.
AT_OWN_LOAD: dict[str, float | None] = {
    "request_rate": 8.0,
    "mean_e2e_ms": 5060.0,
    "mean_ttft_ms": 60.0,
}


def _missed_at_own_load(verdicts: dict[str, str]) -> TrialResult:
    margins: dict[str, float | None] = {
        k: (-0.2 if v == "meets" else 0.3) for k, v in verdicts.items()
    }
    level = Level(
        8.0, False, dict(AT_OWN_LOAD), margins, {}, {}, "level-0.json",
        verdict="misses", verdicts=verdicts, served_rate=8.0, sustained=True,  # type: ignore[arg-type]
    )  # fmt: skip
    cap = CapacityRecord(
        value=0.0, low=0.0, high=8.0, unit="req/s", stopped_by="infeasible_at_start"
    )
    return TrialResult({}, "stopped_early", "rate", (level,), None, "misses", capacity=cap)


def _study_of_a_missed_baseline(tmp_path: Path, result: TrialResult) -> optuna.Study:
    study = optuna.create_study(directions=["maximize"])
    result.write(tmp_path / "trial-000" / "trial.json")
    trial = study.ask()
    TrialRecord(role="baseline", result_file="trial-000/trial.json", capacity=result.capacity).save(
        trial.set_user_attr
    )
    for key, margin in result.margins().items():  # as tell_result sets them
        trial.set_constraint(key, 1.0 if margin is None else margin)
    study.tell(trial, [0.0])
    return study


def test_a_launch_that_met_the_sla_nowhere_is_bounded_by_what_it_missed_at_its_own_load() -> None:
    tpot = _missed_at_own_load({"p99_tpot_ms": "misses", "p99_ttft_ms": "meets"})
    assert binding_limit(tpot, SLA) == "tpot"
    measured, bound = capacity_measured(tpot, SLA)
    assert measured["capacity_concurrency"] == pytest.approx(40.0)  # at the SLA's own load
    assert bound == "tpot"
    ttft = _missed_at_own_load({"p99_tpot_ms": "meets", "p99_ttft_ms": "misses"})
    assert capacity_measured(ttft, SLA) == ({"capacity_concurrency": pytest.approx(40.0)}, "ttft")
    failed = TrialResult({}, "failed", "rate", reason="CUDA out of memory", cause="out_of_memory")
    assert capacity_measured(failed, SLA) == ({}, None)


def test_before_any_config_met_the_sla_the_closest_launch_sizes_the_warm_start(
    tmp_path: Path,
) -> None:
    """The defaults missed the TPOT limit at the SLA's own load (a decode batch too large):
    the warm start caps max_num_seqs just above the 40 requests in flight there, instead of
    the prior's blind first values (256, 512), which only an unmeasured study should try."""
    missed = _missed_at_own_load({"p99_tpot_ms": "misses", "p99_ttft_ms": "meets"})
    study = _study_of_a_missed_baseline(tmp_path, missed)
    plan = SearchPlan(SPACE, SLA, tmp_path)
    plan.measured = {"concurrency": 40.0}
    s = plan.situation(study)
    assert s.bound == "tpot"
    assert s.measured["capacity_concurrency"] == pytest.approx(40.0)
    assert plan.next_warm(study, {}) == {"max_num_seqs": 50}  # 1.25 x 40
    seqs = [c["max_num_seqs"] for *_, c in warm_candidates(SPACE, {}, s) if "max_num_seqs" in c]
    assert seqs == [50, 64]
    assert 256 not in seqs and 512 not in seqs


def test_before_any_launch_was_measured_the_prior_tries_its_first_values(tmp_path: Path) -> None:
    study = optuna.create_study(directions=["maximize"])
    plan = SearchPlan(SPACE, SLA, tmp_path)
    plan.measured = {}
    s = plan.situation(study)
    assert s.bound is None and "capacity_concurrency" not in s.measured
    seqs = [c["max_num_seqs"] for *_, c in warm_candidates(SPACE, {}, s) if "max_num_seqs" in c]
    assert seqs == [256, 512]


def test_on_a_coarse_list_the_warm_start_keeps_the_factors_headroom() -> None:
    """max_num_seqs narrowed to a grid (an SLA's ``search: {max_num_seqs: {values: [...]}}``,
    vLLM auto_tune style): 30 requests in flight at a capacity that ended at TPOT. 1.25 x 30
    is 38, nearest 32 on a log scale: 1.07 x the mean in flight, a cap the bursts fill at once
    (requests queue past the TTFT limit). The warm start tries 64, the nearest with the
    headroom, once."""
    grid = [32, 64, 128, 256, 512, 1024]
    space = load_space(
        "vllm", "0.26.0", device="gpu", gpu_count=1, compute_capability=(9, 0),
        allow_lossy=False,
        overrides={"max_num_seqs": ParamOverride(values=grid)},
    )  # fmt: skip
    flight = {"concurrency": 28.0, "capacity_concurrency": 30.0}

    def seqs(bound: str | None) -> list[ParamValue]:
        s = Situation.of(SLA, "gpu", flight, bound)
        return [c["max_num_seqs"] for *_, c in warm_candidates(space, {}, s) if "max_num_seqs" in c]

    assert seqs("tpot") == [64]  # 38 and 48, with at least 1.25 x 30 = 37.5: not 32
    assert seqs("ttft") == [64]  # 60 and 90 (x2, x3): both nearest 64, at or above 60
    assert seqs(None) == [64]  # 60 and 45 (x2, x1.5), at least 45
    # The floor leaves an unlisted range alone: the values are rounded, never raised.
    assert _warm({"capacity_concurrency": 30.0}, "tpot")[:2] == [
        {"max_num_seqs": 38},
        {"max_num_seqs": 48},
    ]


def test_a_miss_of_memory_alone_sizes_nothing(tmp_path: Path) -> None:
    """The H200 grid's defaults: 130.45 GiB against a 130 GiB limit, every latency met at
    15 req/s with 34 requests in flight. Memory does not move with the load, so their capacity
    is unknown, not below 15 req/s: the requests in flight there size nothing (x2, x1.5 would
    be 69 and 52 slots where the configs that fit served 28 req/s with up to 256), and the
    prior's first values are tried."""
    sla = parse_sla("""
name: unit
model: {synth: tiny-llama}
workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 15}, requests: 4}
constraints: {p99_tpot_ms: 20, p99_ttft_ms: 300, max_gpu_memory_gib: 130}
""")
    verdicts = {"p99_tpot_ms": "meets", "p99_ttft_ms": "meets", "max_gpu_memory_gib": "misses"}
    margins: dict[str, float | None] = {
        "p99_tpot_ms": -0.44, "p99_ttft_ms": -0.6, "max_gpu_memory_gib": 0.003,
    }  # fmt: skip
    metrics: dict[str, float | None] = {
        "request_rate": 13.8, "mean_e2e_ms": 2556.2, "mean_ttft_ms": 66.4,
        "peak_memory_gib": 130.45,
    }  # fmt: skip
    level = Level(
        15.0, False, metrics, margins, {}, {}, "level-0.json",
        verdict="misses", verdicts=verdicts,  # type: ignore[arg-type]
    )  # fmt: skip
    cap = CapacityRecord(
        value=0.0, low=0.0, high=15.0, unit="req/s", stopped_by="infeasible_at_start"
    )
    result = TrialResult({}, "stopped_early", "rate", (level,), None, "misses", capacity=cap)
    assert capacity_measured(result, sla) == ({}, "memory")
    older = dataclasses.replace(level, verdicts={})  # a record without verdicts: its margins
    assert capacity_measured(dataclasses.replace(result, levels=(older,)), sla) == ({}, None)
    study = _study_of_a_missed_baseline(tmp_path, result)
    plan = SearchPlan(SPACE, sla, tmp_path)
    plan.measured = {"concurrency": 34.4}
    s = plan.situation(study)
    assert s.bound == "memory" and "capacity_concurrency" not in s.measured
    assert plan.next_warm(study, {}) == {"max_num_seqs": 256}
