"""The study loop's bookkeeping with a synthetic response surface instead of engines.

Real launches are covered by tests/integration/test_tune_real.py; here the run function
computes a TrialResult from the params so that every branch is cheap to reach.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.engines import registry
from autotuner.search.study import (
    Budget,
    StudyMismatch,
    StudyRunner,
    fail_stale,
    make_sampler,
    open_study,
    storage_url,
)
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import parse_sla

SLA = """
name: unit
model: {synth: tiny-llama}
workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 2}, requests: 4}
constraints: {p99_ttft_ms: 100}
objectives: [{maximize: goodput}, {minimize: p99_ttft_ms}]
"""
FIXED = {"enforce_eager": True}
IDENTITY = {"engine": "vllm 0.0", "space": "s"}
VLLM = registry.get("vllm")


def surface(params: Mapping[str, Any]) -> TrialResult:
    seqs = int(params.get("max_num_seqs", 16))
    ttft = 200.0 / seqs
    metrics = {"goodput": float(seqs), "p99_ttft_ms": ttft, "request_rate": float(seqs)}
    margin = (ttft - 100.0) / 100.0
    level = Level(2.0, margin <= 0, metrics, {"p99_ttft_ms": margin}, {}, {}, "level-0.json")
    return TrialResult(dict(params), "complete", "rate", (level,), 0 if margin <= 0 else None)


class Harness:
    def __init__(self, tmp: Path, suggest_values: list[int], budget: int) -> None:
        self.sla = parse_sla(SLA)
        self.dir = tmp
        self.url = storage_url(tmp, None)
        self.values = suggest_values
        self.launched: list[dict[str, Any]] = []
        self.crashes: list[tuple[dict[str, Any], str]] = []
        self.fail_on: set[int] = set()
        self.budget = budget

    def study(self) -> optuna.Study:
        return open_study(self.sla, self.url, make_sampler("random", 10, 2, 0), IDENTITY)

    def runner(self, study: optuna.Study) -> StudyRunner:
        def suggest(trial: optuna.Trial) -> dict[str, Any]:
            return {"max_num_seqs": trial.suggest_categorical("max_num_seqs", self.values)}

        def prune(params: dict[str, Any]) -> str | None:
            return "too small to try" if params.get("max_num_seqs") == 1 else None

        def run(params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
            self.launched.append(dict(params))
            trial_dir.mkdir(parents=True, exist_ok=True)
            (trial_dir / "trial.json").write_text("{}")
            if params.get("max_num_seqs") in self.fail_on:
                return TrialResult(
                    dict(params), "failed", "rate", reason="boom", cause="out_of_memory"
                )
            return surface(params)

        return StudyRunner(
            self.sla,
            study,
            self.dir,
            suggest=suggest,
            fixed=FIXED,
            prune=prune,
            run=run,
            budget=Budget(self.budget),
            on_crash=lambda p, c: self.crashes.append((p, c)),
            say=lambda s: None,
        )


def test_baseline_first_then_candidates_with_constraints(tmp_path: Path) -> None:
    h = Harness(tmp_path, [4, 8, 16, 32], budget=4)
    study = h.study()
    h.runner(study).loop()
    trials = study.trials
    assert trials[0].user_attrs["role"] == "baseline"
    assert h.launched[0] == FIXED  # engine defaults: nothing tuned
    assert all(t.user_attrs["role"] == "candidate" for t in trials[1:])
    assert len(h.launched) == 4
    for t in trials:
        if t.state == TrialState.COMPLETE:
            seqs = t.user_attrs["params_full"].get("max_num_seqs", 16)
            assert t.values == [float(seqs), 200.0 / seqs]
            assert set(t.constraints) == {"p99_ttft_ms"}
            assert (t.constraints["p99_ttft_ms"] <= 0) == (seqs >= 2)


def test_repeats_reuse_results_and_pruned_configs_are_not_launched(tmp_path: Path) -> None:
    h = Harness(tmp_path, [1, 4], budget=3)
    study = h.study()
    h.runner(study).loop()
    launched = [p.get("max_num_seqs") for p in h.launched]
    assert launched == [None, 4]  # baseline, then the only launchable new config
    states = [t.state for t in study.trials]
    assert TrialState.PRUNED in states
    dups = [t for t in study.trials if "duplicate_of" in t.user_attrs]
    assert dups and all(t.values == study.trials[t.user_attrs["duplicate_of"]].values for t in dups)
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert all(t.user_attrs["reason"] == "too small to try" for t in pruned)


def test_a_fenced_in_search_stops_and_says_which_skips_fenced_it(tmp_path: Path) -> None:
    h = Harness(tmp_path, [1, 4], budget=100)
    study = h.study()
    runner = h.runner(study)
    said: list[str] = []
    runner.say = said.append
    runner.loop()
    assert [p.get("max_num_seqs") for p in h.launched] == [None, 4]
    stop = said[-1]
    assert stop.startswith("stopping: 40 suggestions in a row"), said
    # Both kinds of skip are named with their counts, which add up to the run of skips.
    parts = [part.split(" ", 1) for part in stop.split("): ")[1].split(", ")]
    counts = {kind: int(n) for n, kind in parts}
    assert set(counts) == {"pruned (too small to try)", "repeats of a measured config"}
    assert sum(counts.values()) == 40


def test_launch_failures_are_failed_trials_and_teach_the_crash_memory(tmp_path: Path) -> None:
    h = Harness(tmp_path, [8, 64], budget=3)
    h.fail_on = {64}
    study = h.study()
    h.runner(study).loop()
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert failed and failed[0].user_attrs["cause"] == "out_of_memory"
    assert h.crashes and h.crashes[0][1] == "out_of_memory"


def test_stale_running_trial_is_failed_and_requeued_then_resume_finishes(tmp_path: Path) -> None:
    h = Harness(tmp_path, [4, 8, 16, 32], budget=3)
    study = h.study()
    runner = h.runner(study)
    runner.step()  # baseline
    # A trial that was running when the tuner died.
    crashed = study.ask({"max_num_seqs": optuna.distributions.CategoricalDistribution(h.values)})
    crashed.set_user_attr("role", "candidate")
    seqs = crashed.params["max_num_seqs"]
    # A new process opens the same study.
    study2 = h.study()
    assert fail_stale(study2, lambda s: None) == [crashed.number]
    h.runner(study2).loop()
    trials = study2.trials
    assert trials[crashed.number].state == TrialState.FAIL
    assert trials[crashed.number].user_attrs["interrupted"] is True
    rerun = [t for t in trials if t.user_attrs.get("requeued_from") == crashed.number]
    assert len(rerun) == 1 and rerun[0].params == {"max_num_seqs": seqs}
    baselines = [t for t in trials if t.user_attrs.get("role") == "baseline"]
    assert len(baselines) == 1  # not repeated
    assert len(h.launched) == 3  # budget counts the interrupted trial out


def test_a_study_is_not_reused_for_another_engine(tmp_path: Path) -> None:
    h = Harness(tmp_path, [4], budget=1)
    h.study()
    sla = parse_sla(SLA)
    with pytest.raises(StudyMismatch, match="engine"):
        open_study(sla, h.url, make_sampler("random", 1, 2, 0), {**IDENTITY, "engine": "vllm 9"})


def test_memory_limit_is_a_hard_constraint_before_launch() -> None:
    from autotuner.core.hardware import CpuInfo, GpuInfo, HardwareProfile
    from autotuner.pipeline.tune import memory_limit_reason

    gpu = GpuInfo(0, "GPU-x", "H200", (9, 0), 150 * 2**30)
    cpu = CpuInfo("x", 2, 2, 2**34, 2**33)
    hw = HardwareProfile("gpu", cpu, (gpu,))
    assert memory_limit_reason({"gpu_memory_utilization": 0.8}, hw, 130, VLLM) is None
    why = memory_limit_reason({}, hw, 130, VLLM)  # vLLM's default 0.92 of 150 GiB + 3 = 141 GiB
    assert why is not None and "141.0 GiB" in why
    tp2 = {"gpu_memory_utilization": 0.5, "tensor_parallel_size": 2}
    assert memory_limit_reason(tp2, hw, 160, VLLM) is None
    # The limit is per GPU: TP=2 at 0.5 takes 78 GiB on each of its GPUs, not 156 together.
    assert memory_limit_reason(tp2, hw, 100, VLLM) is None
    why = memory_limit_reason(tp2, hw, 70, VLLM)
    assert why is not None and "78.0 GiB" in why and "per GPU" in why
    assert memory_limit_reason({}, hw, None, VLLM) is None


def test_the_sla_gives_the_baseline_its_layout(tmp_path: Path) -> None:
    h = Harness(tmp_path, [4, 8], budget=2)
    h.sla = parse_sla(
        SLA + "search: {params: {max_num_seqs: {values: [4, 8]}}, baseline: {max_num_seqs: 8}}\n"
    )
    study = h.study()
    h.runner(study).loop()
    # The engine defaults but for what search.baseline sets; a candidate equal to it reuses it.
    assert h.launched[0] == {**FIXED, "max_num_seqs": 8}
    assert study.trials[0].user_attrs["role"] == "baseline"
    assert 8 not in [p.get("max_num_seqs") for p in h.launched[1:]]
