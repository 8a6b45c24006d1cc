"""Priors, hopeless values, the warm start and the stopping rule (issue 16).

The schema and its loader errors; each hopeless condition of ``search_spaces/vllm.yaml``
with its reason; Little's law from a baseline's measurements; the warm-start order; and the
study loop with a synthetic surface: warm start, hopeless pruning after the baseline (also
when a new process resumes the study), the stopping rule, and the report listing pruned
values with their reasons.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.bundle.summary import render
from autotuner.engines import registry
from autotuner.search import study as study_module
from autotuner.search.priors import (
    SearchPlan,
    Situation,
    hopeless_reason,
    measured_from,
    sampler_startup,
    snap,
    strategy_for,
    warm_candidates,
)
from autotuner.search.progress import (
    StudyStopper,
    _recorded_capacity,
    defaults_line,
    launch_history,
)
from autotuner.search.stopping import StoppingRule
from autotuner.search.study import (
    Budget,
    StudyRunner,
    fail_stale,
    make_sampler,
    open_study,
    storage_url,
)
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import Sla, TuneSpec, parse_sla
from autotuner.space import ParamOverride, SearchSpace, SpaceError, load_space

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

SLA = """
name: unit
model: {synth: tiny-llama}
workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 2}, requests: 4}
constraints: {p99_ttft_ms: 100}
objectives: [{maximize: goodput}]
"""


def gpu(
    version: str = "0.26.0", *, lossy: bool = False, path: Path | None = None, **ov: Any
) -> SearchSpace:
    return load_space(
        "vllm",
        version,
        device="gpu",
        gpu_count=1,
        compute_capability=(9, 0),
        allow_lossy=lossy,
        overrides={k: ParamOverride.model_validate(v) for k, v in ov.items()},
        path=path,
    )


def situation(sla: str = SLA, device: str = "gpu", concurrency: float | None = None) -> Situation:
    measured = {} if concurrency is None else {"concurrency": concurrency}
    return Situation.of(parse_sla(sla), device, measured)


# --------------------------------------------------------------------------- schema


def test_the_vllm_file_gives_priors_and_hopeless_values_with_reasons() -> None:
    space = gpu()
    seqs = space.param("max_num_seqs")
    assert seqs.prior is not None and seqs.prior.rank == 2
    # Sized from the incumbent's capacity, the load that matters (issue 28, section 3).
    assert (seqs.prior.near, seqs.prior.times, seqs.prior.first) == (
        "capacity_concurrency",
        (2.0, 1.5),
        (256, 512),
    )
    assert [(h.below, h.times) for h in seqs.hopeless] == [
        ("concurrency", 1.0),
        ("concurrency", 1.5),
    ]
    assert all(h.why for p in space.params for h in p.hopeless)
    level = space.param("optimization_level").hopeless[0]
    assert (level.values, level.device, level.unless_objective) == ((0,), "gpu", ("startup_s",))
    mode = space.param("performance_mode").hopeless[0]
    assert (mode.values, mode.objective) == (("interactivity",), "throughput")
    # The CPU variant replaces the prior; cpu choices of block_size etc. are unaffected.
    cpu = load_space(
        "vllm",
        "0.32.0",
        device="cpu",
        gpu_count=0,
        compute_capability=None,
        allow_lossy=False,
        overrides={},
    )
    cpu_prior = cpu.param("max_num_seqs").prior
    assert cpu_prior is not None and cpu_prior.first == (64, 256)


def test_priors_and_hopeless_values_do_not_change_the_space_hash(tmp_path: Path) -> None:
    text = "engine: vllm\nformat: 1\nparams:\n  - {name: a, type: int, choices: [1, 2, 4]%s}\n"
    plain = tmp_path / "plain.yaml"
    plain.write_text(text % "")
    rich = tmp_path / "rich.yaml"
    rich.write_text(
        text % ", prior: {rank: 1, first: [4]}, hopeless_when: [{values: [1], why: slow}]"
    )
    assert gpu(path=plain).hash() == gpu(path=rich).hash()


# The entry starts at line 8 of the file; each case gives the line its problem is on.
@pytest.mark.parametrize(
    ("entry", "line", "message"),
    [
        (
            "hopeless_when:\n      - below: latency\n        why: x",
            9,
            "hopeless_when[0]: latency is neither a number nor measured "
            "(capacity_concurrency, concurrency)",
        ),
        ("hopeless_when:\n      - values: [1]", 9, "hopeless_when.0.why: Field required"),
        (
            "hopeless_when:\n      - values: [1]\n        why: ' '",
            10,
            "hopeless_when[0]: say why these values are hopeless",
        ),
        (
            "hopeless_when:\n      - {values: [1], with: {zz: [1]}, why: x}",
            9,
            "hopeless_when[0]: 'zz' is not declared",
        ),
        (
            "hopeless_when:\n      - {values: [1], below: 3, why: x}",
            9,
            "give either 'values' or 'below'",
        ),
        (
            "hopeless_when:\n      - {values: [1], times: 2, why: x}",
            9,
            "'times' multiplies a measured 'below'",
        ),
        ("hopeless_when:\n      - {values: [x], why: x}", 9, "hopeless_when[0]: x is not an int"),
        (
            "hopeless_when:\n      - {values: [1], limited: [latency], why: x}",
            9,
            "'latency': name a latency (ttft, tpot, itl, e2e) or its metric",
        ),
        ("prior: {first: [2]}", 8, "prior: a prior needs a rank"),
        ("prior: {rank: 1}", 8, "a ranked prior needs 'first' values or 'near'"),
        ("prior: {rank: 1, near: concurrency}", 8, "'near' needs 'times'"),
        ("prior: {rank: 1, first: [2], times: [2]}", 8, "'times' multiplies 'near'"),
        ("prior: {rank: 1, first: [3]}", 8, "prior: 3 is not one of the choices"),
        ("prior: {rank: 1, near: memory, times: [2]}", 8, "'memory' is not a measured quantity"),
        ("prior: {rank: 0, first: [2]}", 8, "greater than or equal to 1"),
    ],
)
def test_bad_priors_and_conditions_name_the_file_and_line(
    tmp_path: Path, entry: str, line: int, message: str
) -> None:
    path = tmp_path / "vllm.yaml"
    path.write_text(
        "engine: vllm\nformat: 1\nparams:\n"
        "  - name: a\n    type: int\n    choices: [1, 2, 4]\n    default: 1\n"
        f"    {entry}\n"
    )
    with pytest.raises(SpaceError) as err:
        gpu(path=path)
    problems = err.value.problems
    assert any(p.startswith(f"{path}:{line}: ") and message in p for p in problems), problems


def test_bool_parameters_can_not_be_near_a_quantity_or_below_a_bound(tmp_path: Path) -> None:
    path = tmp_path / "vllm.yaml"
    path.write_text(
        "engine: vllm\nformat: 1\nparams:\n"
        "  - name: b\n    type: bool\n"
        "    prior: {rank: 1, near: concurrency, times: [2]}\n"
        "    hopeless_when: [{below: 3, why: y}]\n"
    )
    with pytest.raises(SpaceError) as err:
        gpu(path=path)
    assert f"{path}:6: params.b: prior: only numbers can be near" in str(err.value)
    assert f"{path}:7: params.b: hopeless_when[0]: only numbers can be below" in str(err.value)


# --------------------------------------------------------------------------- conditions


def test_eager_mode_is_hopeless_on_a_gpu_only() -> None:
    why = hopeless_reason(gpu(), {"optimization_level": 0}, situation())
    assert why is not None and why.startswith("hopeless: optimization_level=0 (on gpu")
    assert "start-up time is not an objective" in why
    assert hopeless_reason(gpu(), {"optimization_level": 1}, situation()) is None
    old = gpu("0.11.0")  # enforce_eager is searched where optimization_level does not exist
    eager = hopeless_reason(old, {"enforce_eager": True}, situation())
    assert eager is not None and "eager mode" in eager
    cpu = load_space(
        "vllm",
        "0.32.0",
        device="cpu",
        gpu_count=0,
        compute_capability=None,
        allow_lossy=False,
        overrides={},
    )
    assert hopeless_reason(cpu, {"optimization_level": 0}, situation(device="cpu")) is None


def test_unless_objective_spares_values_when_that_metric_is_an_objective() -> None:
    space = gpu()
    startup = Situation("gpu", objectives=(("startup_s", "minimize"),))
    assert hopeless_reason(space, {"optimization_level": 0}, startup) is None


def test_a_latency_oriented_mode_is_hopeless_for_a_throughput_objective_only() -> None:
    why = hopeless_reason(gpu(), {"performance_mode": "interactivity"}, situation())
    assert why is not None and "for a throughput objective" in why
    assert "small batches" in why
    latency_first = SLA.replace("[{maximize: goodput}]", "[{minimize: p99_ttft_ms}]")
    assert (
        hopeless_reason(gpu(), {"performance_mode": "interactivity"}, situation(latency_first))
        is None
    )
    assert hopeless_reason(gpu(), {"performance_mode": "throughput"}, situation()) is None


def test_max_num_seqs_below_the_measured_concurrency_is_hopeless_after_the_baseline() -> None:
    space = gpu()
    assert hopeless_reason(space, {"max_num_seqs": 24}, situation()) is None  # not measured yet
    why = hopeless_reason(space, {"max_num_seqs": 24}, situation(concurrency=34.4))
    assert why is not None
    assert why.startswith("hopeless: max_num_seqs=24 (below the measured concurrency 34.4)")
    assert "Little's law" in why
    assert hopeless_reason(space, {"max_num_seqs": 40}, situation(concurrency=34.4)) is None


def test_few_slots_without_chunked_prefill_are_hopeless_under_a_ttft_limit() -> None:
    space = gpu()
    unchunked = {"max_num_seqs": 48, "enable_chunked_prefill": False}
    why = hopeless_reason(space, unchunked, situation(concurrency=34.4))  # 48 < 1.5 x 34.4
    assert why is not None and "below 1.5 x the measured concurrency 34.4" in why
    assert "with enable_chunked_prefill in [false]" in why and "under a ttft limit" in why
    chunked = {"max_num_seqs": 48, "enable_chunked_prefill": True}
    assert hopeless_reason(space, chunked, situation(concurrency=34.4)) is None
    no_ttft = SLA.replace("{p99_ttft_ms: 100}", "{p99_tpot_ms: 100}")
    assert hopeless_reason(space, unchunked, situation(no_ttft, concurrency=34.4)) is None


def test_pinned_values_are_never_judged() -> None:
    space = gpu(optimization_level={"fixed": 0})
    assert space.fixed["optimization_level"] == 0  # the SLA's decision, not a suggestion
    assert hopeless_reason(space, {"max_num_seqs": 256}, situation()) is None


def _result(
    metrics: Mapping[str, float], load_kind: str = "rate", load: float = 15.0
) -> TrialResult:
    level = Level(load, True, dict(metrics), {}, {}, {}, "level-0.json")
    return TrialResult({}, "complete", load_kind, (level,), 0)  # type: ignore[arg-type]


def test_littles_law_from_the_baseline() -> None:
    # The H200 grid's defaults: 13.8 req/s served, mean E2E 2556 ms of which 66 ms to the
    # first token: 34.4 requests decoding at once.
    m = measured_from(_result({"request_rate": 13.8, "mean_e2e_ms": 2556.2, "mean_ttft_ms": 66.4}))
    assert m["concurrency"] == pytest.approx(13.8 * 2.4898)
    assert measured_from(_result({}, "concurrency", 24)) == {"concurrency": 24.0}
    assert measured_from(_result({"request_rate": 13.8})) == {}
    assert measured_from(TrialResult({}, "failed", "rate")) == {}


# --------------------------------------------------------------------------- warm start


def test_snap_moves_values_into_the_domain() -> None:
    space = gpu(max_num_seqs={"values": [64, 128, 256]}, gpu_memory_utilization={"low": 0.8})
    seqs = space.param("max_num_seqs")
    assert snap(seqs, 103.2) == 128 and snap(seqs, 68.8) == 64 and snap(seqs, 5000) == 256
    assert snap(seqs, 93) == 128  # nearer 128 on a log scale, nearer 64 on a linear one
    assert snap(space.param("performance_mode"), "fast") is None
    gmu = space.param("gpu_memory_utilization")
    assert snap(gmu, 0.999) == 0.96 and snap(gmu, 0.9049) == 0.9
    assert snap(gpu().param("max_num_seqs"), 103.2) == 103


def test_warm_start_order_one_knob_at_a_time_by_rank() -> None:
    space = gpu(lossy=True)
    # 34.4 requests in flight at the incumbent's capacity: x2, x1.5 (no bounding limit known)
    at_capacity = Situation.of(parse_sla(SLA), "gpu", {"capacity_concurrency": 34.4})
    cands = [c for *_, c in warm_candidates(space, {}, at_capacity)]
    assert cands == [
        {"kv_cache_dtype": "fp8"},  # first where lossy is allowed: it changes what fits
        {"max_num_seqs": 69},
        {"max_num_seqs": 52},
        {"max_num_batched_tokens": 16384},
        {"max_num_batched_tokens": 4096},
        {"performance_mode": "throughput"},
        {"gpu_memory_utilization": 0.95},
    ]
    # Without the baseline's measurement: the file's first values; lossy fp8 is not in the
    # domain unless allowed.
    plain = [c for *_, c in warm_candidates(gpu(), {}, situation())]
    assert plain[:2] == [{"max_num_seqs": 256}, {"max_num_seqs": 512}]
    assert {"kv_cache_dtype": "fp8"} not in plain
    # Around the best config so far: its values stay, the incumbent's own value is skipped.
    around = [c for *_, c in warm_candidates(gpu(), {"max_num_seqs": 256}, situation())]
    assert around[0] == {"max_num_seqs": 512}
    assert around[1] == {"max_num_seqs": 256, "max_num_batched_tokens": 16384}


# --------------------------------------------------------------------------- the loop

SPACE = """\
engine: vllm
format: 1
params:
  - name: max_num_seqs
    type: int
    choices: [8, 16, 32, 64, 128]
    prior: {rank: 1, near: concurrency, times: [3, 1.5], first: [64]}
    hopeless_when:
      - below: concurrency
        why: too few slots for the requests in flight
  - name: performance_mode
    type: categorical
    choices: [balanced, interactivity, throughput]
    default: balanced
    prior: {rank: 2, first: [throughput]}
    hopeless_when:
      - values: [interactivity]
        objective: throughput
        why: tuned for small batches
