"""Promotion and the bundle, without engines: a study filled through the study loop with
synthetic launches, then :func:`promote` with a synthetic confirmation run.

The real-engine path is covered by tests/integration/test_tune_real.py; here each branch of
the decision (promote a candidate, keep the baseline, nothing feasible, no baseline measured)
is cheap to reach and the bundle's files are checked for what they say.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from autotuner.bundle.promote import Context, promote
from autotuner.bundle.summary import render
from autotuner.core.hardware import CpuInfo, HardwareProfile
from autotuner.engines import registry
from autotuner.records.manifest import Manifest
from autotuner.records.trial import CapacityRecord
from autotuner.search.launched import candidates
from autotuner.search.study import (
    Budget,
    StudyRunner,
    counted,
    make_sampler,
    open_study,
    storage_url,
)
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import parse_sla
from autotuner.space import ParamSpec, SearchSpace

SLA = """
name: promote-unit
model: {synth: tiny-llama}
target: cpu
workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 1}, requests: 4}
constraints: {p99_ttft_ms: LIMIT}
objectives: [{maximize: goodput}, {minimize: p99_ttft_ms}]
tune: {confirm: {candidates: 1, replicates: REPLICATES, min_effect: 0.05}}
"""
FIXED = {"enforce_eager": True}
ENGINE = "vllm 0.32.0 (cpu)"
VLLM = registry.get("vllm")
# Launch order of the search: baseline, then these candidates (1 is pruned, 128 crashes).
CANDIDATES = [4, 1, 128, 32]
DEFAULT_SEQS = 16  # what the engine uses when max_num_seqs is not set (the baseline)
BUNDLE = {
    "optimization_manifest.json",
    "hardware_profile.csv",
    "latency_breakdown.svg",
    "pareto.svg",
    "pareto.csv",
    "fallback_plan.md",
    "deploy",
    "report.html",  # the study as one page (autotuner/bundle/page.py)
}


def _seqs(params: Mapping[str, Any]) -> int:
    value = params.get("max_num_seqs", DEFAULT_SEQS)
    assert isinstance(value, int)
    return value


def _level(load: float, goodput: float, ttft: float, limit: float, i: int = 0) -> Level:
    margin = (ttft - limit) / limit
    metrics: dict[str, float | None] = {
        "goodput": goodput,
        "request_rate": goodput,
        "p50_ttft_ms": ttft / 2,
        "p90_ttft_ms": ttft * 0.9,
        "p99_ttft_ms": ttft,
        "p99_tpot_ms": 5.0,
        "p99_e2e_ms": ttft + 20.0,
        "peak_memory_gib": 1.0,
    }
    engine = {"mean_queue_ms": 1.0, "mean_prefill_ms": ttft / 4, "mean_decode_ms": 15.0}
    return Level(load, margin <= 0, metrics, {"p99_ttft_ms": margin}, {}, engine, f"level-{i}.json")


@dataclass
class Scenario:
    """A synthetic study: search results per ``max_num_seqs`` and confirmation goodputs."""

    limit: float = 100.0  # the SLA's p99 TTFT limit (ms)
    baseline_fails: bool = False
    top_of_32: float = 4.0  # the highest load 32 seqs sustains in the search (the others: 1)
    replicates: int = 3  # tune.confirm.replicates
    # confirmation: capacity per replicate and whether it met the SLA, per max_num_seqs
    confirm: dict[int, list[float]] = field(default_factory=dict)
    confirm_misses: set[int] = field(default_factory=set)
    confirm_calls: list[tuple[dict[str, Any], Path, float]] = field(default_factory=list)

    def search(self, params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
        """One search launch: goodput grows with max_num_seqs, and so does TTFT."""
        trial_dir.mkdir(parents=True, exist_ok=True)
        seqs = _seqs(params)
        if seqs == 128 or (self.baseline_fails and "max_num_seqs" not in params):
            result = TrialResult(
                dict(params), "failed", "rate", reason="no memory", cause="out_of_memory"
            )
        else:
            # The highest load the config sustains: 4 req/s for 32 seqs, 1 for the others.
            top = self.top_of_32 if seqs >= 32 else 1.0
            levels: tuple[Level, ...] = (
                _level(1.0, float(seqs) / 4, 100.0 * seqs / 64, self.limit, 0),
            )
            if levels[0].feasible:  # a config that misses the SLA's own load stops there
                levels += (
                    _level(top * 1.5, float(seqs), 10 * self.limit, self.limit, 1),
                    _level(top, float(seqs), 100.0 * seqs / 64, self.limit, 2),
                )
            ok = [i for i, lv in enumerate(levels) if lv.feasible]
            best = max(ok, key=lambda i: levels[i].load) if ok else None
            reason = None if levels[0].feasible else "misses the SLA"
            status = "complete" if reason is None else "stopped_early"
            result = TrialResult(dict(params), status, "rate", levels, best, reason=reason)
        result.write(trial_dir / "trial.json")  # as run_trial does
        return result

    def confirm_run(self, params: Mapping[str, Any], run_dir: Path, claimed: float) -> TrialResult:
        """One confirmation launch, a capacity search around ``claimed``: this config's next
        capacity from its list (goodput at capacity the same); 0 when it misses the SLA."""
        self.confirm_calls.append((dict(params), run_dir, claimed))
        seqs = _seqs(params)
        done = sum(1 for p, _, _ in self.confirm_calls if _seqs(p) == seqs)
        value = self.confirm[seqs][done - 1]
        miss = seqs in self.confirm_misses
        ttft = 10 * self.limit if miss else self.limit / 2
        level = _level(claimed if miss else value, value, ttft, self.limit)
        cap = CapacityRecord(
            value=0.0 if miss else value,
            low=0.0 if miss else value,
            high=claimed if miss else value * 1.02,
            unit="req/s",
            stopped_by="infeasible_at_start" if miss else "resolution",
        )
        best = None if miss else 0
        return TrialResult(dict(params), "complete", "rate", (level,), best, capacity=cap)


def _hardware() -> HardwareProfile:
    return HardwareProfile("cpu", CpuInfo("unit-cpu", 2, 2, 2**34, 2**33), hostname="unit")


def _space() -> SearchSpace:
    seqs = ParamSpec("max_num_seqs", "int", choices=(1, 4, 32, 128), default=None)
    return SearchSpace("vllm", "0.32.0", "cpu", [seqs], dict(FIXED), source="unit")


def _study(tmp_path: Path, sc: Scenario, sla_text: str = SLA, budget: int = 4) -> Context:
    """Run the study loop over the synthetic launches; return promotion's context."""
    text = sla_text.replace("LIMIT", str(sc.limit)).replace("REPLICATES", str(sc.replicates))
    sla = parse_sla(text)
    study_dir = tmp_path / sla.name
    url = storage_url(study_dir, None)
    study = open_study(sla, url, make_sampler("random", 10, 2, 0), {"engine": ENGINE})
    order = iter(CANDIDATES)
    runner = StudyRunner(
        sla,
        study,
        study_dir,
        suggest=lambda trial: {"max_num_seqs": next(order)},
        fixed=FIXED,
        prune=lambda p: "too few sequences" if p.get("max_num_seqs") == 1 else None,
        run=sc.search,
        # 4: baseline + 4 + 128 (crashed) + 32; the pruned one is not counted
        budget=Budget(budget),
        say=lambda s: None,
    )
    runner.loop()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "llama"}')
    py = tmp_path / "python"
    return Context(sla, study, study_dir, _space(), _hardware(), model_dir, ENGINE, py, url, VLLM)


