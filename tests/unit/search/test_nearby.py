"""Where the sampler may look after the warm start (search/nearby.py, issue 16).

Steps between values on each kind of parameter of ``search_spaces/vllm.yaml``; a switched-off
parameter not counting; and the study loop: a sampled candidate far from every launch that
met the SLA is pruned with its distance as the reason, while the warm start and the launches
near a feasible one go ahead, and nothing is out of reach before some launch met the SLA.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.search.misses import MissBook
from autotuner.search.nearby import distance, into_reach, steps
from autotuner.search.priors import SearchPlan
from autotuner.search.study import (
    MOVE_AFTER,
    Budget,
    StudyRunner,
    make_sampler,
    open_study,
    storage_url,
)
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import parse_sla
from autotuner.space import ParamOverride, SearchSpace, load_space

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

H200 = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.92}


def gpu(path: Path | None = None) -> SearchSpace:
    return load_space(
        "vllm",
        "0.26.0",
        device="gpu",
        gpu_count=1,
        compute_capability=(9, 0),
        allow_lossy=False,
        overrides={} if path else {"performance_mode": ParamOverride(exclude=True)},
        path=path,
    )


def test_steps_on_each_kind_of_parameter() -> None:
    space = gpu()
    seqs = space.param("max_num_seqs")  # a log range: a step per factor of two
    assert steps(seqs, 64, 256) == pytest.approx(2.0)
    assert steps(seqs, 256, 256) == 0.0
    gmu = space.param("gpu_memory_utilization")  # linear 0.80-0.96: a step per 0.04
    assert steps(gmu, 0.92, 0.96) == pytest.approx(1.0)
    block = space.param("block_size")  # choices 16, 32, 64, 128
    assert steps(block, 16, 64) == 2.0
    chunked = space.param("enable_chunked_prefill")
    assert steps(chunked, True, False) == 1.0
    assert steps(chunked, None, True) == 1.0  # left to the engine: not known to be the same
    assert steps(chunked, None, None) == 0.0


def test_a_switched_off_parameter_does_not_count() -> None:
    space = gpu()
    book = MissBook(space, engine_defaults=lambda params: H200)
    on = book.effective({"enable_chunked_prefill": True, "max_num_batched_tokens": 16384})
    off = book.effective({"enable_chunked_prefill": False})
    assert distance(space, on, off) == 1.0  # the switch, not the budget it turns off
    other = book.effective({"enable_chunked_prefill": True, "max_num_batched_tokens": 4096})
    assert distance(space, on, other) == pytest.approx(2.0)


SPACE = """\
engine: vllm
format: 1
params:
  - name: max_num_seqs
    type: int
    choices: [8, 16, 32, 64, 128, 256, 512, 1024]
    prior: {rank: 1, first: [16]}
  - name: block_size
    type: int
    choices: [16, 32, 64, 128]
    default: 16