"""


def surface(params: Mapping[str, Any], flat: bool = False) -> TrialResult:
    seqs = int(params.get("max_num_seqs", 32))
    goodput = 10.0 if flat else float(seqs) + (5.0 if params.get("performance_mode") else 0.0)
    # Little's law at the SLA's rate: 2 req/s x 10 s after the first token = 20 in flight.
    metrics = {
        "goodput": goodput,
        "p99_ttft_ms": 50.0,
        "request_rate": 2.0,
        "mean_e2e_ms": 10_050.0,
        "mean_ttft_ms": 50.0,
    }
    first = Level(2.0, True, metrics, {"p99_ttft_ms": -0.5}, {}, {}, "level-0.json")
    # The highest load it held is its goodput (its capacity, once trials record one).
    top = Level(goodput, True, metrics, {"p99_ttft_ms": -0.5}, {}, {}, "level-1.json")
    return TrialResult(dict(params), "complete", "rate", (first, top), 1)


class Loop:
    def __init__(self, tmp: Path, *, budget: int, flat: bool = False, patience: int = 3) -> None:
        self.dir = tmp
        (tmp / "space.yaml").write_text(SPACE)
        self.space = gpu(path=tmp / "space.yaml")
        self.sla: Sla = parse_sla(SLA)
        self.budget = budget
        self.flat = flat
        self.patience = patience
        self.launched: list[dict[str, Any]] = []
        self.said: list[str] = []

    def study(self) -> optuna.Study:
        sampler = make_sampler("random", self.budget, 1, 0)
        return open_study(self.sla, storage_url(self.dir, None), sampler, {"engine": "x"})

    def runner(self, study: optuna.Study, *, stop: bool = True) -> StudyRunner:
        def run(params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
            self.launched.append(dict(params))
            result = surface(params, self.flat)
            result.write(trial_dir / "trial.json")
            return result

        plan = SearchPlan(self.space, self.sla, self.dir, warm_limit=4)
        stopper = StudyStopper(StoppingRule(self.patience, 0.03)) if stop else None
        return StudyRunner(
            self.sla,
            study,
            self.dir,
            suggest=self.space.suggest,
            fixed=self.space.fixed,
            prune=lambda p: None,
            run=run,
            budget=Budget(self.budget),
            say=self.said.append,
            plan=plan,
            stopper=stopper,
        )


def test_baseline_then_warm_start_around_the_best_then_the_sampler(tmp_path: Path) -> None:
    loop = Loop(tmp_path, budget=6)
    study = loop.study()
    loop.runner(study, stop=False).loop()
    # Defaults; max_num_seqs around 3x and 1.5x the 20 requests in flight the defaults showed
    # (60 -> 64, 30 -> 32: never below 1.5 x 20); the mode on top of the best so far (64);
    # then the sampler.
    assert loop.launched[:4] == [
        {},
        {"max_num_seqs": 64},
        {"max_num_seqs": 32},
        {"max_num_seqs": 64, "performance_mode": "throughput"},
    ]
    warm = [t for t in study.trials if "fixed_params" in t.system_attrs]
    assert [t.params for t in warm] == loop.launched[1:4]
    assert any("warm start" in line for line in loop.said)
    # One pass: 32 is not tried again with the mode; the sampler has the rest of the budget.
    assert len(loop.launched) == 6
    assert {"max_num_seqs": 32, "performance_mode": "throughput"} not in [t.params for t in warm]


def test_hopeless_values_are_pruned_after_the_baseline_and_listed_in_the_report(
    tmp_path: Path,
) -> None:
    loop = Loop(tmp_path, budget=14)
    study = loop.study()
    loop.runner(study, stop=False).loop()
    pruned = {
        t.number: t.user_attrs["reason"] for t in study.trials if t.state == TrialState.PRUNED
    }
    assert pruned, "the random sampler must have proposed 8, 16 or interactivity"
    for reason in pruned.values():
        assert reason.startswith("hopeless: ")
        assert (
            "(below the measured concurrency 20.0): too few slots" in reason
            or "performance_mode=interactivity (for a throughput objective)" in reason
        )
    for p in loop.launched:
        assert p.get("max_num_seqs", 32) >= 20 and p.get("performance_mode") != "interactivity"
    report = render(study, tmp_path, registry.get("vllm").roles)
    for number, reason in pruned.items():
        row = next(line for line in report.splitlines() if line.lstrip().startswith(f"{number} "))
        assert "pruned" in row and reason in row


def test_a_resumed_study_reads_the_baseline_measurement_back(tmp_path: Path) -> None:
    loop = Loop(tmp_path, budget=1)
    loop.runner(loop.study(), stop=False).loop()  # the baseline only
    plan = SearchPlan(loop.space, loop.sla, tmp_path)  # a new process: nothing in memory
    study = loop.study()
    assert plan.situation(study).measured["concurrency"] == pytest.approx(20.0)
    assert plan.hopeless(study, {"max_num_seqs": 16}) is not None
    assert plan.next_warm(study, loop.space.fixed) == {"max_num_seqs": 64}


def test_the_stopping_rule_ends_a_flat_study_and_says_how_the_defaults_compare(
    tmp_path: Path,
) -> None:
    loop = Loop(tmp_path, budget=20, flat=True, patience=3)
    study = loop.study()
    loop.runner(study).loop()
    history = launch_history(study)
    assert len(loop.launched) == len(history) < 20
    # The warm start (3 launches here) always runs whole; then 3 launches without a gain.
    assert len(history) >= 4
    assert loop.said[-1].startswith("stopped: the last 3 launches raised the best capacity by")
    line = defaults_line(study)
    assert line is not None
    assert line.startswith(f"the engine defaults are within 0.0% of the best of {len(history)}")
    assert "no config tried measurably beat them" in line


def test_the_rule_waits_for_the_warm_start(tmp_path: Path) -> None:
    loop = Loop(tmp_path, budget=20, flat=True, patience=1)
    study = loop.study()
    loop.runner(study).loop()
    # Patience 1 would stop after the second launch; the warm start runs whole first (around
    # the defaults: no launch served more than they did), then the rule stops the study.
    assert loop.launched == [
        {},
        {"max_num_seqs": 64},
        {"max_num_seqs": 32},
        {"performance_mode": "throughput"},
    ]


def test_strategy_follows_the_sla(tmp_path: Path) -> None:
    space = gpu()
    sla = parse_sla(SLA + "tune: {patience: 5}\n")
    plan, stopper = strategy_for(sla, space, tmp_path, 12)
    assert plan is not None and plan.warm_limit == 6
    assert stopper is not None and stopper.rule.patience == 5
    assert stopper.rule.resolution == getattr(sla.tune, "capacity_resolution", 0.03)
    assert strategy_for(parse_sla(SLA + "tune: {patience: null}\n"), space, tmp_path, 12)[1] is None
    grid = parse_sla(
        SLA + "search: {params: {max_num_seqs: {values: [8, 16]}}}\ntune: {sampler: grid}\n"
    )
    assert strategy_for(grid, space, tmp_path, 12) == (None, None)
    assert sampler_startup(sla) == 2 and sampler_startup(grid) is None
    tpe = make_sampler("auto", 12, 1, 0, startup_trials=sampler_startup(sla))
    assert isinstance(tpe, optuna.samplers.TPESampler) and tpe._n_startup_trials == 2
    plain = make_sampler("auto", 40, 1, 0)
    assert isinstance(plain, optuna.samplers.TPESampler) and plain._n_startup_trials == 10
    assert TuneSpec().patience == 4
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        TuneSpec(patience=0)


def test_the_capacity_accessor_reads_a_recorded_capacity_in_any_shape() -> None:
    assert _recorded_capacity(SimpleNamespace(capacity=SimpleNamespace(value=4.1))) == 4.1  # type: ignore[arg-type]
    assert _recorded_capacity(SimpleNamespace(capacity={"value": 3.0})) == 3.0  # type: ignore[arg-type]
    assert _recorded_capacity(SimpleNamespace(capacity=None)) is None  # type: ignore[arg-type]
    assert _recorded_capacity(SimpleNamespace()) is None  # type: ignore[arg-type]


def test_an_interrupted_warm_start_trial_runs_again_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = Loop(tmp_path, budget=1)
    loop.runner(loop.study(), stop=False).loop()  # the baseline
    loop.budget = 2
    pending = loop.runner(loop.study(), stop=False).prepare()  # asked, then the tuner "dies"
    assert pending is not None and pending.params == {"max_num_seqs": 64}
    monkeypatch.setattr(study_module, "owner_state", lambda owner: "gone")
    study = loop.study()
    assert fail_stale(study, loop.said.append) == [pending.trial.number]
    loop.runner(study, stop=False).loop()
    # Re-queued with exactly its values: the parameters it left to the engine stay there.
    assert loop.launched == [{}, {"max_num_seqs": 64}]


def test_bracket_width_of_a_record() -> None:
    from autotuner.search.progress import _bracket_width

    wide = SimpleNamespace(capacity=SimpleNamespace(low=20.0, high=22.5))
    assert _bracket_width(wide) == pytest.approx(0.125)  # type: ignore[arg-type]
    for cap in (None, SimpleNamespace(low=0.0, high=15.0), SimpleNamespace(low=20.0, high=None)):
        assert _bracket_width(SimpleNamespace(capacity=cap)) is None  # type: ignore[arg-type]


def test_the_trial_line_reads_the_ttft_percentile_the_sla_limits(tmp_path: Path) -> None:
    loop = Loop(tmp_path, budget=1)
    loop.sla = parse_sla(SLA.replace("{p99_ttft_ms: 100}", "{p90_ttft_ms: 100}"))
    loop.runner(loop.study(), stop=False).loop()
    line = next(s for s in loop.said if s.startswith("  -> "))
    assert "p90 TTFT" in line and "p99 TTFT" not in line


def test_the_warm_start_builds_on_a_memory_fix_when_the_defaults_break_the_limit(
    tmp_path: Path,
) -> None:
    from autotuner.core.hardware import CpuInfo, GpuInfo, HardwareProfile
    from autotuner.pipeline.tune import memory_limit_reason
    from autotuner.search.priors import memory_fix

    # An H200 (140.4 GiB) under a 130 GiB limit: vLLM's default 0.92 claims ~132 GiB.
    h200 = GpuInfo(0, "GPU-x", "NVIDIA H200", (9, 0), 143771 * 2**20)
    hw = HardwareProfile("gpu", CpuInfo("x", 16, 16, 2**37, 2**36), (h200,))
    space = gpu()

    def over(params: Mapping[str, Any]) -> str | None:
        return memory_limit_reason(params, hw, 130.0, registry.get("vllm"))

    assert over({}) is not None
    fix = memory_fix(space, over)
    assert fix == {"gpu_memory_utilization": pytest.approx(0.90)}  # the nearest under 130
    assert over(fix) is None and over({"gpu_memory_utilization": 0.91}) is not None
    # Defaults that fit need no fix.
    vllm = registry.get("vllm")
    assert memory_fix(space, lambda p: memory_limit_reason(p, hw, 139.0, vllm)) == {}

    # With no config holding the SLA yet, every warm-start candidate carries the fix.
    plan = SearchPlan(space, parse_sla(SLA), tmp_path, start_from=dict(fix))
    study = optuna.create_study(storage=storage_url(tmp_path, None), study_name="warm")
    cand = plan.next_warm(study, {})
    assert cand is not None and cand["gpu_memory_utilization"] == pytest.approx(0.90)
    assert len(cand) == 2  # the fix and one prior value
    # Also once the defaults were measured missing memory (the closest launch to meeting).
    study.add_trial(
        optuna.trial.create_trial(
            params={},
            distributions={},
            value=0.0,
            user_attrs={"role": "baseline"},
            system_attrs={"constraints": [0.02]},
        )
    )
    cand = plan.next_warm(study, {})
    assert cand is not None and cand["gpu_memory_utilization"] == pytest.approx(0.90)