def _read_manifest(study_dir: Path) -> dict[str, Any]:
    data = json.loads((study_dir / "promoted" / "optimization_manifest.json").read_text())
    assert isinstance(data, dict)
    return data


def test_a_confirmed_win_promotes_the_candidate_and_writes_the_bundle(tmp_path: Path) -> None:
    sc = Scenario(confirm={32: [30.0, 31.0, 29.0], DEFAULT_SEQS: [15.0, 15.5, 14.5]})
    ctx = _study(tmp_path, sc)
    said: list[str] = []
    manifest = promote(ctx, sc.confirm_run, said.append)

    # Confirmation: the top candidate (trial 4, 32 seqs) and the baseline, 3 replicates each,
    # interleaved, each a capacity search around its own search capacity (4 and 1 req/s).
    assert [_seqs(p) for p, _, _ in sc.confirm_calls] == [32, 16, 16, 32, 32, 16]
    assert [load for _, _, load in sc.confirm_calls] == pytest.approx(
        [4.0, 1.0, 1.0, 4.0, 4.0, 1.0]
    )
    dirs = [d.relative_to(ctx.study_dir).as_posix() for _, d, _ in sc.confirm_calls]
    assert dirs[:2] == ["confirm/trial-4-r0", "confirm/baseline-r0"]

    promoted = manifest["promoted"]
    assert promoted["label"] == "trial-4" and promoted["trial"] == 4
    assert not promoted["is_baseline"] and promoted["meets_sla"] is True
    assert promoted["params"] == {**FIXED, "max_num_seqs": 32}
    assert promoted["tuned_params"] == {"max_num_seqs": 32}
    assert promoted["serve_argv"][-2:] == ["--max-num-seqs", "32"]
    assert "--enforce-eager" in promoted["serve_argv"]
    decision = manifest["decision"]
    assert decision["promoted"] == "trial-4" and not decision["promoted_is_baseline"]
    assert decision["effect"] == pytest.approx(30.0 / 15.0 - 1)
    assert decision["basis"] == "capacity" and decision["verdict"] == "better"
    assert decision["effect_low"] < 1.0 < decision["effect_high"] and decision["confirmed"]
    assert decision["reason"].startswith("trial-4 holds +100.0%")
    assert any("promoted trial-4" in s for s in said)

    # What the file says is what promote returned; measurements and provenance are there.
    on_disk = _read_manifest(ctx.study_dir)
    assert on_disk["promoted"] == promoted
    # ... and it reads back through the typed record every reader uses.
    typed = Manifest.read(ctx.study_dir / "promoted" / "optimization_manifest.json")
    assert typed.promoted is not None and typed.promoted.params == promoted["params"]
    search = on_disk["measurements"]["search"]
    assert search["trial"] == 4 and search["max_load_meeting_sla"] == 4.0
    assert search["capacity"]["value"] == 4.0  # the search's single run (legacy-derived here)
    conf = on_disk["measurements"]["confirmation"]
    # The load trial-4 met the SLA at in every replicate (the lowest low edge), for re-checks.
    assert conf["load"] == pytest.approx(29.0) and conf["load_unit"] == "req/s"
    assert len(conf["replicates"]) == 6
    assert conf["spread"]["trial-4"]["goodput"]["mean"] == pytest.approx(30.0)
    assert conf["spread"]["trial-4"]["capacity"]["mean"] == pytest.approx(30.0)
    assert [r["capacity"] for r in conf["replicates"] if r["config"] == "baseline"] == [
        15.0,
        15.5,
        14.5,
    ]
    assert conf["spread"]["baseline"]["goodput"]["replicates"] == 3
    assert on_disk["verdicts"]["at_sla_load"] == {"p99_ttft_ms": pytest.approx(-0.5)}
    assert on_disk["pareto_front"][0] == 4
    assert on_disk["provenance"]["engine_version"] == ENGINE
    assert on_disk["provenance"]["search_space"]["hash"] == ctx.space.hash()
    assert on_disk["provenance"]["study"]["trials"] == [0, 1, 2, 3, 4]
    decisions = on_disk["decisions"]
    assert [(d["trial"], d["reason"]) for d in decisions["pruned"]] == [(2, "too few sequences")]
    assert [(d["trial"], d["cause"]) for d in decisions["failed"]] == [(3, "out_of_memory")]

    bundle = ctx.study_dir / "promoted"
    assert {p.name for p in bundle.iterdir()} == BUNDLE
    rows = list(csv.DictReader(io.StringIO((bundle / "hardware_profile.csv").read_text())))
    assert [(r["device"], r["name"], r["hostname"]) for r in rows] == [("cpu", "unit-cpu", "unit")]
    svg = (bundle / "latency_breakdown.svg").read_text()
    assert ElementTree.fromstring(svg).tag.endswith("svg")  # well-formed
    assert "promoted (trial 4)" in svg and "baseline (trial 0)" in svg and "prefill" in svg
    plan = (bundle / "fallback_plan.md").read_text()
    assert "Promoted: **trial 4**" in plan
    assert "baseline (engine defaults)" in plan  # the baseline is a fallback
    assert "trial-4 holds +100.0%" in plan  # the decision's reason, under Notes
    # Confirmed figures where they exist, marked; the rest marked as single runs.
    assert "| capacity | 30.00 req/s (mean of 3 replicates) |" in plan
    assert "| p99 TTFT | 50.0 ms (single run) |" in plan
    assert "-50.0 % [-51.5, -48.5] (confirmed: lower)" in plan  # the baseline's capacity
    serve = bundle / "deploy" / "serve.sh"
    assert serve.stat().st_mode & 0o111 and "--max-num-seqs 32" in serve.read_text()
    assert "--max-num-seqs" in (bundle / "deploy" / "docker-run.sh").read_text()
    assert "--max-num-seqs" in (bundle / "deploy" / "k8s.yaml").read_text()
    assert not (ctx.study_dir / "no_promotion.json").exists()
    # The study remembers the promotion: `autotuner report` shows it.
    text = render(ctx.study, ctx.study_dir, VLLM.roles)
    assert "promoted: trial-4 (trial 4)" in text
    assert '"max_num_seqs": 32' in text


