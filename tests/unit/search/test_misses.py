"""What the search learns from its own misses (search/misses.py, issue 16).

The ``monotone:`` entries of ``search_spaces/vllm.yaml``; which neighbours of a missed launch
are hopeless and which are not (a parameter without a direction, an unknown default, the
helpful direction); which misses teach (decided, at the SLA's load, the other latency limits
met); and the study loop: a miss prunes the next warm-start value with its reason, the report
lists it, and a resumed study reads the misses back from its storage.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.bundle.summary import render
from autotuner.engines import registry
from autotuner.search.misses import Miss, MissBook, follows_from, taught
from autotuner.search.priors import SearchPlan
from autotuner.search.study import Budget, StudyRunner, make_sampler, open_study, storage_url
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import parse_sla
from autotuner.space import ParamOverride, SearchSpace, SpaceError, load_space

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


def book(space: SearchSpace) -> MissBook:
    metrics = {"max_gpu_memory_gib": "peak_memory_gib"}
    return MissBook(space, metrics, engine_defaults=lambda params: H200)


def miss(space: SearchSpace, params: Mapping[str, Any], *missed: str, number: int = 5) -> Miss:
    return Miss(number, False, book(space).effective(params), missed)


def why(space: SearchSpace, params: Mapping[str, Any], m: Miss) -> str | None:
    metrics = {"max_gpu_memory_gib": "peak_memory_gib"}
    return follows_from(space, book(space).effective(params), m, metrics)


# --------------------------------------------------------------------------- the file


def test_the_vllm_file_declares_directions_with_reasons() -> None:
    space = gpu()
    seqs = {(m.worse, m.limits) for m in space.param("max_num_seqs").monotone}
    assert seqs == {("higher", ("tpot", "itl")), ("lower", ("ttft",))}
    tokens = [(m.worse, m.limits) for m in space.param("max_num_batched_tokens").monotone]
    assert tokens == [("lower", ("ttft",))]  # no TPOT direction: both ways can win
    gmu = {(m.worse, m.limits) for m in space.param("gpu_memory_utilization").monotone}
    assert gmu == {("lower", ("ttft", "tpot", "itl")), ("higher", ("max_gpu_memory_gib",))}
    assert all(m.why for p in space.params for m in p.monotone)


def test_a_direction_needs_a_number_and_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "vllm.yaml"
    path.write_text(
        "engine: vllm\nformat: 1\nparams:\n"
        "  - name: b\n    type: bool\n"
        "    monotone: [{limits: [tpot], worse: higher, why: ' '}]\n"
    )
    with pytest.raises(SpaceError) as err:
        gpu(path)
    text = str(err.value)
    assert f"{path}:6: params.b: monotone[0]: only a number has a direction" in text
    assert "say why the move never helps" in text


# --------------------------------------------------------------------------- neighbours


def test_a_tpot_miss_makes_more_slots_hopeless_and_says_why() -> None:
    space = gpu()
    m = miss(space, {"max_num_seqs": 128}, "p99_tpot_ms")
    assert why(space, {"max_num_seqs": 256}, m) == (
        "hopeless: max_num_seqs 256 >= 128, which missed p99_tpot_ms at the SLA's load in "
        "trial 5: more slots never lower TPOT at a fixed load (the decode batch can only grow)"
    )
    assert why(space, {"max_num_seqs": 64}, m) is None  # the helpful direction
    assert why(space, {"max_num_seqs": 128}, m) is None  # the same config: reused, not pruned
    # Another parameter changed too, one without a direction for TPOT: incomparable.
    assert why(space, {"max_num_seqs": 256, "block_size": 32}, m) is None
    assert why(space, {"max_num_seqs": 256, "max_num_batched_tokens": 16384}, m) is None
    assert why(space, {"max_num_seqs": 256, "enable_chunked_prefill": False}, m) is None


def test_a_ttft_miss_makes_fewer_slots_and_smaller_steps_hopeless() -> None:
    space = gpu()
    m = miss(space, {"max_num_seqs": 64, "max_num_batched_tokens": 4096}, "p99_ttft_ms")
    reason = why(space, {"max_num_seqs": 32, "max_num_batched_tokens": 2048}, m)
    assert reason is not None
    assert "max_num_seqs 32 <= 64 and max_num_batched_tokens 2048 <= 4096" in reason
    assert "fewer slots never lower TTFT" in reason and "a smaller step budget" in reason
    assert why(space, {"max_num_seqs": 128, "max_num_batched_tokens": 4096}, m) is None
    assert why(space, {"max_num_seqs": 32, "max_num_batched_tokens": 8192}, m) is None


def test_memory_and_latency_directions_of_gpu_memory_utilization() -> None:
    space = gpu()
    over = miss(space, {}, "max_gpu_memory_gib", number=0)  # the defaults: 0.92
    assert why(space, {"gpu_memory_utilization": 0.95}, over) is not None
    assert why(space, {"gpu_memory_utilization": 0.88}, over) is None
    slow = miss(space, {"max_num_seqs": 128}, "p99_tpot_ms")
    both = why(space, {"max_num_seqs": 256, "gpu_memory_utilization": 0.88}, slow)
    assert both is not None and "gpu_memory_utilization 0.88 <= 0.92" in both
    assert why(space, {"max_num_seqs": 256, "gpu_memory_utilization": 0.95}, slow) is None


def test_the_defaults_miss_teaches_only_where_the_engine_default_is_known() -> None:
    space = gpu()
    known = miss(space, {}, "p99_tpot_ms", number=0)
    reason = why(space, {"max_num_batched_tokens": 8192, "max_num_seqs": 2048}, known)
    assert reason is not None and "in trial 0" in reason and "2048 >= 1024" in reason
    unknown = MissBook(space).effective({})  # no engine defaults: max_num_seqs unknown
    m = Miss(0, True, unknown, ("p99_tpot_ms",))
    assert follows_from(space, MissBook(space).effective({"max_num_seqs": 2048}), m) is None


def test_which_misses_teach() -> None:
    assert taught({"p99_ttft_ms": -0.2, "p99_tpot_ms": 0.3}) == ("p99_tpot_ms",)
    # Both latencies missed: maybe overloaded, not measured at the SLA's load.
    assert taught({"p99_ttft_ms": 0.5, "p99_tpot_ms": 0.3}) == ()
    # Not measurable, or the percentile's interval not clear of the limit: no miss.
    assert taught({"p99_ttft_ms": -0.2, "p99_tpot_ms": None}) == ()
    verdicts = {"p99_ttft_ms": "meets", "p99_tpot_ms": "undecided"}
    assert taught({"p99_ttft_ms": -0.2, "p99_tpot_ms": 0.01}, verdicts) == ()
    # Memory does not depend on the load: it teaches next to latency misses.
    memory = {"max_gpu_memory_gib": "peak_memory_gib"}
    margins = {"p99_ttft_ms": 0.5, "p99_tpot_ms": 0.3, "max_gpu_memory_gib": 0.01}
    assert taught(margins, None, memory) == ("max_gpu_memory_gib",)


# --------------------------------------------------------------------------- the loop

SLA = """
name: unit
model: {synth: tiny-llama}
workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 2}, requests: 4}
constraints: {p99_ttft_ms: 100, p99_tpot_ms: 20}
objectives: [{maximize: goodput}]
"""

SPACE = """\
engine: vllm
format: 1
params:
  - name: max_num_seqs
    type: int
    choices: [16, 32, 64, 128, 256]
    default: 32
    prior: {rank: 1, first: [64, 128]}
    monotone:
      - {limits: [tpot], worse: higher, why: more slots never lower TPOT}
  - name: block_size
    type: int
    choices: [16, 32]
    default: 16