"""

SLA = """
name: unit
model: {synth: tiny-llama}
workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 2}, requests: 4}
constraints: {p99_ttft_ms: 100}
objectives: [{maximize: goodput}]
"""


def stand_in(params: Mapping[str, Any]) -> TrialResult:
    """Meets the TTFT limit with at most 32 slots (the defaults, 1024 here, miss it)."""
    seqs = int(params.get("max_num_seqs", 1024))
    margin = -0.2 if seqs <= 32 else 0.5
    metrics = {"goodput": float(seqs), "p99_ttft_ms": 100.0 * (1 + margin)}
    ok = margin <= 0
    first = Level(2.0, ok, metrics, {"p99_ttft_ms": margin}, {}, {}, "level-0.json")
    if not ok:
        return TrialResult(dict(params), "stopped_early", "rate", (first,), None, "misses")
    return TrialResult(dict(params), "complete", "rate", (first,), 0)


def run_loop(tmp: Path, near: float | None) -> tuple[list[dict[str, Any]], optuna.Study]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "space.yaml").write_text(SPACE)
    space = gpu(tmp / "space.yaml")
    sla = parse_sla(SLA)
    launched: list[dict[str, Any]] = []

    def run(params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
        launched.append(dict(params))
        result = stand_in(params)
        result.write(trial_dir / "trial.json")
        return result

    plan = SearchPlan(space, sla, tmp, warm_limit=1, near_steps=near)
    plan.engine_defaults = lambda params: {"max_num_seqs": 1024}
    study = loop(tmp, space, plan, run, Budget(12), seed=3)
    return launched, study


def loop(
    tmp: Path,
    space: SearchSpace,
    plan: SearchPlan,
    run: Callable[[Mapping[str, Any], Path], TrialResult],
    budget: Budget,
    seed: int,
    say: Callable[[str], None] = lambda line: None,
) -> optuna.Study:
    """The study loop over ``space`` with a random sampler, ``plan`` and the stand-in ``run``."""
    study = open_study(
        plan.sla, storage_url(tmp, None), make_sampler("random", 30, 1, seed), {"engine": "x"}
    )
    StudyRunner(
        plan.sla,
        study,
        tmp,
        suggest=space.suggest,
        fixed=space.fixed,
        prune=lambda p: None,
        run=run,
        budget=budget,
        say=say,
        plan=plan,
    ).loop()
    return study


def test_sampled_candidates_far_from_every_feasible_launch_are_pruned(tmp_path: Path) -> None:
    launched, study = run_loop(tmp_path, near=2.0)
    # The defaults (1024 slots) miss; the warm start moves 6 steps to 16, which meets it.
    assert launched[:2] == [{}, {"max_num_seqs": 16}]
    seqs = [int(p.get("max_num_seqs", 1024)) for p in launched]
    blocks = [int(p.get("block_size", 16)) for p in launched]
    choices_seqs = [8, 16, 32, 64, 128, 256, 512, 1024]
    choices_block = [16, 32, 64, 128]

    def apart(i: int, j: int) -> int:
        return abs(choices_seqs.index(seqs[i]) - choices_seqs.index(seqs[j])) + abs(
            choices_block.index(blocks[i]) - choices_block.index(blocks[j])
        )

    # Every sampled launch lies within 2 steps of an earlier launch that met the SLA.
    for i in range(2, len(launched)):
        met = [j for j in range(i) if seqs[j] <= 32]
        assert min(apart(i, j) for j in met) <= 2, launched[i]
    far = [
        t.user_attrs["reason"]
        for t in study.trials
        if t.state == TrialState.PRUNED and "out of reach" in t.user_attrs.get("reason", "")
    ]
    assert far, "the sampler must have proposed something far from 16 slots"
    assert all("from the nearest config that met the SLA (trial " in r for r in far)
    # Without the rule the same sampler launches far from them (and misses the SLA).
    unrestricted, _ = run_loop(tmp_path / "free", near=None)
    assert any(int(p.get("max_num_seqs", 1024)) >= 128 for p in unrestricted[2:])


def test_nothing_is_out_of_reach_before_a_launch_met_the_sla(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    space = gpu(tmp_path / "space.yaml")
    sla = parse_sla(SLA)
    study = open_study(
        sla, storage_url(tmp_path, None), make_sampler("random", 5, 1, 0), {"engine": "x"}
    )
    plan = SearchPlan(space, sla, tmp_path)
    assert plan.out_of_reach(study, {"max_num_seqs": 1024, "block_size": 128}) is None


def test_a_far_proposal_moves_the_nearest_config_at_most_two_steps_toward_it() -> None:
    space = gpu()
    book = MissBook(space, engine_defaults=lambda params: H200)
    # What an unmodelled TPE proposal looks like: nearly every parameter changed.
    far = {
        "max_num_seqs": 1784,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 30807,
        "long_prefill_token_threshold": 4096,
        "async_scheduling": False,
        "stream_interval": 16,
        "gpu_memory_utilization": 0.81,
        "block_size": 128,
        "enable_prefix_caching": False,
        "optimization_level": 1,
        "max_cudagraph_capture_size": 1024,
    }
    start = book.effective({})
    assert distance(space, book.effective(far), start) > 2
    seen = set()
    for seed in range(20):
        moved = into_reach(book, {}, far, 2.0, random.Random(seed))
        assert moved, seed
        d = distance(space, book.effective(moved), start)
        assert 0 < d <= 2 + 1e-9, (seed, moved, d)
        for name, value in moved.items():  # toward the proposal: its value, or part way
            p = space.param(name)
            assert steps(p, value, far[name]) < steps(p, start[name], far[name]), (name, value)
        seen.add(tuple(sorted(moved)))
    assert len(seen) > 3, "the order of the changes must vary with the seed"
    assert into_reach(book, {}, far, 2.0, random.Random(7)) == into_reach(
        book, {}, far, 2.0, random.Random(7)
    )


def test_part_of_the_way_on_a_range_and_a_switch_that_turns_a_parameter_off() -> None:
    space = gpu()
    book = MissBook(space, engine_defaults=lambda params: H200)
    seqs = {"max_num_seqs": 256}
    assert into_reach(book, seqs, {"max_num_seqs": 2048}, 2.0, random.Random(0)) == {
        "max_num_seqs": 1024  # two factors of two, not the eight asked
    }
    half = into_reach(book, seqs, {"max_num_seqs": 2048}, 1.5, random.Random(0))
    assert half is not None and 256 < int(str(half["max_num_seqs"])) <= 256 * 2**1.5
    assert into_reach(book, seqs, seqs, 2.0, random.Random(0)) is None  # nothing to move
    chunked = {"enable_chunked_prefill": True, "max_num_batched_tokens": 16384}
    off = into_reach(book, chunked, {"enable_chunked_prefill": False}, 2.0, random.Random(0))
    assert off == {"enable_chunked_prefill": False}  # the budget it governed is dropped


def test_a_study_whose_proposals_all_lie_far_still_launches_within_reach(tmp_path: Path) -> None:
    """The H200 interactive study: 12 parameters, the first proposals change nearly all of
    them; pruning alone skipped 40 in a row and stopped the search after 2 launches."""
    sla = parse_sla(SLA)
    space = gpu()
    launched: list[dict[str, Any]] = []

    def run(params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
        launched.append(dict(params))
        level = Level(2.0, True, {"goodput": 2.0, "p99_ttft_ms": 50.0}, {}, {}, {}, "l.json")
        result = TrialResult(dict(params), "complete", "rate", (level,), 0)
        result.write(trial_dir / "trial.json")
        return result

    plan = SearchPlan(space, sla, tmp_path, warm_limit=0, near_steps=2.0)
    plan.engine_defaults = lambda params: H200
    said: list[str] = []
    study = loop(tmp_path, space, plan, run, Budget(6), seed=5, say=said.append)
    assert len(launched) == 6, said
    assert not any("suggestions in a row" in line for line in said)
    book = MissBook(space, engine_defaults=lambda params: H200)
    for i, params in enumerate(launched[1:], start=1):
        tuned = {k: v for k, v in params.items() if k not in space.fixed}
        near = min(
            distance(space, book.effective(tuned), book.effective(earlier))
            for earlier in launched[:i]
        )
        assert 0 < near <= 2 + 1e-9, (i, params)
    moved = [t for t in study.trials if t.user_attrs.get("moved_from") is not None]
    assert moved and all(t.state == TrialState.COMPLETE for t in moved)
    for t in moved:  # the proposal it came from: pruned out of reach, naming the move
        origin = study.trials[t.user_attrs["moved_from"]]
        assert origin.state == TrialState.PRUNED
        assert "queued instead: trial " in origin.user_attrs["reason"]
        # The sampler had its tries first: MOVE_AFTER proposals out of reach since the last
        # launch, the last of them moved.
        last = max(
            u.number for u in study.trials[: origin.number] if u.state == TrialState.COMPLETE
        )
        far = [
            u
            for u in study.trials[last + 1 : origin.number + 1]
            if "out of reach" in u.user_attrs.get("reason", "")
        ]
        assert len(far) == MOVE_AFTER
