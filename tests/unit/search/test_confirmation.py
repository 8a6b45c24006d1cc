"""Running a confirmation (:mod:`autotuner.search.confirmation`) on a study filled with
synthetic launches (tests/unit/bundle/test_promote.py's), without engines."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotuner.records.trial import CapacityRecord
from autotuner.search.confirmation import _replicate, confirm
from autotuner.search.launched import candidates
from autotuner.search.trial import TrialResult
from tests.unit.bundle.test_promote import VLLM, Scenario, _level, _study


def test_a_front_of_the_baseline_alone_says_it_measured_best(tmp_path: Path) -> None:
    # Candidates met the SLA but the baseline alone is on the front (a single capacity
    # objective, the baseline ahead): the decision must not say no candidate met the SLA.
    sc = Scenario()
    ctx = _study(tmp_path, sc)
    ranked = [c for c in candidates(ctx.study) if c.baseline]
    assert any(c.feasible and not c.baseline for c in candidates(ctx.study))
    decision, reps, _ = confirm(ctx, ranked, sc.confirm_run, lambda s: None)
    assert reps == [] and sc.confirm_calls == []
    assert decision.promoted == "baseline"
    assert "the baseline measured best" in decision.reason
    assert "no candidate met the SLA" not in decision.reason


def test_a_replicate_that_reached_no_met_level_is_unknown_not_a_miss() -> None:
    # Stepping down from its claim, the replicate spent its levels before reaching the SLA's
    # own load: its capacity is unknown (left out of the pairs), not "missed the SLA" (0).
    level = _level(2.2, 2.0, 150.0, 100.0)
    cap = CapacityRecord(value=0.0, low=0.0, high=2.2, unit="req/s", stopped_by="budget")
    res = TrialResult({}, "complete", "rate", (level,), None, capacity=cap)
    assert _replicate("baseline", 0, res, "d", VLLM.roles).capacity is None
    missed = cap.model_copy(update={"stopped_by": "infeasible_at_start"})
    rep = _replicate("baseline", 0, dataclasses.replace(res, capacity=missed), "d", VLLM.roles)
    assert rep.capacity == 0.0 and not rep.feasible
