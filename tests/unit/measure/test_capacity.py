"""The capacity search of one launch, against synthetic margin curves (no engine)."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable

import pytest

from autotuner.measure.capacity import Capacity, CapacitySearch
from autotuner.measure.quantile import Outcome

Curve = Callable[[float], float]  # rate -> worst relative SLA margin (> 0: violated)


def linear(cap: float) -> Curve:
    return lambda r: (r - cap) / cap


def queueing(cap: float) -> Curve:
    """p99 TTFT of a queue, T0 / (1 - r / R), against a limit 3 x T0: convex, blows up at R."""
    saturation = cap / (1 - 1 / 3)
    return lambda r: (1 / (1 - r / saturation)) / 3 - 1 if r < saturation else 10.0


def concave(cap: float) -> Curve:
    return lambda r: math.sqrt(r / cap) - 1


def cliff(cap: float) -> Curve:
    """Smooth below capacity, a jump above it (KV-cache preemption)."""
    return lambda r: 0.5 * (r - cap) / cap - 0.02 if r <= cap else 0.5 + (r - cap) / cap


def step(cap: float) -> Curve:
    """Margins that say nothing but the side: the worst case for interpolation."""
    return lambda r: -0.5 if r <= cap else 1.0


def drive(search: CapacitySearch, curve: Curve) -> Capacity:
    while (rate := search.next_rate()) is not None:
        margin = curve(rate)
        search.record(rate, "meets" if margin <= 0 else "misses", margin)
    return search.result()


def refinement_levels(result: Capacity) -> int:
    """Levels after the first miss (the bracketing phase ends there)."""
    first_miss = next(i for i, lv in enumerate(result.levels) if lv.verdict == "misses")
    return len(result.levels) - first_miss - 1


CAPACITIES = [10.5 * 1.1**i for i in range(22)]  # 10.5 .. 78 req/s, from a start of 10


@pytest.mark.parametrize(
    ("shape", "max_refine"),
    [(linear, 2), (queueing, 3), (concave, 3), (cliff, 4), (step, 6)],
    ids=["linear<=2", "queueing<=3", "concave<=3", "cliff<=4", "step<=6"],
)
def test_reaches_the_true_capacity_within_the_resolution_in_few_levels(
    shape: Callable[[float], Curve], max_refine: int
) -> None:
    refine = []
    for cap in CAPACITIES:
        result = drive(CapacitySearch(10.0, max_levels=20), shape(cap))
        assert result.stopped_by == "resolution", cap
        assert result.high is not None
        assert result.low <= cap <= result.high, cap
        assert result.width is not None and result.width <= 0.03 + 1e-12
        assert result.low <= result.value <= result.high
        refine.append(refinement_levels(result))
        # bracketing: 10, 15, 22.5, ... until the first miss, at most log1.5(78/10) + 2 levels
        assert len(result.levels) - refine[-1] <= 7
    assert max(refine) <= max_refine, refine


def test_interpolation_beats_bisection_on_smooth_curves() -> None:
    """Plain bisection needs 4 levels from a 1.5x bracket to 3 %; margins do better."""
    for shape in (linear, queueing, concave):
        levels = [refinement_levels(drive(CapacitySearch(10.0), shape(c))) for c in CAPACITIES]
        assert sum(levels) / len(levels) < 2.5, (shape.__name__, levels)


def test_value_lands_near_the_crossing_on_a_linear_curve() -> None:
    result = drive(CapacitySearch(15.0), linear(22.0))
    assert result.estimate == pytest.approx(22.0, rel=1e-9)  # both estimates are exact here
    assert result.value == result.low  # claimed: only what was shown (issue 28)
    assert [round(lv.rate, 2) for lv in result.levels][:2] == [15.0, 22.5]
    assert len(result.levels) <= 4  # 15 meets, 22.5 misses, then at most two more
    best = result.best_level
    assert best is not None and result.levels[best].rate == result.low


def test_budget_spent_while_growing_reports_an_open_bracket() -> None:
    result = drive(CapacitySearch(10.0, max_levels=3), linear(50.0))
    assert result.stopped_by == "budget"
    assert [lv.rate for lv in result.levels] == [10.0, 15.0, 22.5]
    assert (result.value, result.low, result.high, result.width) == (22.5, 22.5, None, None)


def test_budget_spent_while_refining_reports_the_bracket() -> None:
    result = drive(CapacitySearch(10.0, max_levels=5), step(27.0))
    assert result.stopped_by == "budget"
    assert len(result.levels) == 5
    assert result.high is not None and result.low <= 27.0 <= result.high
    assert result.width is not None and result.width > 0.03


def test_infeasible_first_level_gives_zero_capacity() -> None:
    search = CapacitySearch(10.0)
    result = drive(search, linear(7.0))
    assert result.stopped_by == "infeasible_at_start"
    assert (result.value, result.low, result.high) == (0.0, 0.0, 10.0)
    assert len(result.levels) == 1 and result.best_level is None
    with pytest.raises(ValueError, match="over"):
        search.record(5.0, "meets", -0.1)


def test_shrinks_below_the_start_when_allowed() -> None:
    result = drive(CapacitySearch(10.0, min_rate=2.0), linear(5.0))
    assert result.stopped_by == "resolution"
    assert [round(lv.rate, 2) for lv in result.levels][:3] == [10.0, 6.67, 4.44]
    assert result.high is not None and result.low <= 5.0 <= result.high


def test_shrinking_to_the_floor_without_a_meet_is_infeasible() -> None:
    result = drive(CapacitySearch(10.0, min_rate=2.0), linear(1.0))
    assert result.stopped_by == "infeasible"
    assert result.levels[-1].rate == 2.0
    assert (result.value, result.high) == (0.0, 2.0)


def test_undecided_level_is_measured_again_then_counts_as_a_miss() -> None:
    search = CapacitySearch(10.0)
    search.record(10.0, "meets", -0.4)
    assert search.next_rate() == 15.0
    search.record(15.0, "undecided", 0.01)
    assert search.extending and search.next_rate() == 15.0
    search.record(15.0, "undecided", -0.01)
    assert not search.extending
    assert search.levels[-1].repeat
    result = search.result()
    assert (result.low, result.high) == (10.0, 15.0)  # still undecided: the bracket's top
    assert search.next_rate() is not None and 10.0 < search.next_rate() < 15.0  # type: ignore[operator]


def test_undecided_resolved_by_the_re_measure() -> None:
    search = CapacitySearch(10.0)
    search.record(10.0, "meets", -0.4)
    search.record(15.0, "undecided", 0.0)
    search.record(15.0, "meets", -0.05)
    assert search.result().low == 15.0
    assert search.next_rate() == 22.5


def test_undecided_at_the_start_says_undecided_not_infeasible() -> None:
    search = CapacitySearch(10.0)
    search.record(10.0, "undecided", 0.02)
    search.record(10.0, "undecided", 0.01)
    result = search.result()
    assert search.done and result.stopped_by == "undecided" and result.value == 0.0


def test_no_re_measure_when_disabled_or_when_the_budget_is_spent() -> None:
    search = CapacitySearch(10.0, remeasure_undecided=0)
    search.record(10.0, "meets", -0.4)
    search.record(15.0, "undecided", 0.0)
    assert not search.extending and search.result().high == 15.0
    last = CapacitySearch(10.0, max_levels=2)
    last.record(10.0, "meets", -0.4)
    last.record(15.0, "undecided", 0.0)
    assert last.done and last.result().stopped_by == "budget" and last.result().high == 15.0


def test_integer_concurrency_closes_on_adjacent_values() -> None:
    result = drive(CapacitySearch(4.0, quantum=1.0, unit="concurrent"), linear(13.4))
    assert result.stopped_by == "resolution"
    assert (result.low, result.high) == (13.0, 14.0)
    assert all(lv.rate == int(lv.rate) for lv in result.levels)
    assert result.unit == "concurrent"


def test_max_rate_caps_the_growth() -> None:
    result = drive(CapacitySearch(10.0, max_rate=20.0), linear(100.0))
    assert result.stopped_by == "max_rate"
    assert [lv.rate for lv in result.levels] == [10.0, 15.0, 20.0]
    assert (result.low, result.high) == (20.0, None)


def test_around_confirms_a_claim_that_holds_in_three_levels() -> None:
    for truth in (19.7, 20.0, 20.3):
        result = drive(CapacitySearch.around(20.0), linear(truth))
        assert result.stopped_by == "resolution", truth
        assert len(result.levels) <= 3, [lv.rate for lv in result.levels]
        assert result.high is not None and result.low <= truth <= result.high


def test_around_a_claim_that_does_not_hold_widens_its_step_down() -> None:
    # 33 % above the truth: the levels go down by x1.06, x1.12, x1.26 and bracket it in four.
    result = drive(CapacitySearch.around(20.0, max_levels=4), linear(15.0))
    first = 20 / 1.03
    expected = [first, first / 1.06, first / 1.06**3, first / 1.06**7]
    assert [lv.rate for lv in result.levels] == pytest.approx(expected)
    assert result.stopped_by == "budget" and result.high is not None
    assert 0 < result.low <= 15.0 <= result.high
    wider = drive(CapacitySearch.around(20.0, max_levels=10), linear(15.0))
    assert wider.stopped_by == "resolution"
    assert wider.high is not None and wider.low <= 15.0 <= wider.high
    # Far below the claim, four levels are not enough: capacity unknown, budget named.
    far = drive(CapacitySearch.around(20.0, max_levels=4), linear(8.0))
    assert far.stopped_by == "budget" and far.value == 0.0
    # However many misses, the step never grows past x1.5.
    deep = drive(CapacitySearch.around(20.0, max_levels=12), linear(0.5))
    rates = [lv.rate for lv in deep.levels]
    assert all(b >= a / 1.5 * (1 - 1e-9) for a, b in itertools.pairwise(rates))
    assert rates[-1] == pytest.approx(rates[-2] / 1.5)


def test_around_a_claim_far_below_the_truth_widens_its_step_up() -> None:
    # The claim 27 % under the truth (a CPU replicate's baseline: 4 meets, "at least 1.98"):
    # the levels go up by x1.06, x1.12, x1.26 and bracket it in four.
    result = drive(CapacitySearch.around(20.0, max_levels=4), linear(25.4))
    first = 20 / 1.03
    expected = [first, first * 1.06, first * 1.06**3, first * 1.06**7]
    assert [lv.rate for lv in result.levels] == pytest.approx(expected)
    assert result.stopped_by == "budget" and result.high is not None
    assert result.low <= 25.4 <= result.high
    # However many meets, the step never grows past x1.5; the main search's stays fixed.
    high = drive(CapacitySearch.around(20.0, max_levels=8), linear(500.0))
    rates = [lv.rate for lv in high.levels]
    assert all(b <= a * 1.5 * (1 + 1e-9) for a, b in itertools.pairwise(rates))
    assert rates[-1] == pytest.approx(rates[-2] * 1.5)
    plain = drive(CapacitySearch(10.0, max_levels=4), linear(500.0))
    assert [lv.rate for lv in plain.levels] == pytest.approx([10.0, 15.0, 22.5, 33.75])


def test_the_main_search_shrinks_by_a_fixed_step() -> None:
    result = drive(CapacitySearch(10.0, min_rate=1.0, max_levels=4), linear(3.0))
    assert [lv.rate for lv in result.levels][:3] == pytest.approx([10.0, 10 / 1.5, 10 / 2.25])


def test_missing_margins_fall_back_to_bisection() -> None:
    search = CapacitySearch(10.0)
    search.record(10.0, "meets", None)
    search.record(15.0, "misses", None)
    assert search.next_rate() == pytest.approx(math.sqrt(150.0))
    search.record(12.0, "misses", None)
    search.record(11.0, "meets", None)
    result = search.result()
    assert result.estimate == pytest.approx(math.sqrt(11.0 * 12.0))
    assert result.value == 11.0  # the highest level shown to meet the SLA


def test_the_latest_measurement_wins_over_a_contradicted_one() -> None:
    search = CapacitySearch(10.0)
    search.record(10.0, "meets", -0.3)
    search.record(15.0, "misses", 0.2)
    search.record(16.0, "meets", -0.01)  # a rate outside the bracket, measured anyway
    result = search.result()
    assert (result.low, result.high) == (16.0, None)
    assert search.next_rate() == 24.0


def test_next_rate_is_idempotent_and_result_says_incomplete_midway() -> None:
    search = CapacitySearch(10.0)
    assert search.next_rate() == search.next_rate() == 10.0
    search.record(10.0, "meets", -0.5)
    assert search.result().stopped_by == "incomplete"


def test_to_dict_is_json() -> None:
    result = drive(CapacitySearch(10.0), linear(12.0))
    d = json.loads(json.dumps(result.to_dict()))
    assert set(d) == {"value", "low", "high", "unit", "levels", "stopped_by", "estimate"}
    assert d["unit"] == "req/s" and d["levels"][0]["rate"] == 10.0


def test_random_verdicts_always_terminate_with_a_consistent_bracket() -> None:
    rng = random.Random(11)
    outcomes: list[Outcome] = ["meets", "misses", "undecided"]
    for _ in range(300):
        search = CapacitySearch(
            rng.uniform(1, 50), max_levels=rng.randint(1, 10), min_rate=rng.choice([None, 0.5])
        )
        count = 0
        while (rate := search.next_rate()) is not None:
            lo, hi = search.result().low, search.result().high
            assert rate > 0
            if lo > 0 and hi is not None and not search.extending:
                assert lo < rate < hi
            margin = rng.choice([None, rng.uniform(-1, 1)])
            search.record(rate, rng.choice(outcomes), margin)
            count += 1
        result = search.result()
        assert count <= search.max_levels
        assert result.stopped_by != "incomplete"
        if result.high is not None:
            assert result.low < result.high
            assert result.low <= result.value <= result.high


@pytest.mark.parametrize(
    "kwargs",
    [
        {"start_rate": 0.0},
        {"start_rate": float("nan")},
        {"start_rate": 1.0, "resolution": 0.0},
        {"start_rate": 1.0, "step": 1.0},
        {"start_rate": 1.0, "max_levels": 0},
        {"start_rate": 1.0, "min_rate": 2.0},
        {"start_rate": 1.0, "max_rate": 0.5},
        {"start_rate": 1.0, "quantum": 0.0},
    ],
)
def test_bad_settings_raise(kwargs: dict[str, float]) -> None:
    start = kwargs.pop("start_rate")
    with pytest.raises(ValueError):
        CapacitySearch(start, **kwargs)  # type: ignore[arg-type]


def test_bad_records_raise() -> None:
    search = CapacitySearch(10.0)
    with pytest.raises(ValueError, match="NaN"):
        search.record(10.0, "meets", float("nan"))
    with pytest.raises(ValueError, match="verdict"):
        search.record(10.0, "maybe", 0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rate"):
        search.record(-1.0, "meets", 0.0)


def test_the_capacity_is_the_highest_met_level_with_the_bracket_above() -> None:
    """Issue 28: a search stopped by its budget with a wide bracket claims only the highest
    level that met the SLA (2.38, not an interpolated 2.95); the bracket is the uncertainty."""
    search = CapacitySearch(2.38, max_levels=2)
    search.record(2.38, "meets", -0.4)
    search.record(3.57, "misses", 0.2)
    result = search.result()
    assert result.stopped_by == "budget"
    assert (result.value, result.low, result.high) == (2.38, 2.38, 3.57)
    assert result.estimate is not None and 2.38 < result.estimate < 3.57
    for shape in (linear, queueing, concave):
        for c in CAPACITIES:
            r = drive(CapacitySearch(10.0), shape(c))
            met = [lv.rate for lv in r.levels if lv.verdict == "meets"]
            assert r.value == max(met) == r.low


def test_the_record_keeps_the_claim_and_its_bracket_not_the_estimate() -> None:
    result = drive(CapacitySearch(10.0, max_levels=5), step(27.0))
    record = result.to_record("the level budget was spent", 0.03)
    assert (record.value, record.low, record.high) == (result.value, result.low, result.high)
    assert (record.unit, record.stopped_by) == (result.unit, "budget")
    assert record.note == "the level budget was spent" and record.resolution == 0.03
    assert "estimate" not in record.model_dump()
