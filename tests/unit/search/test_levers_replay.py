"""The replay benchmark's long-prompt surface (defaults short on TPOT, max_num_seqs only
trading TPOT for TTFT, nothing lossless meets the SLA) through the real study loop."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "search_efficiency", ROOT / "benchmarks" / "search_efficiency.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_infeasible_losslessly_within_4_launches_without_near_duplicates(
    bench: ModuleType,
) -> None:
    problem = bench.Problem.of(bench.LongPromptSurface(), 0.03)
    assert not any(t.feasible for t in problem.truths.values())  # the surface's premise
    for seed in range(3):
        run = bench.run_ours(problem, "auto", seed, 12, 0.0, new=True)
        assert run.answer == "infeasible", run.stop
        assert run.launches <= 4
        assert run.near_duplicates == 0
        assert "no lossless setting of this engine" in run.stop
        assert "p99 TPOT 15 ms at 5 req/s on this GPU: closest" in run.stop
        assert "Would close it: the lossy tier (search.allow_lossy: true" in run.stop
        assert "more GPUs" in run.stop


def test_the_search_before_spends_its_budget_where_the_new_one_answers(
    bench: ModuleType,
) -> None:
    problem = bench.Problem.of(bench.LongPromptSurface(), 0.03)
    before = [
        bench.run_ours(problem, "auto", seed, 12, 0.0, new=True, levers=False) for seed in range(2)
    ]
    assert all(r.answer == "none" and r.launches == 12 for r in before)


def test_with_noise_only_the_search_before_launches_near_duplicates(bench: ModuleType) -> None:
    """5 % measurement noise (the benchmark's): the warm start sizes max_num_seqs from a
    different launch each time, and the search before launched values 1 apart."""
    problem = bench.Problem.of(bench.LongPromptSurface(), 0.03)
    seeds = range(10)
    before = [bench.run_ours(problem, "auto", s, 12, 0.05, new=True, levers=False) for s in seeds]
    after = [bench.run_ours(problem, "auto", s, 12, 0.05, new=True) for s in seeds]
    assert sum(r.near_duplicates for r in before) > 0
    assert sum(r.near_duplicates for r in after) == 0
    assert all(r.launches <= 12 for r in after)


def test_the_gpu_minute_budget_stops_the_search_and_says_what_more_would_buy(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "DEFAULT_GPU_MINUTES", 5.0)
    problem = bench.Problem.of(bench.LongPromptSurface(), 0.03)
    run = bench.run_ours(problem, "auto", 0, 12, 0.0, new=True)
    assert run.stop.startswith("stopped: GPU-minute budget"), run.stop
    assert "With more (tune.budget_gpu_minutes) it would launch" in run.stop
    assert run.gpu_min <= 5.0
