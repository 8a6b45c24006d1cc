"""A level too short to show a steady load cannot show the SLA met; a miss in it stands."""

from __future__ import annotations

from autotuner.measure.evaluate import evaluate
from autotuner.measure.levels import judge
from autotuner.measure.loadgen import LoadResult, RequestRecord
from autotuner.measure.span import STEADY_LIFETIMES, shortest_span
from autotuner.sla.spec import parse_sla

from .test_levels import sla


def level(gap_s: float, e2e_s: float, *, n: int = 30, ttft_s: float = 0.02) -> LoadResult:
    """``n`` requests sent ``gap_s`` apart, each taking ``e2e_s``."""
    records = tuple(
        RequestRecord(i, i * gap_s, 0.0, 4, ttft_s=ttft_s, itl_s=(0.01,) * 3, e2e_s=e2e_s,
                      prompt_tokens=8, output_tokens=4)
        for i in range(n)
    )  # fmt: skip
    return LoadResult({"arrival": {"process": "poisson", "rate": 1 / gap_s}}, records, 10.0)


def test_a_burst_that_met_the_sla_is_undecided_and_says_why() -> None:
    s = parse_sla(sla("p90_ttft_ms: 100"))
    burst = level(0.002, 0.25)  # the quick start's 537 req/s: 30 sends in 0.06 s, 0.25 s each
    j = judge(burst, evaluate(burst, s), s, 0.95)
    assert j.verdicts == {"p90_ttft_ms": "meets"} and j.verdict == "undecided"
    assert j.short and j.margin is None and j.span is not None
    assert j.span.describe().startswith("too short for a steady load: sent over 0.058 s")
    # The same requests spread over 15 s: a steady load, met.
    steady = level(0.5, 0.25)
    j = judge(steady, evaluate(steady, s), s, 0.95)
    assert j.verdict == "meets" and not j.short


def test_a_miss_in_a_short_level_stands() -> None:
    s = parse_sla(sla("p90_ttft_ms: 100"))
    slow = level(0.002, 0.25, ttft_s=0.2)
    j = judge(slow, evaluate(slow, s), s, 0.95)
    assert j.verdict == "misses" and not j.short


def test_the_span_needs_two_lifetimes_and_skips_closed_loops() -> None:
    edge = 0.25 * STEADY_LIFETIMES / 29  # 30 sends spanning exactly two lifetimes
    span = shortest_span([level(edge * 1.01, 0.25)])
    assert span is not None and not span.short
    span = shortest_span([level(edge * 0.99, 0.25)])
    assert span is not None and span.short
    closed = level(0.002, 0.25)
    closed = LoadResult({"arrival": {"process": "concurrency"}}, closed.records, 1.0)
    assert shortest_span([closed]) is None
    assert shortest_span([level(0.002, 0.25, n=4)]) is None  # too few to tell
