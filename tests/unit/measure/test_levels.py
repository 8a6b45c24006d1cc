"""Level sizing, per-level verdicts and the search margin (autotuner.measure.levels), and the
warning `autotuner check` gives when levels cannot resolve the SLA's percentile."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotuner.cli.check import check_main
from autotuner.measure.evaluate import evaluate, served_rate
from autotuner.measure.levels import judge, level_size, pooled, resolution_notes
from autotuner.measure.loadgen import LoadResult, RequestRecord
from autotuner.sla.spec import parse_sla

BASE = """
model: {{synth: tiny-llama}}
workload:
  input_tokens: 8
  output_tokens: 4
  arrival: {{process: poisson, rate: 2}}
  {size}
constraints: {{{constraints}}}
tune: {{{tune}}}
"""


def sla(constraints: str, size: str = "requests: 30", tune: str = "") -> str:
    return BASE.format(constraints=constraints, size=size, tune=tune)


def result(ttfts_ms: list[float], errors: int = 0) -> LoadResult:
    records = [
        RequestRecord(i, i / 10, 0.0, 4, ttft_s=t / 1000, itl_s=(0.01,) * 3,
                      e2e_s=t / 1000 + 0.03, prompt_tokens=8, output_tokens=4)
        for i, t in enumerate(ttfts_ms)
    ]  # fmt: skip
    records += [
        RequestRecord(len(records) + i, 0.0, 0.0, 4, error="timeout") for i in range(errors)
    ]
    return LoadResult({}, tuple(records), 10.0)


def test_levels_grow_to_the_requests_the_highest_percentile_needs() -> None:
    s = level_size(parse_sla(sla("p99_ttft_ms: 500, p90_tpot_ms: 50")))
    assert (s.requests, s.needed, s.hardest, s.resolves) == (299, 299, "p99_ttft_ms", True)
    # p90 at 95 % needs 29: 30 requests are enough, and are kept as they are.
    s = level_size(parse_sla(sla("p90_ttft_ms: 500")))
    assert (s.requests, s.needed) == (30, 29)
    # A lower confidence needs fewer.
    assert level_size(parse_sla(sla("p99_ttft_ms: 500", tune="confidence: 0.9"))).needed == 230
    # No percentile (means, error rate, p100): nothing to grow for.
    s = level_size(parse_sla(sla("min_goodput: 1, p100_ttft_ms: 900, max_error_rate: 0")))
    assert (s.requests, s.needed, s.hardest) == (30, 0, None)
    # More requests than needed, and than the cap: the workload's count stands.
    assert level_size(parse_sla(sla("p90_ttft_ms: 5", size="requests: 900"))).requests == 900


def test_a_cap_below_the_need_is_a_warning() -> None:
    text = sla("p99_ttft_ms: 500", tune="max_requests_per_level: 100")
    s = level_size(parse_sla(text))
    assert (s.requests, s.capped, s.resolves) == (100, True, False)
    warnings, notes = resolution_notes(parse_sla(text))
    assert len(warnings) == 1 and notes == []
    assert "p99_ttft_ms at 95% confidence needs 299 requests per load level" in warnings[0]
    assert "levels send 100" in warnings[0] and "undecided" in warnings[0]
    # Uncapped, the same SLA only gets a note that its levels grow.
    warnings, notes = resolution_notes(parse_sla(sla("p99_ttft_ms: 500")))
    assert warnings == [] and notes == [
        "p99_ttft_ms at 95% confidence needs 299 requests per load level: levels send 299 "
        "instead of workload.requests 30"
    ]


def test_a_duration_too_short_for_the_percentile_is_a_warning() -> None:
    warnings, _ = resolution_notes(parse_sla(sla("p99_ttft_ms: 500", size="duration_s: 60")))
    assert len(warnings) == 1 and "duration_s 60 at 2 req/s sends about 120" in warnings[0]
    warnings, _ = resolution_notes(parse_sla(sla("p90_ttft_ms: 500", size="duration_s: 60")))
    assert warnings == []


def test_check_warns_on_stderr_and_notes_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capped = tmp_path / "capped.yaml"
    capped.write_text(sla("p99_ttft_ms: 500", tune="max_requests_per_level: 100"))
    assert check_main([str(capped)]) == 0  # valid: a warning, not an error
    out, err = capsys.readouterr()
    assert out.startswith(f"OK {capped}\n")
    assert f"{capped}: warning: p99_ttft_ms at 95% confidence needs 299" in err
    grown = tmp_path / "grown.yaml"
    grown.write_text(sla("p99_ttft_ms: 500", tune="confirm: {replicates: 1}"))
    assert check_main([str(grown)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and f"{grown}: note: p99_ttft_ms at 95% confidence needs 299" in out
    assert "tune.confirm.replicates 1" in out
    two = tmp_path / "two.yaml"
    two.write_text(sla("p99_ttft_ms: 500", tune="confirm: {replicates: 2}"))
    assert check_main([str(two)]) == 0
    out, err = capsys.readouterr()
    assert f"{two}: warning: tune.confirm.replicates 2: the 95% interval" in err


def test_percentile_verdicts_need_the_interval_clear_of_the_limit() -> None:
    s = parse_sla(sla("p90_ttft_ms: 100"))
    # 30 requests, p90 at 95 %: meets needs every request under the limit (the max is the bound).
    under = result([50.0] * 29 + [99.0])
    j = judge(under, evaluate(under, s), s, 0.95)
    assert j.verdicts == {"p90_ttft_ms": "meets"} and j.verdict == "meets"
    assert j.margin == pytest.approx((99.0 - 100) / 100)  # the bound's margin, not the p90's
    one_over = result([50.0] * 29 + [150.0])  # the point p90 is 50 ms, far inside the limit
    j = judge(one_over, evaluate(one_over, s), s, 0.95)
    assert j.verdict == "undecided" and j.margin == pytest.approx(0.5)
    many_over = result([50.0] * 20 + [150.0] * 10)
    assert judge(many_over, evaluate(many_over, s), s, 0.95).verdict == "misses"


def test_point_constraints_and_an_error_limit_of_zero() -> None:
    s = parse_sla(sla("p90_ttft_ms: 100, max_error_rate: 0, min_goodput: 2"))
    ok = result([50.0] * 30)
    j = judge(ok, evaluate(ok, s), s, 0.95)
    assert j.verdicts == {
        "p90_ttft_ms": "meets",
        "max_error_rate": "meets",
        "min_goodput": "meets",
    }
    # The met error limit of 0 (margin exactly 0) must not pin the search margin to 0: the
    # largest informative margin is the p90 bound's (50 ms against 100).
    assert j.margin == pytest.approx(-0.5)
    failing = result([50.0] * 30, errors=2)
    j = judge(failing, evaluate(failing, s), s, 0.95)
    assert j.verdicts["max_error_rate"] == "misses" and j.verdict == "misses" and j.margin > 0


def test_a_level_without_successful_requests_misses() -> None:
    s = parse_sla(sla("p90_ttft_ms: 100"))
    dead = result([], errors=30)
    j = judge(dead, evaluate(dead, s), s, 0.95)
    assert j.verdict == "misses" and j.margin is None


def test_pooled_runs_add_requests_and_durations() -> None:
    a, b = result([10.0] * 3), result([20.0] * 2, errors=1)
    both = pooled(a, b)
    assert len(both.records) == 6 and both.duration_s == 20.0
    assert [r.ttft_s for r in both.records[:3]] == [0.01] * 3


def test_a_met_memory_limit_does_not_set_the_search_margin() -> None:
    # Measured on an H200: peak memory 124.9 GiB against 130 (margin -4 %) at every rate, p99
    # TPOT far inside its limit. Memory's margin as the largest made the search probe just
    # above the low edge (16 req/s) for a crossing near 20.
    s = parse_sla(sla("p90_ttft_ms: 100, max_gpu_memory_gib: 130"))
    ok = result([50.0] * 30)
    ok = LoadResult(ok.plan, ok.records, ok.duration_s, 0, {"peak_memory_bytes": 124.9 * 2**30})
    j = judge(ok, evaluate(ok, s), s, 0.95)
    assert j.verdicts["max_gpu_memory_gib"] == "meets"
    assert j.margin == pytest.approx(-0.5)  # the p90 bound's, not memory's -0.039
    over = LoadResult(ok.plan, ok.records, ok.duration_s, 0, {"peak_memory_bytes": 132 * 2**30})
    j = judge(over, evaluate(over, s), s, 0.95)
    assert j.verdict == "misses" and j.margin == pytest.approx(2 / 130)


def paced(rate: float, served: float, n: int = 40) -> LoadResult:
    """``n`` requests sent every 1/rate s to a FIFO engine that takes up one every
    1/served s: TTFT far inside a loose limit whether the engine keeps up or not."""
    records, free = [], 0.0
    for i in range(n):
        sent = i / rate
        start = max(free, sent)
        free = start + 1 / served
        records.append(
            RequestRecord(i, sent, 0.0, 4, ttft_s=start - sent + 0.05, itl_s=(0.01,) * 3,
                          e2e_s=start - sent + 0.08, prompt_tokens=8, output_tokens=4)
        )  # fmt: skip
    plan = {"arrival": {"process": "poisson", "rate": rate}}
    return LoadResult(plan, tuple(records), free)


def test_a_level_the_engine_did_not_sustain_misses_whatever_its_limits_say() -> None:
    s = parse_sla(sla("p90_ttft_ms: 3000"))
    kept_up = paced(10.0, 20.0)
    j = judge(kept_up, evaluate(kept_up, s), s, 0.95)
    assert j.verdict == "meets" and j.sustained is not None and j.sustained.ok
    assert j.margin == pytest.approx((50.0 - 3000) / 3000)  # the sustained ratio adds nothing
    behind = paced(17.1, 8.0)
    j = judge(behind, evaluate(behind, s), s, 0.95)
    assert j.verdicts == {"p90_ttft_ms": "meets"}  # the limit alone would have met
    assert j.verdict == "misses" and j.sustained is not None and not j.sustained.ok
    assert j.sustained.served_rate == pytest.approx(8.0, rel=0.05)
    # The shortfall is the search margin: > 0, so the capacity lies below this rate.
    assert j.margin == pytest.approx(j.sustained.margin) and j.margin > 0


def test_an_engine_falling_behind_sets_the_margin_before_the_level_misses() -> None:
    # Served 85 % of what was sent: still sustained (>= 80 %), but the TTFT margin against a
    # loose limit (-98 %) says nothing of how close the edge is; the served ratio's does.
    s = parse_sla(sla("p90_ttft_ms: 3000"))
    near = paced(10.0, 8.5, n=60)
    j = judge(near, evaluate(near, s), s, 0.95)
    assert j.verdict == "meets" and j.sustained is not None and j.sustained.ok
    assert 0.8 <= j.sustained.ratio < 0.9
    assert j.margin == pytest.approx(j.sustained.margin) and -0.125 < j.margin < 0
    # Well below the edge (served 97 % of sent) the ratio's margin would be a constant -21 %
    # that hides the latency margins: it does not count.
    far = paced(10.0, 9.7, n=60)
    j = judge(far, evaluate(far, s), s, 0.95)
    assert j.sustained is not None and 0.95 <= j.sustained.ratio < 1
    assert j.margin is not None and j.margin < -0.9


def test_pooled_runs_are_judged_for_sustain_one_by_one() -> None:
    # Pooled, two runs' send times overlap (each starts at 0): judged as one, the sent rate
    # would double. Each run is judged on its own, and the worse decides.
    s = parse_sla(sla("p90_ttft_ms: 3000"))
    a, b = paced(10.0, 20.0), paced(10.0, 20.0)
    both = pooled(a, b)
    j = judge(both, evaluate(both, s), s, 0.95, [a, b])
    assert j.verdict == "meets" and j.sustained is not None
    assert j.sustained.sent_rate == pytest.approx(10.0)
    slow = paced(10.0, 6.0)
    both = pooled(a, slow)
    j = judge(both, evaluate(both, s), s, 0.95, [a, slow])
    assert j.verdict == "misses" and j.sustained is not None
    assert j.sustained.served_rate == pytest.approx(6.0, rel=0.05)


def test_a_pooled_level_serves_at_its_offered_rate() -> None:
    # Each run's times count from its own start, so two pooled runs' windows overlap: read as
    # one window, two runs at 10 req/s served 20 req/s, and a goodput limit neither run met
    # was met by the two together.
    s = parse_sla(sla("p90_ttft_ms: 3000, min_goodput: 15"))
    a, b = paced(10.0, 20.0, n=40), paced(10.0, 20.0, n=80)
    assert served_rate(a) == pytest.approx(10.0, rel=0.05)
    both = pooled(a, b)
    ev = evaluate(both, s)
    assert ev.metrics["request_rate"] == pytest.approx(10.0, rel=0.05)
    assert ev.metrics["goodput"] == pytest.approx(10.0, rel=0.05)
    j = judge(both, ev, s, 0.95)
    assert j.verdicts == {"p90_ttft_ms": "meets", "min_goodput": "misses"}
    assert j.verdict == "misses"
    assert j.sustained is not None and j.sustained.ok
    assert j.sustained.sent_rate == pytest.approx(10.0)
    assert j.sustained.ratio == pytest.approx(1.0)
    # A goodput the runs did reach is met by the pool too.
    low = parse_sla(sla("p90_ttft_ms: 3000, min_goodput: 9"))
    assert judge(both, evaluate(both, low), low, 0.95).verdict == "meets"
    # Re-measured once more, three runs: still 10 req/s.
    three = pooled(both, paced(10.0, 20.0, n=60))
    assert served_rate(three) == pytest.approx(10.0, rel=0.05)
    assert three.duration_s == pytest.approx(a.duration_s + b.duration_s + 60 / 10.0, abs=0.2)


def test_a_pooled_level_is_judged_for_sustain_run_by_run_on_its_own() -> None:
    # Without the runs passed, the pool itself knows them: the run that did not keep up
    # decides, at the rates it was sent and served.
    s = parse_sla(sla("p90_ttft_ms: 3000"))
    kept_up, slow = paced(10.0, 20.0), paced(10.0, 6.0)
    both = pooled(kept_up, slow)
    ev = evaluate(both, s)
    j = judge(both, ev, s, 0.95)
    assert j.verdict == "misses" and j.sustained is not None and not j.sustained.ok
    assert j.sustained.sent_rate == pytest.approx(10.0)
    assert j.sustained.served_rate == pytest.approx(6.0, rel=0.05)
    # Served: between the two runs' rates, never above the 10 req/s offered.
    rate = ev.metrics["request_rate"]
    assert rate is not None and served_rate(slow) < rate < 10.0 * 1.01
    ok = pooled(kept_up, paced(10.0, 20.0, n=60))
    j = judge(ok, evaluate(ok, s), s, 0.95)
    assert j.verdict == "meets" and j.sustained is not None and j.sustained.ok
    assert j.sustained.sent_rate == pytest.approx(10.0)


def test_a_pooled_level_keeps_its_runs_in_its_file() -> None:
    a, b = paced(10.0, 20.0, n=40), paced(10.0, 20.0, n=80)
    both = pooled(a, b)
    back = LoadResult.from_dict(json.loads(json.dumps(both.to_dict())))
    assert back == both and [len(p.records) for p in back.parts()] == [40, 80]
    assert served_rate(back) == pytest.approx(10.0, rel=0.05)
    # A file of one run has no runs to keep, and reads back as one run.
    assert "runs" not in a.to_dict() and LoadResult.from_dict(a.to_dict()).parts() == (a,)


@pytest.mark.parametrize(
    "runs",
    [
        [{"requests": -40, "duration_s": 4.0}, {"requests": 160, "duration_s": 8.0}],
        [{"requests": 40, "duration_s": float("nan")}, {"requests": 80, "duration_s": 8.0}],
        [{"requests": 40, "duration_s": float("inf")}, {"requests": 80, "duration_s": 8.0}],
        [{"requests": 0, "duration_s": 4.0}, {"requests": 120, "duration_s": 8.0}],
    ],
)
def test_a_level_file_with_impossible_runs_is_refused(runs: list[dict[str, float]]) -> None:
    # The counts add up to the records, so only a check of each run catches them.
    data = json.loads(
        json.dumps(pooled(paced(10.0, 20.0, n=40), paced(10.0, 20.0, n=80)).to_dict())
    )
    data["runs"] = runs
    with pytest.raises(ValueError, match="a pooled run of"):
        LoadResult.from_dict(data)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ttft_s", float("nan")),
        ("e2e_s", float("inf")),
        ("sent_s", float("-inf")),
        ("itl_s", [0.01, float("nan")]),
        ("duration_s", float("nan")),
    ],
)
def test_a_level_file_with_a_time_that_is_not_a_number_is_refused(
    field: str, value: object
) -> None:
    # A level file is input: NaN compares False with every limit, so it is refused on reading.
    data = json.loads(json.dumps(paced(10.0, 20.0, n=40).to_dict()))
    if field == "duration_s":
        data[field] = value
    else:
        data["records"][3][field] = value
    with pytest.raises(ValueError, match=r"not a finite number|a level of duration"):
        LoadResult.from_dict(data)


def test_a_pooled_level_written_before_its_runs_were_kept_still_reads_at_its_rate() -> None:
    # Studies written before kept only the records: each run's indices restart at 0, so the
    # runs are where the index falls back; their durations split by requests.
    both = pooled(paced(10.0, 20.0, n=40), paced(10.0, 20.0, n=80))
    old = both.to_dict()
    del old["runs"]
    back = LoadResult.from_dict(old)
    assert [len(p.records) for p in back.parts()] == [40, 80]
    assert sum(p.duration_s for p in back.parts()) == pytest.approx(both.duration_s)
    assert served_rate(back) == pytest.approx(10.0, rel=0.05)


def late(level: LoadResult, rate: float) -> LoadResult:
    """``level`` as sent by a client that could not send faster than ``rate``: each request
    left later than its schedule (its ``sent_s``) by the difference."""
    records = tuple(
        replace(r, sent_s=i / rate, lag_s=max(0.0, i / rate - r.sent_s))
        for i, r in enumerate(level.records)
    )
    return LoadResult(level.plan, records, level.duration_s)


def test_a_level_the_load_generator_fell_behind_on_is_undecided_without_a_margin() -> None:
    s = parse_sla(sla("p90_ttft_ms: 3000"))
    on_time = paced(64.0, 100.0)
    j = judge(on_time, evaluate(on_time, s), s, 0.95)
    assert j.verdict == "meets" and j.pacing is not None and not j.behind
    # The same engine, the client sending at 25 of the 64 req/s scheduled: it met the limit,
    # but at a lower load than the level claims, so it tells nothing.
    slow = late(on_time, 25.0)
    j = judge(slow, evaluate(slow, s), s, 0.95)
    assert j.verdicts == {"p90_ttft_ms": "meets"}
    assert (j.verdict, j.margin, j.behind) == ("undecided", None, True)
    # A miss measured by a late client is no miss of the engine's either.
    tight = parse_sla(sla("p90_ttft_ms: 10"))
    j = judge(slow, evaluate(slow, tight), tight, 0.95)
    assert j.verdicts == {"p90_ttft_ms": "misses"} and j.verdict == "undecided"
    # Pooled with a run on time, the late run still decides.
    both = pooled(on_time, slow)
    j = judge(both, evaluate(both, s), s, 0.95, [on_time, slow])
    assert j.verdict == "undecided" and j.pacing is not None
    assert j.pacing.kept == pytest.approx(25 / 64, rel=0.01)
    # The pool knows its runs without being told them.
    j = judge(both, evaluate(both, s), s, 0.95)
    assert j.verdict == "undecided" and j.pacing is not None
    assert j.pacing.kept == pytest.approx(25 / 64, rel=0.01)