def test_a_win_within_the_noise_keeps_the_baseline(tmp_path: Path) -> None:
    sc = Scenario(confirm={32: [15.2, 15.0, 14.8], DEFAULT_SEQS: [15.0, 15.1, 14.9]})
    ctx = _study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None)
    promoted = manifest["promoted"]
    assert promoted["label"] == "baseline" and promoted["trial"] == 0
    assert promoted["is_baseline"] and promoted["meets_sla"] is True
    assert promoted["params"] == FIXED and promoted["tuned_params"] == {}
    assert "--max-num-seqs" not in promoted["serve_argv"]
    assert manifest["decision"]["reason"].startswith("kept the baseline")
    assert _read_manifest(ctx.study_dir)["promoted"]["label"] == "baseline"
    bundle = ctx.study_dir / "promoted"
    assert {p.name for p in bundle.iterdir()} == BUNDLE
    plan = (bundle / "fallback_plan.md").read_text()
    assert "Promoted: **baseline (engine defaults)**" in plan
    assert "trial 4 (Pareto point)" in plan  # the unconfirmed candidate is a fallback
    assert "--max-num-seqs" not in (bundle / "deploy" / "serve.sh").read_text()
    assert "promoted: baseline (trial 0)" in render(ctx.study, ctx.study_dir, VLLM.roles)


