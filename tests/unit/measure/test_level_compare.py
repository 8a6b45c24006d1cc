"""benchmarks/level_compare.py: the same schedule in two launches, told apart request by
request, and where within the level a slower launch is slower."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from autotuner.measure.loadgen import LoadResult, RequestRecord
from tests.unit.measure.scripts import load_script


def _script() -> ModuleType:
    return load_script("level_compare")


def _level(path: Path, tpot_s: float, cold: float = 1.0, shift_s: float = 0.0) -> Path:
    """30 requests, 2 per second, 11 output tokens; the first 10 ``cold`` x slower."""
    records = []
    for i in range(30):
        slow = cold if i < 10 else 1.0
        records.append(
            RequestRecord(
                index=i,
                sent_s=i / 2 + shift_s,
                lag_s=0.0,
                requested_tokens=11,
                ttft_s=0.05,
                e2e_s=0.05 + 10 * tpot_s * slow,
                prompt_tokens=100 + i,
                output_tokens=11,
            )
        )
    result = LoadResult(plan={}, records=tuple(records), duration_s=15.0)
    path.write_text(json.dumps(result.to_dict()))
    return path


def test_a_slower_launch_of_the_same_schedule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lc = _script()
    a = _level(tmp_path / "a.json", 0.010)
    b = _level(tmp_path / "b.json", 0.011)
    cold = _level(tmp_path / "c.json", 0.010, cold=1.5)
    other = _level(tmp_path / "d.json", 0.010, shift_s=0.5)  # another schedule
    assert lc.main([f"A={a}", f"B={b}", f"cold={cold}", f"other={other}"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:5]}
    assert rows["A"][-2:] == ["30/30", "1.000"]
    assert rows["B"][-2:] == ["30/30", "1.100"]
    assert rows["other"][-2] == "0/30"  # every send half a second off A's
    # The cold launch: its first third slower than its last, the other two thirds as A's.
    first, second, third = (float(rows["cold"][i].split("/")[0]) for i in (6, 7, 8))
    assert first == pytest.approx(15.0) and second == third == pytest.approx(10.0)


def test_an_unreadable_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert _script().main([str(bad)]) == 2
    assert _script().main([str(tmp_path / "missing.json")]) == 2
