"""The study loop with more than one trial in flight (a fake executor, no engines)."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner.core.types import ParamValue
from autotuner.engines import registry
from autotuner.search.executors import LocalExecutor, gpus_needed
from autotuner.search.study import Budget, StudyRunner, make_sampler, open_study, storage_url
from autotuner.search.trial import TrialResult

from .test_study import FIXED, IDENTITY, SLA, surface


class TwoSlots:
    """Runs up to two trials "at once": results come back newest first, to check that the
    loop matches each result to its own trial rather than to the order of submission."""

    name = "fake"

    def __init__(self) -> None:
        self.in_flight: list[tuple[int, dict[str, ParamValue], Path]] = []
        self.peak = 0
        self.n = 0

    def capacity(self) -> int:
        return 2

    def submit(self, params: dict[str, ParamValue], trial_dir: Path) -> Hashable:
        self.n += 1
        self.in_flight.append((self.n, params, trial_dir))
        self.peak = max(self.peak, len(self.in_flight))
        return self.n

    def wait_any(self) -> list[tuple[Hashable, TrialResult]]:
        handle, params, trial_dir = self.in_flight.pop()
        trial_dir.mkdir(parents=True, exist_ok=True)
        if params.get("max_num_seqs") == 64:
            return [
                (
                    handle,
                    TrialResult(dict(params), "failed", "rate", reason="lost", cause="worker_lost"),
                )
            ]
        return [(handle, surface(params))]

    def close(self) -> None:
        pass


def _runner(tmp_path: Path, executor: Any, budget: int) -> tuple[StudyRunner, optuna.Study]:
    from autotuner.sla.spec import parse_sla

    sla = parse_sla(SLA)
    study = open_study(sla, storage_url(tmp_path, None), make_sampler("random", 10, 2, 0), IDENTITY)

    def suggest(trial: optuna.Trial) -> dict[str, Any]:
        return {"max_num_seqs": trial.suggest_categorical("max_num_seqs", [2, 4, 8, 16, 32, 64])}

    runner = StudyRunner(
        sla,
        study,
        tmp_path,
        suggest=suggest,
        fixed=FIXED,
        prune=lambda p: None,
        budget=Budget(budget),
        say=lambda s: None,
        executor=executor,
    )
    return runner, study


def test_two_trials_in_flight_each_result_told_to_its_own_trial(tmp_path: Path) -> None:
    ex = TwoSlots()
    runner, study = _runner(tmp_path, ex, budget=6)
    runner.loop()
    assert ex.peak == 2
    settled = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)]
    launched = [t for t in settled if "duplicate_of" not in t.user_attrs]
    assert len(launched) == 6  # the budget, even with two in flight at the end
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    for t in launched:
        seqs = t.user_attrs["params_full"].get("max_num_seqs", 16)
        if t.state == TrialState.COMPLETE:
            assert t.values == [float(seqs), 200.0 / seqs]  # its own config's numbers
        else:
            assert seqs == 64 and t.user_attrs["cause"] == "worker_lost"
    assert [t.user_attrs["role"] for t in study.trials].count("baseline") == 1


def test_local_executor_runs_in_submission_order(tmp_path: Path) -> None:
    seen: list[Path] = []

    def run(params: Any, trial_dir: Path) -> TrialResult:
        seen.append(trial_dir)
        return surface(params)

    ex = LocalExecutor(run)
    a = ex.submit({}, tmp_path / "a")
    b = ex.submit({}, tmp_path / "b")
    assert [h for h, _ in ex.wait_any()] == [a]
    assert [h for h, _ in ex.wait_any()] == [b]
    assert seen == [tmp_path / "a", tmp_path / "b"]


def test_gpus_needed_counts_tensor_and_pipeline_parallelism() -> None:
    roles = registry.get("vllm").roles
    assert gpus_needed({}, roles) == 1
    assert gpus_needed({"tensor_parallel_size": 2}, roles) == 2
    assert gpus_needed({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, roles) == 4
