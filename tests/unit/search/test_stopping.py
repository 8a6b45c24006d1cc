"""The study's stopping rule and the sentence about the engine defaults."""

from __future__ import annotations

import pytest

from autotuner.search.stopping import StoppingRule, defaults_sentence


def test_stops_when_the_last_k_launches_improved_less_than_the_resolution() -> None:
    rule = StoppingRule(patience=3, resolution=0.03)
    caps = [15.0, 18.0, 18.2, 18.3, 18.4]  # best before the last 3: 18.0; now 18.4 (+2.2 %)
    d = rule.check(caps)
    assert d.stop
    assert (d.best, d.best_before) == (18.4, 18.0)
    assert d.improvement == pytest.approx(18.4 / 18.0 - 1)
    assert "+2.2%" in d.reason and "less than the resolution 3%" in d.reason


def test_keeps_going_while_the_best_still_moves() -> None:
    rule = StoppingRule(patience=3, resolution=0.03)
    d = rule.check([15.0, 18.0, 18.2, 18.3, 18.6])  # +3.3 %
    assert not d.stop and "keep searching" in d.reason


def test_waits_for_patience_plus_one_launches() -> None:
    rule = StoppingRule(patience=3)
    assert not rule.check([15.0, 15.0, 15.0]).stop
    assert rule.check([15.0, 15.0, 15.0, 15.0]).stop


def test_min_launches_come_first() -> None:
    rule = StoppingRule(patience=2, min_launches=6)
    d = rule.check([10.0] * 5)
    assert not d.stop and "5 of at least 6" in d.reason
    assert rule.check([10.0] * 6).stop


def test_failed_and_infeasible_launches_do_not_improve_anything() -> None:
    rule = StoppingRule(patience=3)
    assert rule.check([15.0, None, 0.0, None]).stop


def test_never_stops_before_anything_met_the_sla() -> None:
    rule = StoppingRule(patience=2)
    d = rule.check([0.0, None, 0.0, 0.0])
    assert not d.stop and d.best is None
    d = rule.check([0.0, 0.0, 5.0, 5.0])  # first feasible launch inside the window
    assert not d.stop and d.best == 5.0 and d.best_before is None


def test_a_late_jump_resets_the_rule() -> None:
    rule = StoppingRule(patience=2, resolution=0.03)
    assert rule.check([10.0, 10.0, 10.1]).stop
    assert not rule.check([10.0, 10.0, 10.1, 12.0]).stop
    assert not rule.check([10.0, 10.0, 10.1, 12.0, 12.1]).stop  # 12.1 vs 10.1 before the window
    assert rule.check([10.0, 10.0, 10.1, 12.0, 12.1, 12.2]).stop


@pytest.mark.parametrize(
    "kwargs", [{"patience": 0}, {"resolution": -0.1}, {"resolution": 1.0}, {"min_launches": -1}]
)
def test_bad_rules_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        StoppingRule(**kwargs)  # type: ignore[arg-type]


def test_rejects_bad_capacities() -> None:
    with pytest.raises(ValueError):
        StoppingRule().check([1.0, float("nan")])


def test_sentence_defaults_within_the_resolution() -> None:
    s = defaults_sentence(15.0, 15.25, 3)
    assert s.startswith("the engine defaults are within 1.6% of the best of 3 configs tried")
    assert "(15 vs 15.2 req/s)" in s
    assert "no config tried measurably beat them" in s
    assert s.endswith("(single runs, not confirmed)")


def test_sentence_defaults_behind_the_best() -> None:
    s = defaults_sentence(2.05, 4.18, 7, confirmed=True)
    assert s.startswith("the engine defaults are within 51.0% of the best of 7 configs tried")
    assert "the best serves +103.9% more" in s
    assert "not confirmed" not in s


def test_sentence_defaults_are_the_best() -> None:
    s = defaults_sentence(15.0, 14.0, 1, confirmed=True)  # best below the defaults: defaults win
    assert s.startswith("the engine defaults are within 0.0% of the best of 1 config tried")


def test_sentence_edge_cases() -> None:
    assert defaults_sentence(0.0, 3.0, 4, unit="req/s").startswith(
        "the engine defaults miss the SLA at its own load; "
        "the best of 4 configs tried holds 3 req/s"
    )
    assert defaults_sentence(0.0, None, 4) == (
        "none of the 4 configs tried met the SLA at its own load, the engine defaults included"
    )
    assert defaults_sentence(None, 3.0, 2).startswith("the engine defaults were not measured;")
    assert defaults_sentence(None, None, 2).endswith("none of the 2 configs tried met the SLA")
    with pytest.raises(ValueError):
        defaults_sentence(1.0, 1.0, 0)


def test_sentence_says_how_coarse_a_tie_is() -> None:
    # The H200 equal-memory study: defaults 20.44 [20, 22.5] and the best 20.45 [20, 22.5].
    s = defaults_sentence(20.44, 20.45, 5, resolved=2.5 / 20)
    assert "no config tried measurably beat them" in s
    assert "brackets stayed up to 12.5% wide" in s and "3% resolution" in s
    assert "inside the 3% resolution" not in s
    # Brackets within the resolution: the plain sentence.
    assert "inside the 3% resolution" in defaults_sentence(20.44, 20.45, 5, resolved=0.02)
    # A gap wider than the brackets is a gap.
    assert "the best serves" in defaults_sentence(15.0, 20.0, 5, resolved=0.125)
