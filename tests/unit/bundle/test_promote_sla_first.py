"""Issue 27, the decision rule through promotion and the bundle: a config that met the SLA in
every measurement beats one that missed it in some, and every file of the bundle, `autotuner
report` and the exit code say the same as the decision.

The study and its synthetic launches are test_promote's; here confirmation replicates can stay
undecided at the SLA's own load (capacity 0), as the quick start's baseline did on a busy
2-core machine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from autotuner.bundle.promote import promote
from autotuner.bundle.summary import render
from autotuner.measure.quality import GateResult
from autotuner.records.trial import CapacityRecord
from autotuner.search.confirm import NOTHING_MET
from autotuner.search.trial import Level, TrialResult

from .test_lossy_tier import CONFIRM as LOSSY_CONFIRM
from .test_lossy_tier import Scenario as LossyScenario
from .test_lossy_tier import study as lossy_study
from .test_promote import DEFAULT_SEQS, SLA, Scenario, _read_manifest, _seqs, _study

UNDECIDED = "could not tell whether it meets the SLA at poisson 1 req/s: p99_ttft_ms undecided"


def _chart_notes(svg: str) -> str:
    """The notes under the Pareto chart, their wrapped lines joined."""
    root = ElementTree.fromstring(svg)
    lines = [(t.text or "").strip() for t in root.iter() if t.get("class") == "note"]
    return " ".join(lines)


@dataclass
class Busy(Scenario):
    """Confirmation replicates (0-based, per max_num_seqs) that stay undecided at the SLA's
    own load (1 req/s) after 60 requests: capacity 0, as on a busy machine."""

    undecided: dict[int, set[int]] = field(default_factory=dict)
    behind: bool = False  # the load generator fell behind its schedule there

    def confirm_run(self, params: Mapping[str, Any], run_dir: Path, claimed: float) -> TrialResult:
        seqs = _seqs(params)
        done = sum(1 for p, _, _ in self.confirm_calls if _seqs(p) == seqs)
        if done not in self.undecided.get(seqs, set()):
            return super().confirm_run(params, run_dir, claimed)
        self.confirm_calls.append((dict(params), run_dir, claimed))
        level = Level(
            1.0,
            False,
            {"goodput": 0.9, "p99_ttft_ms": self.limit * 0.97},
            {"p99_ttft_ms": -0.03},  # the point value is under the limit, its bound is not
            {},
            {},
            "level-0.json",
            verdict="undecided",
            verdicts={"p99_ttft_ms": "undecided"},
            requests=60,
            runs=2,
            rate_kept=0.6 if self.behind else 1.0,
            max_lag_s=2.0 if self.behind else 0.0,
            generator_behind=self.behind,
        )
        cap = CapacityRecord(
            value=0.0,
            low=0.0,
            high=1.0,
            unit="req/s",
            stopped_by="undecided",
            note=f"{UNDECIDED} after 60 requests",
        )
        return TrialResult(dict(params), "complete", "rate", (level,), None, capacity=cap)


def test_the_quick_start_on_a_busy_machine_promotes_the_config_that_met_the_sla(
    tmp_path: Path,
) -> None:
    # trial 4 at 3.70 / 3.85 / 3.82 req/s, the baseline at 2.95 then twice undecided at its
    # own load: once "kept the baseline: not enough data ... left out: 2 replicates where only
    # the baseline missed the SLA" and exit 1, beside a fallback plan listing trial 4 at
    # "+285.2 % (better)" and a baseline capacity of "0.98 req/s (mean of 3 replicates)".
    sc = Busy(confirm={32: [3.70, 3.85, 3.82], DEFAULT_SEQS: [2.95, 0.0, 0.0]})
    sc.undecided = {DEFAULT_SEQS: {1, 2}}
    ctx = _study(tmp_path, sc)
    said: list[str] = []
    manifest = promote(ctx, sc.confirm_run, said.append)
    promoted, decision = manifest["promoted"], manifest["decision"]
    assert promoted["label"] == "trial-4" and promoted["meets_sla"] is True  # exit 0
    assert decision["verdict"] == "better" and decision["basis"] == "sla"
    assert decision["reason"].startswith(
        "trial-4 met the SLA at its own load in all 3 replicates, the baseline missed it in 2 of 3"
    )
    # "Undecided after 60 requests" says what would decide it.
    assert f"baseline replicates 2, 3: {UNDECIDED} after 60 requests; " in decision["reason"]
    assert "more requests per level" in decision["reason"]
    assert sum("missed the SLA at its own load (capacity 0)" in s for s in said) == 2
    # Capacities are never averaged with the misses.
    spread = manifest["measurements"]["confirmation"]["spread"]["baseline"]["capacity"]
    assert spread["mean"] == 2.95 and spread["replicates"] == 1 and spread["missed"] == 2
    bundle = ctx.study_dir / "promoted"
    plan = (bundle / "fallback_plan.md").read_text()
    assert "Promoted: **trial 4**" in plan
    assert "2.95 req/s (mean of the 1 of 3 replicates that met the SLA)" in plan
    assert "0.98" not in plan and "(mean of 3 replicates) | 3.79" not in plan
    assert "not compared: decided on the SLA (baseline missed the SLA in 2 of 3 replicates)" in plan
    text = render(ctx.study, ctx.study_dir, ctx.engine.roles)
    assert "confirmed capacity of baseline: 2.95 req/s where it met the SLA (mean of 1 of 3" in text
    assert "promoted: trial-4 (trial 4)" in text
    notes = _chart_notes((bundle / "pareto.svg").read_text())
    assert "does not meet the SLA" not in notes and "not on the front" not in notes
    html = (bundle / "report.html").read_text()
    assert "Serve trial 4: it met the SLA in every measurement, the engine defaults did not." in (
        html
    )
    assert "(mean of 3 replicates)" in html and "No confirmed config meets the SLA" not in html
    assert "confirmed, missed the SLA in 2 of 3 replicates" in html  # the baseline's launch


def test_a_generator_that_fell_behind_asks_for_a_steadier_machine(tmp_path: Path) -> None:
    sc = Busy(confirm={32: [3.70, 3.85, 3.82], DEFAULT_SEQS: [2.95, 0.0, 0.0]}, behind=True)
    sc.undecided = {DEFAULT_SEQS: {1, 2}}
    ctx = _study(tmp_path, sc)
    reason = promote(ctx, sc.confirm_run, lambda s: None)["decision"]["reason"]
    assert "the load generator fell behind its schedule" in reason
    assert "a steadier machine would decide it, more requests would not" in reason


def test_nothing_met_the_sla_is_said_once_and_every_file_agrees(tmp_path: Path) -> None:
    # The candidate missed the SLA in one replicate, the baseline in two: nothing is confirmed
    # to meet the SLA. The baseline stays, promote says so once and names the best measured,
    # and meets_sla false (exit 1), the verdicts, the fallback plan and the chart agree.
    sc = Busy(confirm={32: [3.70, 0.0, 3.82], DEFAULT_SEQS: [2.95, 0.0, 0.0]})
    sc.undecided = {DEFAULT_SEQS: {1, 2}, 32: {1}}
    ctx = _study(tmp_path, sc)
    said: list[str] = []
    manifest = promote(ctx, sc.confirm_run, said.append)
    promoted, decision = manifest["promoted"], manifest["decision"]
    assert promoted["label"] == "baseline" and promoted["meets_sla"] is False  # exit 1
    assert decision["verdict"] == "neither_met" and decision["reason"].count(NOTHING_MET) == 1
    assert "the best measured: trial-4 (met the SLA in 3 of 4 measurements" in decision["reason"]
    assert sum(NOTHING_MET in s for s in said) == 1
    # verdicts.at_sla_load: the replicate that missed, never the search's met margins.
    verdicts = manifest["verdicts"]
    assert verdicts["at_sla_load"] == {"p99_ttft_ms": -0.03}  # the search's was -0.75
    assert verdicts["note"].endswith(
        "from confirmation replicate 2 (confirm/baseline-r1), which missed the SLA at its own "
        "load: p99_ttft_ms undecided; 2 of 3 replicates missed it; meets_sla false"
    )
    bundle = ctx.study_dir / "promoted"
    plan = (bundle / "fallback_plan.md").read_text()
    assert "| capacity | 2.95 req/s (mean of the 1 of 3 replicates that met the SLA) |" in plan
    assert "0.98 req/s" not in plan
    # The rejected candidate is no fallback, and the plan says why.
    assert "## 1. trial 4" not in plan and "## 2. trial 4" not in plan
    assert "(confirmed: " not in plan and "+285" not in plan
    assert "trial 4 is not offered as a fallback: it missed the SLA at its own load in 1 of 3" in (
        plan
    )
    notes = _chart_notes((bundle / "pareto.svg").read_text())
    assert f"the baseline (engine defaults) does not meet the SLA: {NOTHING_MET}" in notes
    assert "not promoted: trial 4 missed the SLA at its own load in 1 of 3" in notes
    on_disk = _read_manifest(ctx.study_dir)
    assert on_disk["promoted"]["meets_sla"] is False and on_disk["verdicts"] == verdicts
    html = (bundle / "report.html").read_text()
    assert "Confirmed capacity 2.95 req/s (mean of the 1 of 3 that met the SLA)" in html
    assert "No confirmed config meets the SLA." in html
    # The page's Pareto chart carries the same notes (each short enough for one line).
    assert "not promoted: trial 4 missed the SLA at its own load in 1 of 3" in html
    text = render(ctx.study, ctx.study_dir, ctx.engine.roles)
    assert "confirmed capacity of baseline: 2.95 req/s where it met the SLA" in text


def test_a_candidate_rejected_for_a_miss_is_no_fallback(tmp_path: Path) -> None:
    # The baseline met the SLA everywhere; trial 4 served twice as much but stayed undecided
    # at its own load once: the baseline stays (it meets the SLA), trial 4 is no fallback.
    sc = Busy(confirm={32: [30.0, 0.0, 31.0], DEFAULT_SEQS: [15.0, 15.5, 14.5]})
    sc.undecided = {32: {1}}
    ctx = _study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None)
    assert manifest["promoted"]["label"] == "baseline" and manifest["promoted"]["meets_sla"]
    assert manifest["decision"]["verdict"] == "worse"
    assert manifest["verdicts"]["at_sla_load"] == {"p99_ttft_ms": -0.75}
    assert manifest["verdicts"]["note"].endswith(
        "from the search launch (trial 0), which met the SLA at its own load: no verdicts "
        "recorded; meets_sla true"
    )
    plan = (ctx.study_dir / "promoted" / "fallback_plan.md").read_text()
    assert "trial 4 (Pareto point)" not in plan and "## 1. trial 4" not in plan
    assert "trial 4 is not offered as a fallback" in plan
    assert "| capacity | 15.00 req/s (mean of 3 replicates) |" in plan


def test_the_chart_says_why_a_gated_out_lossy_point_leads_the_promoted_one(
    tmp_path: Path,
) -> None:
    # The lossy study: fp8 (trial 2) leads the front, the quality gate fails it, the lossless
    # winner (trial 1) is promoted off the front; once unexplained on the chart.
    failing = GateResult("fail", "token agreement 80.0% < 95.0%", prompts=16, positions=50)
    sc = LossyScenario(LOSSY_CONFIRM, gate=failing)
    ctx = lossy_study(tmp_path, sc)
    manifest = promote(ctx, sc.confirm_run, lambda s: None, gate=sc.gate_run)
    assert manifest["promoted"]["trial"] == 1 and 1 not in manifest["pareto_front"]
    notes = _chart_notes((ctx.study_dir / "promoted" / "pareto.svg").read_text())
    assert notes == (
        "promoted: trial 1, not on the front: the points ahead of it have lossy settings, "
        "which only the quality gate admits not promoted: trial 2 (lossy settings; quality "
        "gate fail)"
    )
    assert manifest["pareto_notes"][1].endswith("trial 2 (lossy settings; quality gate fail)")


def test_nothing_feasible_names_the_config_closest_to_the_sla(tmp_path: Path) -> None:
    # Every config misses the p99 TTFT limit of 1 ms at the SLA's own load: nothing to
    # promote, said once, with the measured config that came closest.
    sc = Scenario(limit=1.0)
    ctx = _study(tmp_path, sc)
    said: list[str] = []
    manifest = promote(ctx, sc.confirm_run, said.append)
    assert manifest["promoted"] is None and sc.confirm_calls == []
    (line,) = [s for s in said if "no measured config met the SLA" in s]
    assert "the closest: trial-1, p99_ttft_ms missed by 525% at the SLA's own load" in line


def test_the_chart_says_why_the_promoted_baseline_is_off_the_front(tmp_path: Path) -> None:
    # One objective: the front is trial 4 alone; within the noise, the baseline stays.
    sc = Scenario(confirm={32: [15.2, 15.0, 14.8], DEFAULT_SEQS: [15.0, 15.1, 14.9]})
    one = SLA.replace("[{maximize: goodput}, {minimize: p99_ttft_ms}]", "[{maximize: goodput}]")
    ctx = _study(tmp_path, sc, one)
    manifest = promote(ctx, sc.confirm_run, lambda s: None)
    assert manifest["promoted"]["label"] == "baseline" and manifest["pareto_front"] == [4]
    notes = _chart_notes((ctx.study_dir / "promoted" / "pareto.svg").read_text())
    assert notes == (
        "promoted: the baseline (engine defaults), not on the front: the engine defaults stay "
        "unless a candidate is confirmed better"
    )
    plan = (ctx.study_dir / "promoted" / "fallback_plan.md").read_text()
    assert "(confirmed: no difference)" in plan  # trial 4's capacity, as the decision saw it
    on_disk = json.loads((ctx.study_dir / "promoted" / "optimization_manifest.json").read_text())
    assert on_disk["promoted"]["meets_sla"] and on_disk["verdicts"]["note"].endswith("true")
