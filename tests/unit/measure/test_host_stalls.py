"""benchmarks/host_stalls.py: a sleeping probe's late wake-ups, found and listed."""

from __future__ import annotations

import pytest

from tests.unit.measure.scripts import load_script


def test_a_stalled_wake_up_is_found_with_its_time_and_delay() -> None:
    m = load_script("host_stalls")
    now = [0.0]
    calls = [0]

    def sleep(s: float) -> None:
        calls[0] += 1
        now[0] += s + (0.5 if calls[0] == 3 else 0.001)  # the 3rd sleep: the host stops 0.5 s

    delays = m.probe(0.05, 0.01, clock=lambda: now[0], sleep=sleep)
    assert len(delays) == calls[0] and delays[2] == pytest.approx(0.5)
    assert all(d == pytest.approx(0.001) for i, d in enumerate(delays) if i != 2)
    found = m.stalls(delays, 0.01, 0.1)
    assert [(s.at_s, s.late_s) for s in found] == [(0.53, 0.5)]
    text = m.render(delays, found, 0.1)
    assert "longest delay 500 ms" in text and "1 over 100 ms (0.5 s in all)" in text
    assert "at     0.53 s: 500 ms late" in text


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    m = load_script("host_stalls")
    assert m.main(["--seconds", "nan"]) == 2
    assert m.main(["--every", "-1"]) == 2
    assert "expected a positive number" in capsys.readouterr().err
    assert m.main(["--seconds", "0.02", "--every", "0.005"]) == 0
    assert "wake-ups: longest delay" in capsys.readouterr().out
