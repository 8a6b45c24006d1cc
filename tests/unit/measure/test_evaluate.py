"""Evaluation: metric values, constraint margins, goodput."""

from __future__ import annotations

import math

import pytest

from autotuner.measure.evaluate import evaluate, metric_value, request_meets
from autotuner.measure.loadgen import LoadResult, RequestRecord
from autotuner.sla.spec import parse_sla

SLA = """
name: t
model: {synth: tiny-llama}
workload:
  input_tokens: 10
  output_tokens: 5
  arrival: {process: poisson, rate: 1}
  requests: 4
constraints:
  p99_ttft_ms: 100
  p50_tpot_ms: 20
  max_error_rate: 0.0
  min_request_rate: 1.0
  max_gpu_memory_gib: 2
objectives:
  - maximize: goodput
  - minimize: p90_e2e_ms
"""


def rec(
    i: int, ttft: float, tpot: float, out: int = 5, error: str | None = None, gap: float = 0.5
) -> RequestRecord:
    """Request ``i``, sent ``i * gap`` seconds into the run (2 req/s by default)."""
    if error:
        return RequestRecord(i, i * gap, 0.0, out, error=error)
    e2e = ttft + tpot * (out - 1)
    return RequestRecord(
        i, i * gap, 0.0, out, ttft, tuple([tpot] * (out - 1)), e2e, 10, out, None, None
    )


def result(records: list[RequestRecord], duration: float = 2.0, mem: int = 2**30) -> LoadResult:
    return LoadResult({}, tuple(records), duration, 0, {"peak_memory_bytes": mem})


def test_all_constraints_met() -> None:
    sla = parse_sla(SLA)
    r = result([rec(i, 0.05, 0.01) for i in range(4)])
    ev = evaluate(r, sla)
    assert ev.feasible
    assert [v.key for v in ev.verdicts] == [
        "p99_ttft_ms",
        "p50_tpot_ms",
        "max_error_rate",
        "min_request_rate",
        "max_gpu_memory_gib",
    ]
    m = ev.metrics
    assert m["p99_ttft_ms"] == pytest.approx(50.0)
    assert m["request_rate"] == pytest.approx(2.0)
    assert m["output_tokens_per_s"] == pytest.approx(10.0)
    assert m["peak_memory_gib"] == pytest.approx(1.0)
    assert m["goodput"] == pytest.approx(2.0)
    assert ev.objectives == {"goodput": 2.0, "p90_e2e_ms": pytest.approx(90.0)}
    ttft = next(v for v in ev.verdicts if v.key == "p99_ttft_ms")
    assert ttft.margin == pytest.approx(-0.5)


def test_rates_count_over_the_measured_window_not_the_drain() -> None:
    """A sustained level: 20 requests at 1 req/s, each taking 5 s. The run lasts 24 s (the
    last request's decoding after the last arrival), but the engine served 1 req/s."""
    sla = parse_sla(SLA)
    records = [rec(i, 1.0, 1.0, gap=1.0) for i in range(20)]
    r = result(records, duration=19 + 5.0)
    assert metric_value(r, "request_rate", {}) == pytest.approx(1.0)
    assert metric_value(r, "goodput", {}) == pytest.approx(1.0)
    assert metric_value(r, "output_tokens_per_s", {}) == pytest.approx(5.0)
    assert evaluate(r, sla).metrics["goodput"] == 0.0  # every request misses p99 TTFT 100 ms


def test_a_saturated_engine_reads_at_its_service_rate() -> None:
    """Requests offered at 4 req/s, served one every 0.5 s: the served rate is 2 req/s."""
    records = [
        RequestRecord(i, i * 0.25, 0.0, 5, 0.05, (0.01,) * 4, (i + 1) * 0.5 - i * 0.25, 10, 5)
        for i in range(40)
    ]
    r = result(records, duration=20.0)
    assert metric_value(r, "request_rate", {}) == pytest.approx(2.0)


def test_the_served_rate_is_never_above_the_rate_requests_were_sent_at() -> None:
    """Sent at 1 req/s; the first request slow (5 s), the others fast: the ends alone span
    only 18 s for 19 gaps and would read 1.06 req/s."""
    records = [rec(0, 5.0, 0.01, gap=1.0)] + [rec(i, 0.05, 0.01, gap=1.0) for i in range(1, 20)]
    r = result(records, duration=19.1)
    assert metric_value(r, "request_rate", {}) == pytest.approx(1.0)


def test_failures_count_against_the_sla_and_goodput() -> None:
    sla = parse_sla(SLA)
    r = result([rec(0, 0.05, 0.01), rec(1, 0.05, 0.01), rec(2, 0, 0, error="http_500")])
    ev = evaluate(r, sla)
    assert not ev.feasible
    err = next(v for v in ev.verdicts if v.key == "max_error_rate")
    assert err.value == pytest.approx(1 / 3) and not err.met
    assert ev.metrics["goodput"] == pytest.approx(1.0)  # 2 good requests / 2 s


def test_slow_requests_lower_goodput_not_throughput() -> None:
    sla = parse_sla(SLA)
    r = result([rec(0, 0.05, 0.01), rec(1, 0.5, 0.01), rec(2, 0.05, 0.05), rec(3, 0.05, 0.01)])
    ev = evaluate(r, sla)
    assert ev.metrics["request_rate"] == pytest.approx(2.0)
    assert ev.metrics["goodput"] == pytest.approx(1.0)  # one too slow to start, one too slow
    assert not request_meets(r.records[1], sla.latency_slos())
    assert not request_meets(r.records[2], sla.latency_slos())


def test_min_bound_margin_and_unmeasurable_metrics() -> None:
    sla = parse_sla(SLA)
    r = result([rec(0, 0, 0, error="connection")], duration=1.0, mem=0)
    ev = evaluate(r, sla)
    by_key = {v.key: v for v in ev.verdicts}
    assert by_key["min_request_rate"].value == 0.0
    assert by_key["min_request_rate"].margin == pytest.approx(1.0)
    assert by_key["p99_ttft_ms"].value is None
    assert math.isinf(by_key["p99_ttft_ms"].margin) and not by_key["p99_ttft_ms"].met
    assert by_key["max_gpu_memory_gib"].value is None
    d = by_key["p99_ttft_ms"].to_dict()
    assert d["margin"] is None and d["met"] is False


def test_any_percentile_is_a_metric() -> None:
    r = result([rec(i, 0.01 * (i + 1), 0.01) for i in range(100)])
    assert metric_value(r, "p90_ttft_ms", {}) == pytest.approx(
        901.0
    )  # linear interpolation, as numpy
    assert metric_value(r, "p99.9_ttft_ms", {}) == pytest.approx(999.01, rel=1e-6)
    with pytest.raises(KeyError):
        metric_value(r, "speed", {})
