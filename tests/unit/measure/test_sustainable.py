"""The search below the SLA's own load (autotuner.measure.sustainable): driven by synthetic
margin curves, so each rule is checked without an engine."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from autotuner.measure.sustainable import (
    SUSTAINABLE_LEVELS,
    SustainableSearch,
    relieved_by_less_load,
)
from autotuner.sla.spec import parse_sla

Margin = Callable[[float], float]


def linear(edge: float) -> Margin:
    """A relative margin that crosses zero at ``edge`` (> 0 above it: missed)."""
    return lambda rate: (rate - edge) / edge


def convex(edge: float, saturation: float) -> Margin:
    """A queueing curve: latency ~ 1 / (1 - rate / saturation), at its limit at ``edge``."""

    def latency(rate: float) -> float:
        return 1 / max(1e-6, 1 - rate / saturation)

    return lambda rate: latency(rate) / latency(edge) - 1


def drive(search: SustainableSearch, margin: Margin) -> list[float]:
    """Run ``search`` to its end on ``margin``; the loads it measured."""
    loads = []
    while (rate := search.next_rate()) is not None:
        loads.append(rate)
        m = margin(rate)
        search.record(rate, "meets" if m <= 0 else "misses", m)
        assert len(loads) <= 10, "the search does not end"
    return loads


@pytest.mark.parametrize("curve", [linear(4.4), convex(4.4, 6.0)])
def test_a_config_12_percent_short_is_placed_close_to_its_edge_in_the_budget(
    curve: Margin,
) -> None:
    target = 5.0
    search = SustainableSearch(target, curve(target))
    loads = drive(search, curve)
    got = search.result()
    assert len(loads) <= SUSTAINABLE_LEVELS and got.levels == len(loads)
    assert all(load < target for load in loads)  # never the SLA's own load again
    # Claims only what met (never above the edge) and is no further off than the coarse
    # resolution allows, or the budget left.
    assert 0 < got.value <= 4.4
    assert got.value >= 4.4 / 1.15
    assert got.high is not None and got.value < got.high <= target
    assert got.target == target and got.short == pytest.approx(1 - got.value / target)


def test_it_steps_down_until_a_level_holds_and_says_none_held_when_the_budget_ends() -> None:
    far = linear(0.5)  # holds only at a tenth of the SLA's load
    search = SustainableSearch(5.0, far(5.0), step=1.5, max_levels=3)
    loads = drive(search, far)
    assert loads == pytest.approx([5 / 1.5, 5 / 1.5**2, 5 / 1.5**3])
    got = search.result()
    assert got.value == 0 and got.high is None and got.short is None
    assert got.lowest == pytest.approx(5 / 1.5**3) and got.stopped_by == "budget"
    assert got.replicas() is None
    assert "no load tried below the SLA's 5 req/s (down to 1.48 req/s)" in got.describe()


def test_a_miss_less_load_cannot_fix_ends_the_search() -> None:
    search = SustainableSearch(5.0, 0.3)
    rate = search.next_rate()
    assert rate is not None
    search.record(rate, "misses", 0.1, relieved=False)
    assert search.next_rate() is None
    assert search.result().stopped_by == "not_by_load"


def test_a_miss_as_large_at_less_load_ends_the_search() -> None:
    """Requests that fail at any rate: one level below shows it, no more are spent."""
    search = SustainableSearch(5.0, 0.33)
    loads = drive(search, lambda rate: 0.33)
    assert len(loads) == 1
    got = search.result()
    assert got.value == 0 and got.not_by_load
    assert "the miss does not shrink with the load" in got.describe()


def test_closed_loop_concurrency_stays_on_whole_requests() -> None:
    curve = linear(5.5)
    search = SustainableSearch(8.0, curve(8.0), quantum=1.0, unit="concurrent requests")
    loads = drive(search, curve)
    assert loads and all(load == int(load) and 1 <= load < 8 for load in loads)
    got = search.result()
    assert got.value == 5.0 and got.unit == "concurrent requests"
    assert got.replicas() == 2
    assert got.describe() == (
        "holds the SLA's limits up to 5 concurrent requests; the SLA asks 8: 38% short"
    )


def test_undecided_levels_are_not_measured_again() -> None:
    search = SustainableSearch(5.0, 0.2)
    first = search.next_rate()
    assert first is not None
    search.record(first, "undecided", -0.01)
    assert not search.extending
    assert search.next_rate() != first


SLA = """
name: s
model: {{synth: tiny-llama}}
workload:
  input_tokens: 8
  output_tokens: 4
  arrival: {{process: poisson, rate: 2}}
  requests: 30
constraints: {{{constraints}}}
"""


@pytest.mark.parametrize(
    ("constraints", "verdicts", "relieved"),
    [
        ("p99_tpot_ms: 50, max_error_rate: 0.01", {"p99_tpot_ms": "misses"}, True),
        ("max_error_rate: 0.01", {"max_error_rate": "misses"}, True),
        ("p90_ttft_ms: 100", {"p90_ttft_ms": "meets"}, True),  # not sustained only
        ("p99_tpot_ms: 50, max_gpu_memory_gib: 4", {"max_gpu_memory_gib": "misses"}, False),
        (
            "p99_tpot_ms: 50, max_gpu_memory_gib: 4",
            {"p99_tpot_ms": "misses", "max_gpu_memory_gib": "misses"},
            False,
        ),
        ("p99_tpot_ms: 50, min_goodput: 2", {"min_goodput": "misses"}, False),
        ("p99_tpot_ms: 50", {"p99_tpot_ms": "undecided"}, True),
    ],
)
def test_only_limits_that_less_load_relieves_lead_below(
    constraints: str, verdicts: dict[str, str], relieved: bool
) -> None:
    sla = parse_sla(SLA.format(constraints=constraints))
    assert relieved_by_less_load(sla, verdicts) is relieved  # type: ignore[arg-type]