def test_a_second_promotion_replaces_the_bundle_whole(tmp_path: Path) -> None:
    sc = Scenario(confirm={32: [30.0, 31.0, 29.0] * 2, DEFAULT_SEQS: [15.0, 15.1, 14.9] * 2})
    ctx = _study(tmp_path, sc)
    promote(ctx, sc.confirm_run, lambda s: None)
    stale = ctx.study_dir / "promoted" / "stale.txt"
    stale.write_text("from the previous bundle")
    promote(ctx, sc.confirm_run, lambda s: None)
    assert {p.name for p in (ctx.study_dir / "promoted").iterdir()} == BUNDLE
    leftovers = [p.name for p in ctx.study_dir.iterdir() if p.name.startswith(".promoted")]
    assert leftovers == [] and not (ctx.study_dir / "promoted.old").exists()


def test_nothing_feasible_promotes_nothing_and_confirms_nothing(tmp_path: Path) -> None:
    sc = Scenario(limit=1.0)  # every config's p99 TTFT is above 1 ms
    ctx = _study(tmp_path, sc)
    said: list[str] = []
    manifest = promote(ctx, sc.confirm_run, said.append)
    assert manifest["promoted"] is None
    reason = manifest["decision"]["reason"]
    assert reason.startswith("no measured config met the SLA; the closest: trial-1, ")
    assert sc.confirm_calls == []
    assert not (ctx.study_dir / "promoted").exists()
    saved = json.loads((ctx.study_dir / "no_promotion.json").read_text())
    assert saved["promoted"] is None and saved["pareto_front"] == []
    assert {d["trial"] for d in saved["decisions"]["infeasible"]} == {0, 1, 4}
    assert any("nothing to promote" in s for s in said)
    assert f"no promotion: {reason}" in render(ctx.study, ctx.study_dir, VLLM.roles)


