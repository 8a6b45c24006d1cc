"""Whether the load generator kept to its schedule (autotuner.measure.pacing), on synthetic
records: a client that sends on time, one stalled for a while that then catches up, one that
stalls at the end of its level, and one that cannot send faster than some rate."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from autotuner.cli.bench import print_report
from autotuner.measure.bench import BenchOutcome
from autotuner.measure.evaluate import evaluate
from autotuner.measure.loadgen import LoadResult, RequestRecord
from autotuner.measure.pacing import PACE_TOLERANCE, describe, pacing, worst_pacing
from autotuner.sla.spec import parse_sla


def run(scheduled: list[float], sent: list[float]) -> LoadResult:
    records = tuple(
        RequestRecord(i, s, max(0.0, s - t), 4, ttft_s=0.05, e2e_s=0.1, output_tokens=4)
        for i, (t, s) in enumerate(zip(scheduled, sent, strict=True))
    )
    return LoadResult({"arrival": {"process": "poisson"}}, records, max(sent) + 0.1)


def every(n: int, rate: float) -> list[float]:
    return [i / rate for i in range(n)]


def test_a_client_on_time_keeps_the_rate() -> None:
    due = every(40, 64.0)
    p = pacing(run(due, [t + 0.003 for t in due]))
    assert p is not None and p.kept == pytest.approx(1.0) and not p.behind
    assert p.max_lag_s == pytest.approx(0.003)


def test_a_stall_the_client_catches_up_on_keeps_the_rate() -> None:
    # Stalled from 0.2 s to 0.5 s, then sending every request due meanwhile at once: a burst,
    # which makes the level harder to meet, not a lower load.
    due = every(40, 17.0)
    sent = [0.5 if 0.2 <= t < 0.5 else t for t in due]
    p = pacing(run(due, sent))
    assert p is not None and p.kept == pytest.approx(1.0) and not p.behind
    assert p.max_lag_s == pytest.approx(0.5 - min(t for t in due if t >= 0.2))


def test_a_stall_at_the_end_of_the_level_lowers_the_rate_offered() -> None:
    # 40 sends due over 2.29 s; the last ones leave 0.3 s late: 88 % of the rate.
    due = every(40, 17.0)
    sent = [t + (0.3 if t > 2.0 else 0.0) for t in due]
    p = pacing(run(due, sent))
    assert p is not None and p.kept == pytest.approx(due[-1] / (due[-1] + 0.3))
    assert p.behind and p.kept < 1 - PACE_TOLERANCE
    # Within the tolerance it is not behind.
    sent = [t + (0.1 if t > 2.0 else 0.0) for t in due]
    p = pacing(run(due, sent))
    assert p is not None and 1 - PACE_TOLERANCE < p.kept < 1 and not p.behind


def test_a_client_that_cannot_send_faster_than_it_does_is_behind() -> None:
    # Scheduled at 64 req/s, sent at 25 req/s (as on 2 CPU cores shared with the engine).
    due = every(40, 64.0)
    p = pacing(run(due, every(40, 25.0)))
    assert p is not None and p.behind and p.kept == pytest.approx(25 / 64)
    assert p.describe() == (
        "load generator behind: sent at 39% of the scheduled rate (sends up to 0.95 s late)"
    )


def test_the_worst_of_pooled_runs_decides_and_tiny_runs_say_nothing() -> None:
    due = every(40, 64.0)
    on_time = run(due, due)
    late = run(due, every(40, 25.0))
    worst = worst_pacing([on_time, late])
    assert worst is not None and worst.behind
    assert worst_pacing([on_time]) == pacing(on_time)
    assert pacing(run([0.0], [3.0])) is None
    assert pacing(run([0.0, 0.0], [0.0, 0.0])) is None  # sent at once: no rate to keep
    assert worst_pacing([]) is None
    assert describe(0.34, 1.07) == (
        "load generator behind: sent at 34% of the scheduled rate (sends up to 1.1 s late)"
    )


def test_bench_warns_when_its_load_generator_fell_behind(tmp_path: Path) -> None:
    sla = parse_sla(
        "model: {synth: tiny-llama}\nworkload: {input_tokens: 8, output_tokens: 4, "
        "arrival: {process: poisson, rate: 64}, requests: 40}\nconstraints: {p90_ttft_ms: 500}\n"
    )
    due = every(40, 64.0)
    for sent, warned in ((due, False), (every(40, 25.0), True)):
        result = run(due, sent)
        outcome = BenchOutcome(
            "s", {}, (), "0.32.0", 1.0, result, evaluate(result, sla), tmp_path / "log"
        )
        out = io.StringIO()
        print_report(outcome, out)
        assert ("warning: load generator behind: " in out.getvalue()) is warned
