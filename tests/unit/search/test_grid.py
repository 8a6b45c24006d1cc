"""The grid sampler (``tune.sampler: grid``) in the study loop, with a fake run function."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.bundle.summary import render
from autotuner.engines import registry
from autotuner.pipeline.tune import grid_space
from autotuner.search.study import (
    Budget,
    StudyRunner,
    default_budget,
    fail_stale,
    grid_budget,
    make_sampler,
    open_study,
    release_own,
    storage_url,
)
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import SlaError, parse_sla
from autotuner.space import ParamOverride, SearchSpace, load_space

SLA = """
name: grid-unit
model: {synth: tiny-llama}
workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 2}, requests: 4}
constraints: {p99_ttft_ms: 100}
objectives: [{maximize: goodput}, {minimize: p99_ttft_ms}]
search:
  params:
    max_num_seqs: {values: [8, 16, 32]}
    max_num_batched_tokens: {values: [256, 512, 1024]}
tune:
  sampler: grid
"""
GRID = {"max_num_seqs": [8, 16, 32], "max_num_batched_tokens": [256, 512, 1024]}
FIXED = {"enforce_eager": True}
EXTRA = {"gpu_memory_utilization": 0.9}  # a one-value grid dimension
IDENTITY = {"engine": "vllm 0.0", "space": "s"}


def result(params: Mapping[str, Any]) -> TrialResult:
    seqs = int(params.get("max_num_seqs", 16))
    metrics = {"goodput": float(seqs), "p99_ttft_ms": 50.0, "request_rate": float(seqs)}
    level = Level(2.0, True, metrics, {"p99_ttft_ms": -0.5}, {}, {}, "level-0.json")
    return TrialResult(dict(params), "complete", "rate", (level,), 0)


class Grid:
    def __init__(self, tmp: Path) -> None:
        self.sla = parse_sla(SLA)
        self.dir = tmp
        self.url = storage_url(tmp, None)
        self.launched: list[dict[str, Any]] = []
        self.interrupt_at: int | None = None  # Ctrl-C during the launch after this many

    def study(self, budget: int) -> optuna.Study:
        sampler = make_sampler("grid", budget, 2, 0, GRID)
        return open_study(self.sla, self.url, sampler, IDENTITY)

    def runner(self, study: optuna.Study, budget: int, slots: int = 1) -> StudyRunner:
        def suggest(trial: optuna.Trial) -> dict[str, Any]:
            values = {k: trial.suggest_categorical(k, v) for k, v in GRID.items()}
            return {**values, **EXTRA}

        def run(params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
            if len(self.launched) == self.interrupt_at:
                raise KeyboardInterrupt
            self.launched.append(dict(params))
            trial_dir.mkdir(parents=True, exist_ok=True)
            (trial_dir / "trial.json").write_text("{}")
            return result(params)

        return StudyRunner(
            self.sla,
            study,
            self.dir,
            suggest=suggest,
            fixed=FIXED,
            prune=lambda p: None,
            run=None if slots > 1 else run,
            executor=Slots(run, slots) if slots > 1 else None,
            budget=Budget(budget),
            say=lambda s: None,
        )

    def points(self) -> list[tuple[int, int]]:
        return [
            (p["max_num_seqs"], p["max_num_batched_tokens"])
            for p in self.launched
            if "max_num_seqs" in p
        ]


class Slots:
    """Several trials in flight; the newest settles first."""

    name = "fake"

    def __init__(self, run: Any, n: int) -> None:
        self.run = run
        self.n = n
        self.queue: list[tuple[int, dict[str, Any], Path]] = []
        self.submitted = 0
        self.peak = 0

    def capacity(self) -> int:
        return self.n

    def submit(self, params: dict[str, Any], trial_dir: Path) -> Hashable:
        self.submitted += 1
        self.queue.append((self.submitted, params, trial_dir))
        self.peak = max(self.peak, len(self.queue))
        return self.submitted

    def wait_any(self) -> list[tuple[Hashable, TrialResult]]:
        handle, params, trial_dir = self.queue.pop()
        return [(handle, self.run(params, trial_dir))]

    def close(self) -> None:
        pass


ALL_POINTS = sorted(itertools.product(GRID["max_num_seqs"], GRID["max_num_batched_tokens"]))


def test_budget_defaults_to_the_whole_grid() -> None:
    sla = parse_sla(SLA)
    assert grid_budget(GRID) == 10  # 9 points + the baseline
    assert default_budget(sla, GRID) == 10
    assert default_budget(parse_sla(SLA + "  trials: 4\n"), GRID) == 4
    assert default_budget(parse_sla(SLA.replace("sampler: grid", "sampler: tpe")), None) == 12


def test_a_3x3_grid_visits_every_point_once_after_the_baseline(tmp_path: Path) -> None:
    g = Grid(tmp_path)
    budget = default_budget(g.sla, GRID)
    study = g.study(budget)
    runner = g.runner(study, budget)
    runner.loop()
    assert g.launched[0] == FIXED  # the baseline: engine defaults, no grid dimension
    assert study.trials[0].user_attrs["role"] == "baseline"
    assert "grid_id" not in study.trials[0].system_attrs  # it used up no grid point
    assert sorted(g.points()) == ALL_POINTS  # all 9, none twice
    assert all(p["gpu_memory_utilization"] == 0.9 for p in g.launched[1:])
    assert runner.spent() == 10 and len(study.trials) == 10
    assert all(t.state == TrialState.COMPLETE for t in study.trials)


def test_an_exhausted_grid_stops_the_loop_before_a_larger_budget(tmp_path: Path) -> None:
    g = Grid(tmp_path)
    study = g.study(50)
    g.runner(study, 50).loop()
    assert sorted(g.points()) == ALL_POINTS
    assert len(study.trials) == 10  # no repeats asked for once the grid was done


def test_trials_in_flight_take_distinct_points(tmp_path: Path) -> None:
    g = Grid(tmp_path)
    study = g.study(50)
    runner = g.runner(study, 50, slots=4)
    runner.loop()
    assert isinstance(runner.executor, Slots) and runner.executor.peak == 4
    assert sorted(g.points()) == ALL_POINTS  # none launched twice while another ran
    assert len(study.trials) == 10


def test_a_resumed_grid_repeats_nothing(tmp_path: Path) -> None:
    g = Grid(tmp_path)
    g.runner(g.study(10), 4).loop()  # the first session: baseline + 3 points
    study = g.study(10)
    # A point that was running when the first session was stopped.
    stale = study.ask()
    stale.set_user_attr("role", "candidate")
    seqs = stale.suggest_categorical("max_num_seqs", GRID["max_num_seqs"])
    tokens = stale.suggest_categorical("max_num_batched_tokens", GRID["max_num_batched_tokens"])
    assert (seqs, tokens) not in g.points()
    study = g.study(10)  # the next session
    assert fail_stale(study, lambda s: None) == [stale.number]
    g.runner(study, 10).loop()
    assert sorted(g.points()) == ALL_POINTS  # the interrupted point ran again, nothing twice
    assert sum("max_num_seqs" not in p for p in g.launched) == 1  # one baseline


def test_an_interrupted_point_is_measured_when_resumed_on_another_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = Grid(tmp_path)
    g.interrupt_at = 3  # the baseline and 2 points measured
    with pytest.raises(KeyboardInterrupt):
        g.runner(g.study(10), 10).loop()
    g.interrupt_at = None
    study = g.study(10)
    [cut] = [t.number for t in study.trials if t.state == TrialState.RUNNING]
    said: list[str] = []
    assert release_own(study, said.append) == [cut]
    assert said == [f"trial {cut} was interrupted: failed, and its config queued again"]
    report = render(study, g.dir, registry.get("vllm").roles)
    assert f"trial {cut}'s config, queued again" in report  # not "engine defaults"
    # The next session runs on a machine whose host name differs: nothing is left RUNNING
    # for it to guess about, and the interrupted point is measured.
    monkeypatch.setattr("autotuner.search.lock.socket.gethostname", lambda: "another-host")
    study = g.study(10)
    assert fail_stale(study, lambda s: None) == []
    g.runner(study, 10).loop()
    assert sorted(g.points()) == ALL_POINTS  # each point once, the interrupted one included
    assert not any(t.state == TrialState.RUNNING for t in study.trials)


def test_an_interrupted_baseline_runs_again_first_and_is_not_queued(tmp_path: Path) -> None:
    g = Grid(tmp_path)
    g.interrupt_at = 0  # Ctrl-C during the very first launch, the engine defaults
    with pytest.raises(KeyboardInterrupt):
        g.runner(g.study(10), 10).loop()
    g.interrupt_at = None
    study = g.study(10)
    said: list[str] = []
    assert release_own(study, said.append) == [0]
    assert said == ["trial 0 was interrupted: failed; the baseline runs again"]
    assert not any(t.state == TrialState.WAITING for t in study.trials)
    g.runner(study, 10).loop()
    assert sorted(g.points()) == ALL_POINTS
    assert sum("max_num_seqs" not in p for p in g.launched) == 1  # the baseline, once


def test_grid_needs_values() -> None:
    text = SLA.replace("{values: [8, 16, 32]}", "{low: 8}").replace(
        "max_num_batched_tokens: {values: [256, 512, 1024]}", "max_num_batched_tokens: true"
    )
    with pytest.raises(SlaError, match=r"tune\.sampler: the grid sampler .* 'values'"):
        parse_sla(text)
    with pytest.raises(ValueError, match="explicit values"):
        make_sampler("grid", 10, 2, 0, {})


def test_grid_space_tunes_only_the_listed_params() -> None:
    overrides = {
        "max_num_seqs": ParamOverride(values=[64, 128]),
        "max_num_batched_tokens": ParamOverride(values=[2048, 8192]),
        "gpu_memory_utilization": ParamOverride(values=[0.9]),
    }

    def load(ov: Mapping[str, ParamOverride]) -> SearchSpace:
        return load_space(
            "vllm",
            "0.26.0",
            device="gpu",
            gpu_count=1,
            compute_capability=(9, 0),
            allow_lossy=False,
            overrides=ov,
            engine_params={"load_format": "dummy"},
        )

    space, grid, single = grid_space(load(overrides), overrides, load)
    assert grid == {"max_num_seqs": [64, 128], "max_num_batched_tokens": [2048, 8192]}
    assert space.names == ["max_num_seqs", "max_num_batched_tokens"]
    assert single == {"gpu_memory_utilization": 0.9}
    assert space.fixed == {"load_format": "dummy"}  # the baseline stays the engine defaults