def test_baseline_that_failed_to_start_promotes_the_best_ranked_candidate(tmp_path: Path) -> None:
    sc = Scenario(baseline_fails=True, confirm={32: [30.0, 31.0, 29.0]})
    ctx = _study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None)
    assert [_seqs(p) for p, _, _ in sc.confirm_calls] == [32, 32, 32]  # no baseline to compare
    # No baseline: the lead is compared at its own highest sustained load.
    assert [load for _, _, load in sc.confirm_calls] == pytest.approx([4.0] * len(sc.confirm_calls))
    assert manifest["promoted"]["label"] == "trial-4" and manifest["promoted"]["meets_sla"]
    assert "baseline could not be measured" in manifest["decision"]["reason"]
    assert manifest["decision"]["effect"] is None
    assert {p.name for p in (ctx.study_dir / "promoted").iterdir()} == BUNDLE


def test_kept_baseline_that_misses_the_sla_is_not_reported_as_meeting_it(tmp_path: Path) -> None:
    # p99 TTFT limit 20 ms: only 4 seqs (6 ms) meets it in the search; the baseline (16 seqs,
    # 25 ms) and 32 seqs (50 ms) miss it. 4 seqs then misses the SLA in confirmation, so the
    # baseline is kept: the safe choice, but it must not read as meeting the SLA.
    sc = Scenario(
        limit=20.0,
        confirm={4: [5.0, 5.0, 5.0], DEFAULT_SEQS: [4.0, 4.0, 4.0]},
        confirm_misses={4},
    )
    ctx = _study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None)
    assert sorted(_seqs(p) for p, _, _ in sc.confirm_calls) == [4, 4, 4, 16, 16, 16]
    assert [load for _, _, load in sc.confirm_calls] == pytest.approx([1.0] * len(sc.confirm_calls))
    promoted = manifest["promoted"]
    assert promoted["label"] == "baseline" and promoted["meets_sla"] is False
    assert manifest["pareto_front"] == [1]
    reason = manifest["decision"]["reason"]
    assert "trial-1 missed the SLA at its own load in 3 of 3 replicates" in reason
    assert "the baseline itself misses the SLA" in reason
    assert _read_manifest(ctx.study_dir)["promoted"]["meets_sla"] is False


