"""The answer when nothing met the SLA: the closest config, by how much it missed which limit,
the load it does hold, and the replicas plan for the SLA's load; said by promotion, kept in
no_promotion.json, shown by `autotuner report` and the study page."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotuner.bundle import page
from autotuner.bundle.nothing_met import Missed, answer, replicas
from autotuner.bundle.promote import promote
from autotuner.bundle.summary import render
from autotuner.records.trial import CapacityRecord, SustainableRecord
from autotuner.search.trial import TrialResult
from tests.unit.bundle.test_promote import VLLM, Scenario, _seqs, _study


def held(value: float, target: float = 5.0, unit: str = "req/s") -> SustainableRecord:
    high = None if value <= 0 else min(target, value * 1.1)
    return SustainableRecord(
        value=value, high=high, target=target, unit=unit, lowest=target / 3.375, levels=3
    )


def test_the_closest_config_is_named_with_its_miss_its_load_and_the_replicas_plan() -> None:
    launches = [
        Missed("baseline", {"p99_tpot_ms": 0.12, "p99_ttft_ms": -0.4}, held(4.3), 1),
        Missed("trial-2", {"p99_tpot_ms": 0.8}, held(2.0), 1),
    ]
    said = answer(launches)
    assert said == (
        "; the closest: baseline, p99_tpot_ms missed by 12% at the SLA's own load; it holds "
        "the SLA's limits up to 4.3 req/s; the SLA asks 5: 14% short; the SLA's 5 req/s would "
        "take 2 data-parallel copies of baseline, 2 GPUs in all: a plan from the load one copy "
        "held, not a measurement (no layout of that many copies was launched)"
    )


def test_the_plan_takes_the_config_needing_the_fewest_devices_not_the_closest() -> None:
    # The closest holds 3 of 5 req/s on 2 GPUs (2 copies: 4 GPUs); trial-7 holds 2.6 on
    # one GPU (2 copies: 2 GPUs).
    launches = [
        Missed("trial-3", {"p99_tpot_ms": 0.05}, held(3.0), 2),
        Missed("trial-7", {"p99_tpot_ms": 0.3}, held(2.6), 1),
        Missed("trial-9", {"p99_tpot_ms": 0.4}, held(0.0), 1),
    ]
    plan = replicas(launches)
    assert plan is not None and plan.config.label == "trial-7"
    assert (plan.copies, plan.devices) == (2, 2)
    said = answer(launches, "engine rank")
    assert "the closest: trial-3, p99_tpot_ms missed by 5%" in said
    assert "2 data-parallel copies of trial-7 (holds up to 2.6 req/s on 1 engine rank)" in said
    assert "2 engine ranks in all: a plan from the load one copy held, not a measurement" in said


def test_ties_in_devices_go_to_the_config_that_holds_more() -> None:
    launches = [
        Missed("a", {"k": 0.1}, held(2.6), 1),
        Missed("b", {"k": 0.2}, held(4.0), 1),
    ]
    plan = replicas(launches)
    assert plan is not None and plan.config.label == "b"


def test_without_a_sustainable_load_there_is_no_plan_and_no_claim() -> None:
    launches = [
        Missed("baseline", {"max_gpu_memory_gib": 0.2}, None, 1),
        Missed("trial-1", {"p99_tpot_ms": 0.5}, held(0.0), 1),
    ]
    assert replicas(launches) is None
    said = answer(launches)
    assert said == "; the closest: baseline, max_gpu_memory_gib missed by 20% at the SLA's own load"
    assert answer([]) == ""


@dataclass
class ShortScenario(Scenario):
    """Every config misses the SLA's own load (1 req/s); each held a share of it below."""

    held_by_seqs: Mapping[int, float] = dataclasses.field(
        default_factory=lambda: {4: 0.3, 16: 0.45, 32: 0.6}
    )

    def search(self, params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
        result = super().search(params, trial_dir)
        if result.status != "stopped_early":
            return result
        load = self.held_by_seqs[_seqs(params)]
        cap = CapacityRecord(
            value=0.0,
            low=0.0,
            high=1.0,
            unit="req/s",
            stopped_by="infeasible_at_start",
            note="misses the SLA at poisson 1 req/s (p99_ttft_ms)",
            sustainable=held(load, target=1.0),
        )
        result = dataclasses.replace(result, capacity=cap)
        result.write(trial_dir / "trial.json")
        return result


def test_promotion_report_and_page_give_the_answer(tmp_path: Path) -> None:
    sc = ShortScenario(limit=1.0)
    ctx = _study(tmp_path, sc)
    said: list[str] = []
    manifest = promote(ctx, sc.confirm_run, said.append)
    assert manifest["promoted"] is None and sc.confirm_calls == []
    reason = manifest["decision"]["reason"]
    # trial-1 (4 seqs) is closest to the TTFT limit; trial-4 (32 seqs) holds the most per
    # engine rank: 2 copies of it carry the SLA's 1 req/s.
    assert "the closest: trial-1, p99_ttft_ms missed by 525% at the SLA's own load" in reason
    assert "it holds the SLA's limits up to 0.3 req/s; the SLA asks 1: 70% short" in reason
    assert "would take 2 data-parallel copies of trial-4 (holds up to 0.6 req/s" in reason
    assert "not a measurement" in reason
    answer_part = reason.removeprefix("no measured config met the SLA")
    assert any(answer_part in line and "nothing to promote" in line for line in said)
    report = render(ctx.study, ctx.study_dir, VLLM.roles)
    assert f"no promotion: {reason}" in report
    assert "below the SLA's load: trial 4 holds the SLA's limits up to 0.6 req/s" in report
    assert "holds 0.6" in report  # the bracket column
    built = page.build(ctx.study, ctx.study_dir)
    row = next(x for x in built.launches if x.number == 4)
    assert row.capacity_text == "0" and row.bracket_text == "holds 0.6 req/s (40% short)"
    html = page.render(built)
    assert "holds 0.6 req/s (40% short)" in html and "not a measurement" in html
