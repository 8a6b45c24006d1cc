"""The engine-upgrade regression decision: no alarm on A/A, clear verdicts on real changes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autotuner.records.compare import ReplicateLine
from autotuner.search.regress import decide, run_replicates


def Sample(  # one replicate as the journal keeps it, built positionally for brevity
    engine: str,
    replicate: int,
    started: bool,
    metrics: dict[str, float | None],
    feasible: bool = False,
    cause: str | None = None,
) -> ReplicateLine:
    return ReplicateLine(
        engine=engine,
        replicate=replicate,
        started=started,
        metrics=metrics,
        feasible=feasible,
        cause=cause,
    )


def _samples(
    rng: np.random.Generator,
    n: int,
    *,
    noise: float = 0.05,
    old: tuple[float, float, float] = (2.0, 40.0, 8.0),
    new: tuple[float, float, float] = (2.0, 40.0, 8.0),
) -> list[ReplicateLine]:
    out = []
    for engine, (g, ttft, tpot) in (("old", old), ("new", new)):
        for r in range(n):
            f = rng.normal(1.0, noise, size=3)
            metrics = {"goodput": g * f[0], "p99_ttft_ms": ttft * f[1], "p99_tpot_ms": tpot * f[2]}
            out.append(Sample(engine, r, True, metrics, True))
    return out


@pytest.mark.parametrize("n", [2, 3, 5])
def test_aa_comparisons_almost_never_raise_an_alarm(n: int) -> None:
    rng = np.random.default_rng(1)
    alarms = sum(decide(_samples(rng, n), 0.05).verdict == "regression" for _ in range(1000))
    assert alarms <= 10  # <= 1 % false alarms with 5 % run-to-run noise


def test_aa_with_noisy_p99_stays_quiet() -> None:
    # CPU p99 latencies over a few dozen requests move by 20 % or more from run to run.
    rng = np.random.default_rng(2)
    alarms = sum(
        decide(_samples(rng, 3, noise=0.2), 0.05).verdict == "regression" for _ in range(500)
    )
    assert alarms <= 5


@pytest.mark.parametrize(
    "new",
    [(1.2, 40.0, 8.0), (2.0, 80.0, 8.0), (2.0, 40.0, 16.0)],
    ids=["goodput-40%", "ttft-x2", "tpot-x2"],
)
def test_a_clear_slowdown_is_a_regression(new: tuple[float, float, float]) -> None:
    rng = np.random.default_rng(3)
    verdicts = [decide(_samples(rng, 3, new=new), 0.05).verdict for _ in range(200)]
    assert verdicts.count("regression") >= 190


def test_a_clear_speedup_is_an_improvement() -> None:
    rng = np.random.default_rng(4)
    outcome = decide(_samples(rng, 3, new=(3.0, 20.0, 4.0)), 0.05)
    assert outcome.verdict == "improvement"
    goodput = next(c for c in outcome.changes if c.metric == "goodput")
    assert goodput.change is not None and 0.3 < goodput.change < 0.7
    assert goodput.ci_low is not None and goodput.ci_low > 0.05


def test_the_reported_numbers_are_the_means() -> None:
    old = [(2.0, 10.0), (2.2, 12.0), (2.1, 11.0)]
    new = [(1.0, 30.0), (1.1, 34.0), (1.05, 32.0)]
    s = [
        Sample(e, r, True, {"goodput": g, "p99_ttft_ms": t, "p99_tpot_ms": 5.0})
        for e, rows in (("old", old), ("new", new))
        for r, (g, t) in enumerate(rows)
    ]
    outcome = decide(s, 0.05)
    assert outcome.verdict == "regression"
    g = next(c for c in outcome.changes if c.metric == "goodput")
    assert g.old_mean == pytest.approx(2.1)
    assert g.new_mean == pytest.approx(1.05)
    assert g.change == pytest.approx(-0.5, abs=0.002)  # ratio of geometric means
    assert g.ci_high is not None and g.ci_high < -0.05
    assert g.direction == "worse"
    t = next(c for c in outcome.changes if c.metric == "p99_ttft_ms")
    assert t.direction == "worse" and t.change == pytest.approx(1.9, abs=0.02)
    tpot = next(c for c in outcome.changes if c.metric == "p99_tpot_ms")
    assert tpot.direction == "same"
    assert "goodput -50.0%" in outcome.summary()


def test_two_replicates_need_a_large_change() -> None:
    # Same direction as above but only two runs each: a 99 % interval on 2 degrees of
    # freedom is wide, so a halving with 10 % spread is not yet a verdict, only a hint.
    s = [
        Sample("old", 0, True, {"goodput": 2.0}),
        Sample("old", 1, True, {"goodput": 2.2}),
        Sample("new", 0, True, {"goodput": 1.0}),
        Sample("new", 1, True, {"goodput": 1.1}),
    ]
    outcome = decide(s, 0.05)
    assert outcome.verdict == "not_enough_data" and "goodput -50%" in outcome.reason


def test_goodput_dropping_to_zero_is_a_regression() -> None:
    s = [Sample("old", r, True, {"goodput": 2.0 + r / 10}) for r in range(3)]
    s += [Sample("new", r, True, {"goodput": 0.0}) for r in range(3)]
    outcome = decide(s, 0.05)
    assert outcome.verdict == "regression"


def test_new_engine_that_no_longer_starts_is_a_regression() -> None:
    s = [Sample("old", r, True, {"goodput": 2.0}) for r in range(2)]
    s += [Sample("new", r, False, {}, cause="out_of_memory") for r in range(2)]
    outcome = decide(s, 0.05)
    assert outcome.verdict == "regression"
    assert "out_of_memory" in outcome.reason


def test_too_few_measurements_give_no_verdict() -> None:
    s = [Sample("old", 0, True, {"goodput": 2.0}), Sample("new", 0, True, {"goodput": 0.1})]
    assert decide(s, 0.05).verdict == "not_enough_data"
    s = [Sample("old", r, False, {}, cause="other") for r in range(2)]
    s += [Sample("new", r, True, {"goodput": 2.0}) for r in range(2)]
    assert decide(s, 0.05).verdict == "not_enough_data"


def test_better_in_one_metric_but_worse_on_average_in_another_is_no_improvement() -> None:
    # Seen in CI: p99 TTFT clearly better, p99 TPOT doubled on average with an interval from
    # -5 % to +330 %: that is not an improvement but a call for more replicates.
    ttft_old, ttft_new = [120.0, 140.0, 130.0], [40.0, 45.0, 42.0]
    tpot_old, tpot_new = [9.0, 10.0, 9.5], [14.0, 30.0, 19.0]
    s = [
        Sample(e, r, True, {"goodput": 3.0, "p99_ttft_ms": t, "p99_tpot_ms": p})
        for e, ttft, tpot in (("old", ttft_old, tpot_old), ("new", ttft_new, tpot_new))
        for r, (t, p) in enumerate(zip(ttft, tpot, strict=True))
    ]
    outcome = decide(s, 0.05)
    by_metric = {c.metric: c.direction for c in outcome.changes}
    assert by_metric == {"goodput": "same", "p99_ttft_ms": "better", "p99_tpot_ms": "unclear"}
    assert outcome.verdict == "not_enough_data"
    assert "p99_tpot_ms +" in outcome.reason and "better in p99_ttft_ms" in outcome.reason


def test_a_metric_unclear_in_the_good_direction_keeps_an_improvement() -> None:
    s = [
        Sample(e, r, True, {"goodput": g, "p99_ttft_ms": t, "p99_tpot_ms": 9.5})
        for e, goodput, ttft in (
            ("old", [3.0, 3.1, 3.05], [120.0, 140.0, 130.0]),
            ("new", [4.0, 9.0, 6.0], [40.0, 45.0, 42.0]),
        )
        for r, (g, t) in enumerate(zip(goodput, ttft, strict=True))
    ]
    outcome = decide(s, 0.05)
    assert {c.metric: c.direction for c in outcome.changes}["goodput"] == "unclear"
    assert outcome.verdict == "improvement"


def test_worse_in_one_metric_is_a_regression_even_if_another_improved() -> None:
    # Seen on the CPU: the slowed engine's TPOT tripled while its p99 TTFT fell.
    rng = np.random.default_rng(5)
    outcome = decide(_samples(rng, 3, noise=0.01, new=(2.0, 15.0, 24.0)), 0.05)
    assert outcome.verdict == "regression"
    assert outcome.reason == ("worse beyond the noise in p99_tpot_ms (better in p99_ttft_ms)")


def test_replicates_are_interleaved_and_resume_from_the_journal(tmp_path: Path) -> None:
    calls: list[str] = []

    def run_one(engine: str, run_dir: Path) -> ReplicateLine:
        calls.append(engine)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the daemon stopped mid-check
        return Sample(engine, 0, True, {"goodput": 1.0 if engine == "old" else 2.0})

    with pytest.raises(KeyboardInterrupt):
        run_replicates(["old", "new"], 2, tmp_path, run_one, lambda _: None)
    assert calls == ["old", "new", "new"]
    journal = [
        json.loads(line) for line in (tmp_path / "replicates.jsonl").read_text().splitlines()
    ]
    assert [(j["engine"], j["replicate"]) for j in journal] == [("old", 0), ("new", 0)]

    calls.clear()
    samples = run_replicates(["old", "new"], 2, tmp_path, run_one, lambda _: None)
    assert calls == ["new", "old"]  # replicate 2 runs new first: rotated order
    assert [(s.engine, s.replicate) for s in samples] == [
        ("old", 0),
        ("new", 0),
        ("new", 1),
        ("old", 1),
    ]


def test_an_erratic_slowdown_is_inconclusive_not_no_change() -> None:
    # Seen on the CPU: a misconfigured engine was 16x, 3x and 1x slower in three runs.
    old = [8.4, 9.9, 9.0]
    new = [134.6, 28.7, 9.5]
    s = [
        Sample(e, r, True, {"goodput": 3.0 + r / 100, "p99_tpot_ms": v})
        for e, vals in (("old", old), ("new", new))
        for r, v in enumerate(vals)
    ]
    outcome = decide(s, 0.05)
    assert outcome.verdict == "not_enough_data"
    assert "p99_tpot_ms" in outcome.reason and "more replicates" in outcome.reason