"""


def stand_in(params: Mapping[str, Any]) -> TrialResult:
    """TPOT misses from 64 slots up; more slots serve more while it holds."""
    seqs = int(params.get("max_num_seqs", 32))
    tpot = 10.0 + seqs / 4  # 26 ms at 64 slots: over the 20 ms limit
    margins: dict[str, float | None] = {"p99_ttft_ms": -0.5, "p99_tpot_ms": (tpot - 20) / 20}
    ok = tpot <= 20
    metrics: dict[str, float | None] = {
        "goodput": 2.0 if ok else 1.0,
        "p99_ttft_ms": 50.0,
        "p99_tpot_ms": tpot,
        "request_rate": 2.0,
        "mean_e2e_ms": 100.0,
        "mean_ttft_ms": 40.0,
    }
    first = Level(2.0, ok, metrics, margins, {}, {}, "level-0.json")
    if not ok:
        return TrialResult(dict(params), "stopped_early", "rate", (first,), None, "misses")
    top = Level(float(seqs), True, {**metrics, "goodput": float(seqs)}, margins, {}, {}, "l1")
    return TrialResult(dict(params), "complete", "rate", (first, top), 1)


def test_a_miss_prunes_its_worse_neighbours_in_the_loop_and_after_a_resume(
    tmp_path: Path,
) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    space = gpu(tmp_path / "space.yaml")
    sla = parse_sla(SLA)
    launched: list[dict[str, Any]] = []
    said: list[str] = []

    def run(params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
        launched.append(dict(params))
        result = stand_in(params)
        result.write(trial_dir / "trial.json")
        return result

    def study() -> optuna.Study:
        sampler = make_sampler("random", 12, 1, 0)
        return open_study(sla, storage_url(tmp_path, None), sampler, {"engine": "x"})

    s = study()
    StudyRunner(
        sla,
        s,
        tmp_path,
        suggest=space.suggest,
        fixed=space.fixed,
        prune=lambda p: None,
        run=run,
        budget=Budget(8),
        say=said.append,
        plan=SearchPlan(space, sla, tmp_path, warm_limit=3),
    ).loop()
    # The defaults meet the SLA; the warm start's 64 misses TPOT, so its 128 is pruned.
    assert launched[:2] == [{}, {"max_num_seqs": 64}]
    pruned = {t.number: t.user_attrs["reason"] for t in s.trials if t.state == TrialState.PRUNED}
    assert pruned[2] == (
        "hopeless: max_num_seqs 128 >= 64, which missed p99_tpot_ms at the SLA's load in "
        "trial 1: more slots never lower TPOT"
    )

    # No launch follows from an earlier miss: more slots at the same block size.
    def block(p: Mapping[str, Any]) -> int:
        return int(p.get("block_size", 16))

    def tpot_missed(p: Mapping[str, Any]) -> bool:
        return stand_in(p).levels[0].feasible is False

    for i, p in enumerate(launched):
        for m in filter(tpot_missed, launched[:i]):
            assert block(p) != block(m) or p.get("max_num_seqs", 32) <= m["max_num_seqs"]
    report = render(s, tmp_path, registry.get("vllm").roles)
    row = next(line for line in report.splitlines() if line.lstrip().startswith("2 "))
    assert "pruned" in row and pruned[2] in row
    # A new process on the same storage reads the misses back.
    plan = SearchPlan(space, sla, tmp_path)
    again = plan.hopeless(study(), {"max_num_seqs": 256})
    assert again is not None and "which missed p99_tpot_ms at the SLA's load in trial 1" in again
    at_32 = [p for p in launched if tpot_missed(p) and block(p) == 32]
    other_block = plan.hopeless(study(), {"max_num_seqs": 256, "block_size": 32})
    assert (other_block is None) == (not at_32)
