"""Whether the load generator kept to its schedule (autotuner.measure.pacing), on synthetic
records: a client that sends on time, one stalled for a while (every send due during the stall
leaves when it ends), and one that cannot send faster than some rate."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from autotuner.cli.bench import print_report
from autotuner.measure.bench import BenchOutcome
from autotuner.measure.evaluate import evaluate
from autotuner.measure.loadgen import LoadResult, RequestRecord
from autotuner.measure.pacing import LATE_FLOOR_S, describe, pacing, worst_pacing
from autotuner.sla.spec import parse_sla


def run(scheduled: list[float], sent: list[float]) -> LoadResult:
    records = tuple(
        RequestRecord(i, s, max(0.0, s - t), 4, ttft_s=0.05, e2e_s=0.1, output_tokens=4)
        for i, (t, s) in enumerate(zip(scheduled, sent, strict=True))
    )
    return LoadResult({"arrival": {"process": "poisson"}}, records, max(sent) + 0.1)


def every(n: int, rate: float) -> list[float]:
    return [i / rate for i in range(n)]


def test_a_client_on_time_is_not_behind() -> None:
    due = every(40, 64.0)
    p = pacing(run(due, [t + 0.003 for t in due]))
    assert p is not None and p.late == 0 and not p.behind
    # At 64 req/s one inter-arrival (16 ms) is below the floor: the floor is the allowance.
    assert p.allowance_s == pytest.approx(LATE_FLOOR_S)


def test_a_stall_that_delays_the_sends_due_during_it_is_behind() -> None:
    # The client stalls from 0.2 s to 0.5 s: the 19 sends due then all leave at 0.5 s.
    due = every(40, 64.0)
    sent = [0.5 if 0.2 <= t < 0.5 else t for t in due]
    p = pacing(run(due, sent))
    assert p is not None and p.behind
    assert p.late == sum(1 for t in due if 0.2 <= t < 0.45)  # more than 50 ms late
    assert p.max_lag_s == pytest.approx(0.3, abs=0.01)
    assert p.describe() == (
        f"load generator behind: {p.late / 40:.0%} of sends over 50 ms late (worst 0.3 s)"
    )


def test_a_few_late_sends_and_lags_within_one_inter_arrival_are_tolerated() -> None:
    # At 2 req/s the allowance is one inter-arrival, 0.5 s: lags of 0.3 s are not late, and
    # one send of 40 left 2 s late is a blip, not a generator behind.
    due = every(40, 2.0)
    sent = [t + 0.3 for t in due]
    sent[7] = due[7] + 2.0
    p = pacing(run(due, sent))
    assert p is not None and p.allowance_s == pytest.approx(0.5)
    assert (p.late, p.behind) == (1, False)
    # Four late sends of 40 are still within the tolerated share; five are not.
    for late, behind in ((4, False), (5, True)):
        sent = [t + (2.0 if i < late else 0.0) for i, t in enumerate(due)]
        p = pacing(run(due, sent))
        assert p is not None and (p.late, p.behind) == (late, behind)


def test_a_client_that_cannot_send_faster_than_it_does_is_behind() -> None:
    # Scheduled at 64 req/s, sent at 25 req/s (as on 2 CPU cores shared with the engine).
    due = every(40, 64.0)
    p = pacing(run(due, every(40, 25.0)))
    assert p is not None and p.behind and p.late >= 30


def test_the_worst_of_pooled_runs_decides_and_tiny_runs_say_nothing() -> None:
    due = every(40, 64.0)
    on_time = run(due, due)
    late = run(due, every(40, 25.0))
    worst = worst_pacing([on_time, late])
    assert worst is not None and worst.behind
    assert worst_pacing([on_time]) == pacing(on_time)
    assert pacing(run([0.0], [3.0])) is None
    assert worst_pacing([]) is None
    assert describe(31 / 40, 0.05, 1.07) == (
        "load generator behind: 78% of sends over 50 ms late (worst 1.1 s)"
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
