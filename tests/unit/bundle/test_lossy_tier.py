"""The lossy tier without engines: a study of synthetic launches with one lossless and one lossy
(fp8 KV cache) winner, then :func:`promote` with synthetic confirmation launches and a stand-in
quality gate. Each branch of the two-tier decision, and the pure functions under it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from autotuner.bundle.lossy_tier import lossy_tier_md
from autotuner.bundle.promote import Context, promote
from autotuner.bundle.summary import render
from autotuner.core.hardware import CpuInfo, HardwareProfile
from autotuner.engines import registry
from autotuner.measure.quality import DUMMY_WEIGHTS, GateResult
from autotuner.records.lossy import LossyTier, TierWinner
from autotuner.records.manifest import Manifest
from autotuner.records.trial import CapacityRecord
from autotuner.search import rerun
from autotuner.search.confirm import Decision
from autotuner.search.pareto import Candidate
from autotuner.search.study import Budget, StudyRunner, make_sampler, open_study, storage_url
from autotuner.search.tiers import gain, gate_due, settle, split
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import parse_sla
from autotuner.space import ParamSpec, SearchSpace, spaces_dir

SLA = """
name: lossy-unit
model: {synth: tiny-llama}
target: cpu
workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 1}, requests: 4}
constraints: {p99_ttft_ms: 100}
search: {allow_lossy: ALLOW}
quality: {promote_unmeasured: UNMEASURED}
tune: {confirm: {candidates: 1, replicates: 3, min_effect: 0.05}}
"""
FIXED = {"enforce_eager": True}
LOSSLESS = {"max_num_seqs": 32}
LOSSY = {"max_num_seqs": 32, "kv_cache_dtype": "fp8"}
# Search capacities (req/s): baseline 1, the lossless winner 2, the lossy one 3.
SEARCH = {"baseline": 1.0, "lossless": 2.0, "lossy": 3.0}


def kind(params: Mapping[str, Any]) -> str:
    if params.get("kv_cache_dtype") == "fp8":
        return "lossy"
    return "lossless" if "max_num_seqs" in params else "baseline"


def level(load: float, ok: bool) -> Level:
    ttft = 50.0 if ok else 500.0
    metrics: dict[str, float | None] = {"goodput": load, "p99_ttft_ms": ttft, "peak_memory_gib": 1}
    return Level(load, ok, metrics, {"p99_ttft_ms": (ttft - 100) / 100}, {}, {}, "level-0.json")


@dataclass
class Scenario:
    confirm: dict[str, list[float]]  # confirmation capacities per config kind
    gate: GateResult | None = None
    calls: list[str] = field(default_factory=list)
    gate_calls: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    baseline_fails: bool = False

    def search(self, params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
        trial_dir.mkdir(parents=True, exist_ok=True)
        if self.baseline_fails and kind(params) == "baseline":
            failed = TrialResult(dict(params), "failed", "rate", reason="x", cause="other")
            failed.write(trial_dir / "trial.json")
            return failed
        top = SEARCH[kind(params)]
        cap = CapacityRecord(value=top, low=top, high=top * 1.02, unit="req/s", stopped_by="x")
        levels = (level(1.0, True), level(top, True))
        result = TrialResult(dict(params), "complete", "rate", levels, 1, capacity=cap)
        result.write(trial_dir / "trial.json")
        return result

    def confirm_run(self, params: Mapping[str, Any], run_dir: Path, claimed: float) -> TrialResult:
        name = kind(params)
        self.calls.append(name)
        value = self.confirm[name][self.calls.count(name) - 1]
        cap = CapacityRecord(
            value=value, low=value, high=value * 1.02, unit="req/s", stopped_by="resolution"
        )
        return TrialResult(dict(params), "complete", "rate", (level(value, True),), 0, capacity=cap)

    def gate_run(
        self, baseline: Mapping[str, Any], candidate: Mapping[str, Any], run_dir: Path
    ) -> GateResult:
        self.gate_calls.append((dict(baseline), dict(candidate)))
        assert self.gate is not None, "the gate ran where it should not"
        return self.gate


def study(tmp_path: Path, sc: Scenario, *, allow: bool = True, unmeasured: bool = False) -> Context:
    text = SLA.replace("ALLOW", str(allow).lower()).replace("UNMEASURED", str(unmeasured).lower())
    sla = parse_sla(text)
    study_dir = tmp_path / sla.name
    url = storage_url(study_dir, None)
    st = open_study(sla, url, make_sampler("random", 10, 1, 0), {"engine": "vllm 0.32.0"})
    order = iter([LOSSLESS, LOSSY])
    runner = StudyRunner(
        sla,
        st,
        study_dir,
        suggest=lambda trial: dict(next(order)),
        fixed=FIXED,
        prune=lambda p: None,
        run=sc.search,
        budget=Budget(3),
        say=lambda s: None,
    )
    runner.loop()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "llama"}')
    hw = HardwareProfile("cpu", CpuInfo("unit-cpu", 2, 2, 2**34, 2**33), hostname="unit")
    seqs = ParamSpec("max_num_seqs", "int", choices=(16, 32), default=None)
    kv = ParamSpec("kv_cache_dtype", "categorical", choices=("auto", "fp8"), default="auto")
    source = str(spaces_dir() / "vllm.yaml")  # declares kv_cache_dtype fp8 as lossy
    space = SearchSpace("vllm", "0.32.0", "cpu", [seqs, kv], dict(FIXED), source=source)
    vllm = registry.get("vllm")
    return Context(
        sla, st, study_dir, space, hw, model_dir, "vllm 0.32.0", tmp_path / "py", url, vllm
    )


CONFIRM = {"baseline": [10.0, 10.2, 9.8], "lossless": [20.0, 20.4, 19.6], "lossy": [30.0] * 3}


def passing() -> GateResult:
    return GateResult("pass", "token agreement 99.0%", prompts=16, positions=400)


def test_a_lossy_winner_that_passes_the_gate_is_promoted_and_both_are_shown(
    tmp_path: Path,
) -> None:
    sc = Scenario(CONFIRM, gate=passing())
    ctx = study(tmp_path, sc)
    said: list[str] = []
    manifest = promote(ctx, sc.confirm_run, said.append, gate=sc.gate_run)
    # One interleaved confirmation of both winners and the baseline, 3 replicates each.
    assert sorted(sc.calls) == sorted(["baseline", "lossless", "lossy"] * 3)
    # The gate compares the lossless baseline (engine defaults) with the lossy winner.
    assert sc.gate_calls == [(FIXED, {**FIXED, **LOSSY})]
    assert manifest["promoted"]["params"] == {**FIXED, **LOSSY}
    assert "quality gate pass" in manifest["decision"]["reason"]
    tier = manifest["lossy_tier"]
    assert tier["promoted"] == "lossy"
    assert tier["lossy_settings"] == {"kv_cache_dtype": "fp8"}
    assert tier["lossless"]["label"] == "trial-1" and tier["lossy"]["label"] == "trial-2"
    assert tier["lossless"]["capacity"] == pytest.approx(20.0)
    assert tier["lossy"]["basis"] == "mean of 3 replicates"
    assert tier["gain"] == pytest.approx(0.5)
    assert tier["gain_basis"] == "means of confirmation replicates"
    assert tier["gate"]["verdict"] == "pass"
    md = (ctx.study_dir / "promoted" / "lossy_tier.md").read_text()
    assert "Promoted: **the lossy winner**" in md
    assert "+50.0 % (means of confirmation replicates)" in md
    assert '`kv_cache_dtype="fp8"`' in md
    assert (
        "| lossless | trial-1 | 20 req/s (mean of 3 replicates) "
        "| +100.0 % [+94.0 %, +106.2 %] (better) |"
    ) in md
    # The fallback plan names what to run without fp8 (the CPU engine's fp8 KV cache needs
    # AVX-512 or AMX) with the capacity the study measured for it: the lossless winner.
    plan = (ctx.study_dir / "promoted" / "fallback_plan.md").read_text()
    assert "## 1. trial 1 (no fp8)" in plan
    assert (
        "`kv_cache_dtype=fp8` needs a CPU with avx512f or amx_tile and changes outputs: on a "
        "device without it (or to keep outputs) run fallback 1, trial 1 (no fp8) "
        "(`kv_cache_dtype=auto`): capacity 20 req/s (mean of 3 replicates), -33.3 % (worse) "
        "against the promoted config"
    ) in plan
    assert "## 2. baseline (engine defaults)" in plan
    on_disk = json.loads((ctx.study_dir / "promoted" / "optimization_manifest.json").read_text())
    assert on_disk["lossy_tier"]["promoted"] == "lossy"
    # `autotuner report` and the reprint of a finished study say it too.
    report = render(ctx.study, ctx.study_dir, ctx.engine.roles)
    assert "lossy tier: promoted the lossy winner trial-2" in report
    typed = Manifest.read(ctx.study_dir / "promoted" / "optimization_manifest.json")
    assert any(line.startswith("lossy tier: promoted") for line in rerun.describe(typed, 3))
    assert any(s.startswith("lossy tier: best lossy trial-2") for s in said)


def test_a_gate_that_fails_promotes_the_lossless_winner(tmp_path: Path) -> None:
    failing = GateResult("fail", "token agreement 80.0% < 95.0%", prompts=16, positions=50)
    sc = Scenario(CONFIRM, gate=failing)
    ctx = study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None, gate=sc.gate_run)
    assert manifest["promoted"]["params"] == {**FIXED, **LOSSLESS}
    reason = manifest["decision"]["reason"]
    assert reason.startswith("trial-1 holds +100.0%")
    assert "the lossy winner trial-2 is not promoted: quality gate fail" in reason
    assert manifest["decision"]["effect"] == pytest.approx(1.0, rel=0.02)
    tier = manifest["lossy_tier"]
    assert tier["promoted"] == "lossless" and tier["gate"]["verdict"] == "fail"
    assert tier["why"].startswith("trial-2 holds +200.0% [")
    assert tier["why"].endswith(
        "quality gate fail: token agreement 80.0% < 95.0%; promoted trial-1"
    )
    assert tier["gain"] == pytest.approx(0.5)  # the price of keeping outputs: shown anyway
    # The gated-out lossy winner is no fallback: the plan offers the baseline only.
    plan = (ctx.study_dir / "promoted" / "fallback_plan.md").read_text()
    assert "## 1. baseline (engine defaults)" in plan and "## 2." not in plan
    assert "trial 2" not in plan


@pytest.mark.parametrize("unmeasured", [False, True])
def test_dummy_weights_promote_the_lossy_winner_only_when_the_sla_says_so(
    tmp_path: Path, unmeasured: bool
) -> None:
    sc = Scenario(CONFIRM, gate=GateResult("not_measurable", DUMMY_WEIGHTS))
    ctx = study(tmp_path, sc, unmeasured=unmeasured)
    manifest = promote(ctx, sc.confirm_run, lambda s: None, gate=sc.gate_run)
    tier = manifest["lossy_tier"]
    assert tier["gate"]["reason"] == DUMMY_WEIGHTS
    if unmeasured:
        assert tier["promoted"] == "lossy"
        assert "quality.promote_unmeasured" in manifest["decision"]["reason"]
    else:
        assert tier["promoted"] == "lossless"
        assert manifest["promoted"]["params"] == {**FIXED, **LOSSLESS}
        assert "not measurable on dummy weights" in manifest["decision"]["reason"]
        # Gated out, its measured gain is still said: the effect with its interval.
        assert tier["why"].startswith("trial-2 holds +200.0% [")
        assert tier["why"].endswith(
            f"; not promoted: quality gate not_measurable: {DUMMY_WEIGHTS}; promoted trial-1"
        )
        assert tier["lossy"]["low"] is not None and tier["lossy"]["high"] is not None
        md = (ctx.study_dir / "promoted" / "lossy_tier.md").read_text()
        assert "| lossy | trial-2 | 30 req/s (mean of 3 replicates) | +200.0 % [" in md


def test_without_a_gate_no_lossy_config_is_promoted(tmp_path: Path) -> None:
    sc = Scenario(CONFIRM)
    ctx = study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None)  # no gate given
    assert manifest["lossy_tier"]["promoted"] == "lossless"
    assert "quality gate not run" in manifest["decision"]["reason"]


def test_a_lossy_winner_no_better_than_the_baseline_is_reported_without_a_gate(
    tmp_path: Path,
) -> None:
    confirm = {**CONFIRM, "lossy": [10.1, 10.0, 9.9]}
    sc = Scenario(confirm)  # the gate must not run: no gate result given
    ctx = study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None, gate=sc.gate_run)
    assert sc.gate_calls == []
    assert manifest["promoted"]["params"] == {**FIXED, **LOSSLESS}
    tier = manifest["lossy_tier"]
    assert tier["gate"] is None and "was not promoted by capacity" in tier["why"]
    md = (ctx.study_dir / "promoted" / "lossy_tier.md").read_text()
    assert "**Quality gate**: not run" in md


def test_without_a_measured_baseline_the_gate_compares_with_the_lossless_winner(
    tmp_path: Path,
) -> None:
    failing = GateResult("fail", "token agreement 80.0% < 95.0%", prompts=16, positions=50)
    sc = Scenario(CONFIRM, gate=failing, baseline_fails=True)
    ctx = study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None, gate=sc.gate_run)
    assert sc.gate_calls == [({**FIXED, **LOSSLESS}, {**FIXED, **LOSSY})]
    # Gated out, and no baseline to fall back to: the lossless winner, not nothing.
    assert manifest["promoted"]["params"] == {**FIXED, **LOSSLESS}
    assert manifest["lossy_tier"]["promoted"] == "lossless"


def test_without_allow_lossy_there_is_no_tier(tmp_path: Path) -> None:
    sc = Scenario(CONFIRM)
    ctx = study(tmp_path, sc, allow=False)
    manifest = promote(ctx, sc.confirm_run, lambda s: None, gate=sc.gate_run)
    assert manifest["lossy_tier"] is None
    assert not (ctx.study_dir / "promoted" / "lossy_tier.md").exists()


# --------------------------------------------------------------------------- pure parts


def cand(trial: int, value: float, params: dict[str, Any], **kw: Any) -> Candidate:
    return Candidate(trial, (value,), kw.pop("feasible", True), params=params, **kw)


def lossy_of(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v == "fp8"}


def test_split_keeps_the_best_feasible_of_each_tier() -> None:
    cands = [
        cand(0, 1.0, {}, baseline=True),
        cand(1, 2.0, {"max_num_seqs": 8}),
        cand(2, 5.0, {"kv_cache_dtype": "fp8"}, feasible=False),
        cand(3, 3.0, {"quantization": "fp8"}),
        cand(4, 2.5, {"kv_cache_dtype": "fp8"}),
    ]
    tiers = split(cands, ["maximize"], lossy_of)
    assert tiers.lossless is not None and tiers.lossless.trial == 1
    assert tiers.lossy is not None and tiers.lossy.trial == 3
    only_lossless = split(cands[:2], ["maximize"], lossy_of)
    assert only_lossless.lossy is None


def decision(promoted: str, **comparisons: str) -> Decision:
    cmps = {k: {"verdict": v, "effect": 0.2, "reason": f"{k} {v}"} for k, v in comparisons.items()}
    return Decision(promoted, promoted == "baseline", "why", True, comparisons=cmps)


def test_gate_due_when_the_lossy_winner_is_picked_or_confirmed_better() -> None:
    assert gate_due(decision("trial-2"), "trial-2")
    assert gate_due(decision("trial-1", **{"trial-2": "better"}), "trial-2")
    assert not gate_due(decision("trial-1", **{"trial-2": "no_difference"}), "trial-2")


def test_settle_falls_back_to_the_lossless_winner_only_when_it_was_better() -> None:
    failing = GateResult("fail", "no")
    d = decision("trial-2", **{"trial-1": "better", "trial-2": "better"})
    got = settle(d, lossy_label="trial-2", lossless_label="trial-1", gate=failing,
                 promote_unmeasured=False)  # fmt: skip
    assert got.promoted == "trial-1" and not got.promoted_is_baseline
    d = decision("trial-2", **{"trial-1": "no_difference", "trial-2": "better"})
    got = settle(d, lossy_label="trial-2", lossless_label="trial-1", gate=failing,
                 promote_unmeasured=False)  # fmt: skip
    assert got.promoted == "baseline" and got.promoted_is_baseline
    assert got.reason.startswith("kept the baseline: the lossy winner trial-2 is not promoted")
    untouched = decision("trial-1", **{"trial-1": "better"})
    assert settle(untouched, lossy_label="trial-2", lossless_label="trial-1", gate=None,
                  promote_unmeasured=True) is untouched  # fmt: skip


def test_the_table_names_the_baseline_and_an_effect_without_an_interval() -> None:
    base = TierWinner(label="baseline", trial=0, capacity=22.0, basis="mean of 3 replicates")
    old = TierWinner(label="trial-1", trial=1, verdict="better", effect=0.32)  # older manifest
    md = lossy_tier_md("s", LossyTier(lossless=base, lossy=old, why="w"), "req/s")
    assert "| lossless | baseline | 22 req/s (mean of 3 replicates) | is the baseline |" in md
    assert "| lossy | trial-1 | n/a | +32.0 % (better) |" in md


def test_gain_of_the_lossy_over_the_lossless_winner() -> None:
    assert gain(3.0, 2.0) == pytest.approx(0.5)
    assert gain(None, 2.0) is None and gain(3.0, 0.0) is None
