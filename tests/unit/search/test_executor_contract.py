"""The executor contract (:class:`autotuner.search.executors.Executor`), run against every
executor: the local one, the Ray one (on a local 2-CPU Ray, with stand-in task bodies from
:mod:`autotuner.testing.ray_tasks`) and the multi-slot fake of test_executors.py.

No engine starts: each executor runs a stand-in trial body whose goodput is its
``max_num_seqs``, so a result can be matched to the params it was submitted with.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.engines import registry
from autotuner.search.executors import Executor, LocalExecutor
from autotuner.search.study import Budget, StudyRunner, make_sampler, open_study, storage_url
from autotuner.search.trial import Level, SearchSettings, TrialResult
from autotuner.sla.spec import parse_sla

from .test_executors import TwoSlots
from .test_study import SLA

GOOD = [2, 4, 8, 16, 32]  # max_num_seqs values every stand-in body measures


@dataclass
class Made:
    """An executor under test and how to make one of its trials fail."""

    executor: Executor
    failing: dict[str, Any]  # params whose trial fails
    cause: str  # the cause that failure is reported with
    writes_log: bool  # whether the trial body leaves an engine.log in the trial directory


def local_trial(params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
    """What run_trial does, without an engine: writes its log, reports a failed launch."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "engine.log").write_text(f"local ran {dict(params)}\n")
    seqs = int(params.get("max_num_seqs", 16))
    if seqs == 0:
        return TrialResult(dict(params), "failed", "rate", reason="no memo", cause="out_of_memory")
    metrics: dict[str, float | None] = {"goodput": float(seqs), "p99_ttft_ms": 100.0 / seqs}
    level = Level(1.0, True, metrics, {"p99_ttft_ms": -0.5}, {}, {}, "level-0.json")
    return TrialResult(dict(params), "complete", "rate", (level,), 0)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """One local Ray for the module (starting one takes 20-40 s)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def _make(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Made:
    if kind == "local":
        return Made(LocalExecutor(local_trial), {"max_num_seqs": 0}, "out_of_memory", True)
    if kind == "fake":
        return Made(TwoSlots(), {"max_num_seqs": 64}, "worker_lost", False)
    request.getfixturevalue("ray_cluster")
    from autotuner.search.ray_executor import WORKER_LOST, RayExecutor
    from autotuner.testing.ray_tasks import fake_trial

    ex = RayExecutor(
        parse_sla(SLA),
        adapter=registry.get("vllm"),
        python=Path(sys.executable),
        model_dir=tmp_path / "no-model",
        settings=SearchSettings(),
        cpus_per_trial=1,
        say=lambda s: None,
        task=fake_trial,
    )
    # fake_trial kills its worker process for max_num_seqs 0: a lost worker.
    return Made(ex, {"max_num_seqs": 0}, WORKER_LOST, True)


@pytest.fixture(params=["local", "fake", pytest.param("ray", marks=pytest.mark.slow)])
def made(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Made]:
    m = _make(request.param, request, tmp_path)
    try:
        yield m
    finally:
        m.executor.close()


def run_all(
    ex: Executor, trials: list[tuple[dict[str, Any], Path]]
) -> list[tuple[Hashable, dict[str, Any], TrialResult]]:
    """Submit ``trials`` the way the study loop does (never more than ``capacity()`` in
    flight); returns (handle, submitted params, result) in the order results came back."""
    queue = list(trials)
    in_flight: dict[Hashable, dict[str, Any]] = {}
    handles: list[Hashable] = []  # kept alive: a local handle is a plain object
    out: list[tuple[Hashable, dict[str, Any], TrialResult]] = []
    while queue or in_flight:
        while queue and len(in_flight) < ex.capacity():
            params, trial_dir = queue.pop(0)
            handle = ex.submit(dict(params), trial_dir)
            assert handle not in in_flight and handle not in handles, "handle reused"
            handles.append(handle)
            in_flight[handle] = params
        settled = ex.wait_any()
        assert settled, "wait_any returned without a settled trial"
        for handle, result in settled:
            assert handle in in_flight, "a handle that is not in flight came back"
            out.append((handle, in_flight.pop(handle), result))
    assert len(out) == len(trials)
    return out


def _seqs(params: Mapping[str, Any]) -> int:
    value = params["max_num_seqs"]
    assert isinstance(value, int)
    return value


def test_name_and_capacity(made: Made) -> None:
    assert isinstance(made.executor.name, str) and made.executor.name
    assert made.executor.capacity() >= 1


def test_every_trial_comes_back_once_with_its_own_result(made: Made, tmp_path: Path) -> None:
    # One config submitted twice: two trials, two handles, two results.
    seqs = [*GOOD, GOOD[0]]
    trials = [({"max_num_seqs": s}, tmp_path / f"trial-{i:03d}") for i, s in enumerate(seqs)]
    out = run_all(made.executor, trials)
    assert sorted(_seqs(p) for _, p, _ in out) == sorted(seqs)
    for _, params, result in out:
        assert result.status == "complete"
        assert result.params == params
        assert result.metric("goodput") == float(_seqs(params))
    for params, trial_dir in trials:
        assert trial_dir.is_dir()  # the trial's artifacts land in its own directory
        if made.writes_log:
            assert f"ran {params}" in (trial_dir / "engine.log").read_text()


def test_a_failing_trial_is_a_failed_result_and_the_others_go_on(
    made: Made, tmp_path: Path
) -> None:
    trials = [
        ({"max_num_seqs": 4}, tmp_path / "a"),
        (made.failing, tmp_path / "b"),
        ({"max_num_seqs": 8}, tmp_path / "c"),
    ]
    out = run_all(made.executor, trials)  # raises nothing
    by_seqs = {_seqs(p): r for _, p, r in out}
    failed = by_seqs[_seqs(made.failing)]
    assert failed.status == "failed" and failed.cause == made.cause
    assert failed.params == made.failing and failed.reason
    assert not failed.feasible and failed.metric("goodput") is None
    assert by_seqs[4].status == by_seqs[8].status == "complete"
    # The executor is still usable after a failure.
    again = run_all(made.executor, [({"max_num_seqs": 16}, tmp_path / "d")])
    assert again[0][2].metric("goodput") == 16.0


def test_close_drops_queued_work_and_is_idempotent(made: Made, tmp_path: Path) -> None:
    ex = made.executor
    for i in range(ex.capacity()):
        ex.submit({"max_num_seqs": GOOD[i % len(GOOD)]}, tmp_path / f"t{i}")
    ex.close()
    ex.close()


def test_the_study_loop_runs_on_it(made: Made, tmp_path: Path) -> None:
    """What the study loop needs of an executor, end to end: each launched trial is told
    its own numbers, with as many in flight as the executor allows."""
    sla = parse_sla(SLA)
    study = open_study(sla, storage_url(tmp_path, None), make_sampler("random", 8, 2, 0), {})
    order = iter([4, _seqs(made.failing), 8, 32])

    def suggest(trial: optuna.Trial) -> dict[str, Any]:
        return {"max_num_seqs": next(order)}

    fixed = {"max_num_seqs": 16}  # the baseline's value too: every body can measure it
    crashes: list[tuple[dict[str, Any], str]] = []
    runner = StudyRunner(
        sla,
        study,
        tmp_path,
        suggest=suggest,
        fixed=fixed,
        prune=lambda p: None,
        budget=Budget(5),
        on_crash=lambda p, c: crashes.append((p, c)),
        say=lambda s: None,
        executor=made.executor,
    )
    runner.loop()
    trials = study.get_trials(deepcopy=False)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 4 and len([t for t in trials if t.state == TrialState.FAIL]) == 1
    assert sorted(t.values[0] for t in complete) == [4.0, 8.0, 16.0, 32.0]
    assert crashes == [(made.failing, made.cause)]