def test_no_candidate_ahead_by_more_than_the_resolution_spends_no_launch(tmp_path: Path) -> None:
    # 32 seqs holds 1.02 req/s in the search, the baseline 1: a 2 % lead, inside the 3 %
    # resolution of one capacity search. Nothing is launched and the decision says why.
    sc = Scenario(top_of_32=1.02)
    ctx = _study(tmp_path, sc)
    said: list[str] = []
    manifest = promote(ctx, sc.confirm_run, said.append)
    assert sc.confirm_calls == []
    decision = manifest["decision"]
    assert decision["promoted"] == "baseline" and decision["confirmed"] is False
    assert decision["reason"].startswith("kept the baseline, no launch spent: no confirmation:")
    assert "more than the resolution 3%" in decision["reason"] and "+2.0%" in decision["reason"]
    assert manifest["measurements"]["confirmation"]["replicates"] == []
    plan = (ctx.study_dir / "promoted" / "fallback_plan.md").read_text()
    assert "no confirmation launch was run: every figure is a single run" in plan
    assert "(mean of" not in plan and "| capacity | 1.00 req/s (single run) |" in plan
    # The 2 % lead is inside the resolution: no "SLA violated above" trigger claims it.
    assert "violated above" not in plan
    text = render(ctx.study, ctx.study_dir, VLLM.roles)
    assert "confirmation: none run (no launch spent)" in text


def test_a_study_of_the_baseline_alone_says_so(tmp_path: Path) -> None:
    # A budget of one launch (a reference measurement of one config): nothing else was tried,
    # so "no candidate met the SLA" would misread as candidates that failed.
    sc = Scenario()
    ctx = _study(tmp_path, sc, budget=1)
    assert [c.baseline for c in candidates(ctx.study)] == [True]
    manifest = promote(ctx, sc.confirm_run, lambda s: None)
    assert sc.confirm_calls == [] and manifest["promoted"]["label"] == "baseline"
    reason = manifest["decision"]["reason"]
    assert reason.endswith("no launch spent: no confirmation: only the baseline was launched")


def test_one_replicate_cannot_confirm_so_none_is_launched(tmp_path: Path) -> None:
    sc = Scenario(replicates=1)
    ctx = _study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None)
    assert sc.confirm_calls == []
    reason = manifest["decision"]["reason"]
    assert manifest["promoted"]["label"] == "baseline" and "no launch spent" in reason
    assert "tune.confirm.replicates 1" in reason and "at least 2" in reason
    # The unconfirmed lead is a fallback whose figures are marked as single runs.
    plan = (ctx.study_dir / "promoted" / "fallback_plan.md").read_text()
    assert "(single runs of the search, not confirmed)" in plan


def test_one_replicate_promotes_a_candidate_over_a_baseline_that_misses_the_sla(
    tmp_path: Path,
) -> None:
    # p99 TTFT limit 20 ms: the baseline (25 ms) misses its own load, 4 seqs (6 ms) meets it.
    sc = Scenario(limit=20.0, replicates=1)
    ctx = _study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None)
    assert sc.confirm_calls == []
    assert manifest["promoted"]["label"] == "trial-1" and manifest["promoted"]["meets_sla"]
    assert "without confirmation" in manifest["decision"]["reason"]


def test_a_baseline_that_missed_only_memory_is_not_launched_again(tmp_path: Path) -> None:
    # The H200's defaults (gmu 0.92: 132 GiB against 130) met every latency limit and missed
    # memory, which no load changes: confirmation launches only the candidate.
    sc = Scenario(confirm={32: [30.0, 31.0, 29.0]})  # no entry for the baseline's 16 seqs
    measure = sc.search

    def search(params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
        res = measure(params, trial_dir)
        if "max_num_seqs" in params or res.status == "failed":
            return res
        verdicts = {"p99_ttft_ms": "meets", "max_gpu_memory_gib": "misses"}
        level = dataclasses.replace(
            res.levels[0], feasible=False, verdict="misses", verdicts=verdicts
        )
        out = dataclasses.replace(
            res, status="stopped_early", levels=(level,), best=None, reason="misses memory"
        )
        out.write(trial_dir / "trial.json")
        return out

    sc.search = search  # type: ignore[method-assign]
    with_memory = SLA.replace("{p99_ttft_ms: LIMIT}", "{p99_ttft_ms: LIMIT, max_gpu_memory_gib: 8}")
    ctx = _study(tmp_path, sc, with_memory)
    said: list[str] = []
    manifest = promote(ctx, sc.confirm_run, said.append)
    assert [_seqs(p) for p, _, _ in sc.confirm_calls] == [32, 32, 32]
    assert any("baseline not launched again" in s and "max_gpu_memory_gib" in s for s in said)
    decision = manifest["decision"]
    assert decision["promoted"] == "trial-4" and decision["confirmed"]
    assert decision["verdict"] == "better"
    # The GPU account counts the launches made, not the baseline's replicates known without one
    # (their shared "trial-0 (search)" once read as one more, untimed launch).
    searched = sum(counted(t) for t in ctx.study.get_trials(deepcopy=False))
    assert manifest["gpu_minutes"]["launches"] == searched + len(sc.confirm_calls)


class _Cut(Exception):
    """Stands for the tuner being stopped (Ctrl-C or SIGTERM) during a launch."""


def _writing(sc: Scenario, cut_at: int | None = None) -> Any:
    """``sc.confirm_run`` writing ``trial.json`` at the end of a launch, as run_trial does;
    the ``cut_at``-th launch is stopped before it ends (nothing written)."""
    calls = {"n": 0}

    def run(params: Mapping[str, Any], run_dir: Path, claimed: float) -> TrialResult:
        calls["n"] += 1
        if calls["n"] == cut_at:
            raise _Cut
        result = sc.confirm_run(params, run_dir, claimed)
        run_dir.mkdir(parents=True, exist_ok=True)
        result.write(run_dir / "trial.json")
        return result

    return run


def test_an_interrupted_confirmation_resumes_without_repeating_its_finished_replicates(
    tmp_path: Path,
) -> None:
    sc = Scenario(confirm={32: [30.0, 31.0, 29.0], DEFAULT_SEQS: [15.0, 15.5, 14.5]})
    ctx = _study(tmp_path, sc)
    with pytest.raises(_Cut):
        promote(ctx, _writing(sc, cut_at=3), lambda s: None)
    assert len(sc.confirm_calls) == 2  # trial-4 r0 and baseline r0 ended; the third was cut

    said: list[str] = []
    manifest = promote(ctx, _writing(sc), said.append)
    # Only the four replicates not finished before were launched, in the plan's order.
    runs = [d.relative_to(ctx.study_dir).as_posix() for _, d, _ in sc.confirm_calls[2:]]
    assert runs == [
        f"confirm/{n}" for n in ("baseline-r1", "trial-4-r1", "trial-4-r2", "baseline-r2")
    ]
    assert any("resuming the interrupted confirmation" in s for s in said)
    assert "confirmation 1/6: trial-4, replicate 1: measured before" in said
    conf = manifest["measurements"]["confirmation"]
    assert [r["capacity"] for r in conf["replicates"] if r["config"] == "trial-4"] == [
        30.0,
        31.0,
        29.0,
    ]
    assert manifest["decision"]["promoted"] == "trial-4"
    plan = json.loads((ctx.study_dir / "confirm" / "plan.json").read_text())
    assert plan["finished"] is True and plan["replicates"] == 3

    # A finished confirmation is not resumed: deciding again measures every replicate anew.
    sc.confirm = {32: [30.0, 31.0, 29.0] * 2, DEFAULT_SEQS: [15.0, 15.5, 14.5] * 2}
    promote(ctx, _writing(sc), lambda s: None)
    assert len(sc.confirm_calls) == 6 + 6


def test_a_changed_plan_or_a_damaged_replicate_is_measured_again(tmp_path: Path) -> None:
    sc = Scenario(confirm={32: [30.0] * 9, DEFAULT_SEQS: [15.0] * 9})
    ctx = _study(tmp_path, sc)
    with pytest.raises(_Cut):
        promote(ctx, _writing(sc, cut_at=3), lambda s: None)
    (ctx.study_dir / "confirm" / "baseline-r0" / "trial.json").write_text("{not json")
    promote(ctx, _writing(sc), lambda s: None)
    runs = [d.name for _, d, _ in sc.confirm_calls[2:]]
    assert runs == ["baseline-r0", "baseline-r1", "trial-4-r1", "trial-4-r2", "baseline-r2"]

    # Another plan (here: another claim to search around) starts afresh, dropping the old
    # files.
    with pytest.raises(_Cut):
        promote(ctx, _writing(sc, cut_at=2), lambda s: None)
    plan = ctx.study_dir / "confirm" / "plan.json"
    data = json.loads(plan.read_text())
    data["configs"]["baseline"]["around"] = 2.0
    plan.write_text(json.dumps(data))
    before = len(sc.confirm_calls)
    promote(ctx, _writing(sc), lambda s: None)
    assert len(sc.confirm_calls) - before == 6


def test_a_finished_confirmation_is_extended_by_more_replicates_not_measured_again(
    tmp_path: Path,
) -> None:
    # The H200 lossy run: 2 replicates measured +30 % and +42 %, which 1 degree of freedom
    # cannot tell from noise; a third replicate, not six new launches, settles it.
    sc = Scenario(replicates=2, confirm={32: [28.7, 31.3, 30.0], DEFAULT_SEQS: [22.0, 22.0, 22.2]})
    ctx = _study(tmp_path, sc)
    first = promote(ctx, _writing(sc), lambda s: None)
    assert first["decision"]["verdict"] == "not_enough_data"
    assert first["decision"]["promoted"] == "baseline"
    assert len(sc.confirm_calls) == 4

    three = dataclasses.replace(
        ctx, sla=parse_sla(SLA.replace("LIMIT", "100").replace("REPLICATES", "3"))
    )
    with pytest.raises(_Cut):  # the extension is itself interrupted after one launch
        promote(three, _writing(sc, cut_at=2), lambda s: None)
    said: list[str] = []
    manifest = promote(three, _writing(sc), said.append)
    assert "extending the confirmation of 2 replicates to 3" not in " ".join(said)
    assert any("resuming the interrupted confirmation" in s for s in said)
    runs = [d.relative_to(ctx.study_dir).as_posix() for _, d, _ in sc.confirm_calls[4:]]
    assert runs == ["confirm/trial-4-r2", "confirm/baseline-r2"]
    caps = [
        (r["config"], r["replicate"], r["capacity"])
        for r in manifest["measurements"]["confirmation"]["replicates"]
    ]
    assert sorted(caps) == sorted(
        [("trial-4", i, v) for i, v in enumerate([28.7, 31.3, 30.0])]
        + [("baseline", i, v) for i, v in enumerate([22.0, 22.0, 22.2])]
    )
    assert manifest["decision"]["verdict"] == "better"
    assert manifest["decision"]["promoted"] == "trial-4"
    assert manifest["decision"]["effect_low"] > 0.2


def test_an_extension_says_so_and_launches_only_the_added_replicates(tmp_path: Path) -> None:
    sc = Scenario(replicates=2, confirm={32: [30.0, 31.0, 29.0] * 2, DEFAULT_SEQS: [15.0] * 5})
    ctx = _study(tmp_path, sc)
    promote(ctx, _writing(sc), lambda s: None)
    three = dataclasses.replace(
        ctx, sla=parse_sla(SLA.replace("LIMIT", "100").replace("REPLICATES", "3"))
    )
    said: list[str] = []
    promote(three, _writing(sc), said.append)
    assert (
        "extending the confirmation of 2 replicates to 3: the replicates it finished are kept"
        in said
    )
    assert "confirmation 1/6: trial-4, replicate 1: measured before" in said
    assert [d.name for _, d, _ in sc.confirm_calls[4:]] == ["trial-4-r2", "baseline-r2"]
    # Fewer replicates than the finished plan: a new confirmation, measured anew.
    promote(ctx, _writing(sc), lambda s: None)
    assert len(sc.confirm_calls) == 4 + 2 + 4
