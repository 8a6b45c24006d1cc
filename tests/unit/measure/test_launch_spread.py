"""benchmarks/launch_spread.py: launches of the same traffic grouped by config, a fresh
engine's first level told from its later one, and one config's TPOT over another's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.measure.scripts import load_script


def _script() -> ModuleType:
    return load_script("launch_spread")


def _launch(folder: Path, params: Mapping[str, object], tpot: float, first: float = 1.0) -> Path:
    """Levels 10 req/s, 12 req/s, 10 req/s of 100 requests; the first level ``first`` x slower;
    one failed request in the middle level."""
    folder.mkdir()
    rows = ["level,rate,index,sent_s,end_s,ttft_ms,tpot_ms,output_tokens,error"]
    for level, rate in enumerate((10.0, 12.0, 10.0)):
        for i in range(100):
            slow = first if level == 0 else 1.0
            value = tpot * slow * (1 + (i % 10) / 100)  # a spread, so p99 > mean
            error = "ClientOSError" if level == 1 and i == 50 else ""
            rows.append(f"{level},{rate},{i},{i / rate},{i / rate + 1},50,{value},64,{error}")
    (folder / "requests.csv").write_text("\n".join(rows) + "\n")
    (folder / "result.json").write_text(json.dumps({"params": params, "startup_s": 60.5}))
    return folder


def test_first_level_slowness_and_config_ratio(tmp_path: Path) -> None:
    m = _script()
    defaults = {"load_format": "dummy"}
    other = {"load_format": "dummy", "max_num_seqs": 64}
    folders = [
        _launch(tmp_path / "d1", defaults, 9.0, first=1.1),
        _launch(tmp_path / "c1", other, 9.9),
        _launch(tmp_path / "d2", defaults, 9.0),
    ]
    launches = [m.read_launch(f) for f in folders]
    assert launches[0].first_over_last() == pytest.approx(1.1)
    assert launches[2].first_over_last() == pytest.approx(1.0)
    assert launches[1].levels[1].errors == 1
    assert len(launches[1].levels[1].tpot_ms) == 99
    text = m.render(launches)
    assert 'A = {"load_format": "dummy"}' in text
    assert "first/last, all launches: mean 1.033, range 1.000-1.100 (3 launches)" in text
    # config B is 10 % slower than A at the later levels; at level 0 A's mean holds d1's 1.1 x.
    assert "B / A mean TPOT: level 0: 1.048, level 1: 1.100, level 2: 1.100" in text
    assert "(1 err)" in text


def test_unreadable_folder_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = _script()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "result.json").write_text("[1, 2]")
    (bad / "requests.csv").write_text("level,rate\n")
    assert m.main([str(tmp_path / "missing")]) == 2
    assert m.main([str(bad)]) == 2
    assert "not an object" in capsys.readouterr().err


def test_requests_part_cuts_each_level_in_send_order(tmp_path: Path) -> None:
    m = _script()
    folder = _launch(tmp_path / "d1", {}, 9.0)
    launch = m.read_launch(folder, slice(95, 200))
    assert [len(lv.tpot_ms) for lv in launch.levels] == [5, 5, 5]
    assert launch.levels[0].tpot_ms == pytest.approx([9.0 * (1 + k / 100) for k in range(5, 10)])
    with pytest.raises(ValueError, match="no requests in 100:200"):
        m.read_launch(folder, slice(100, 200))
    assert m.main(["--requests", "x", str(folder)]) == 2


def test_short_and_odd_rows_are_read_without_a_crash(tmp_path: Path) -> None:
    m = _script()
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "result.json").write_text('{"params": "not a dict", "startup_s": "soon"}')
    header = "level,rate,index,sent_s,end_s,ttft_ms,tpot_ms,output_tokens,error"
    (folder / "requests.csv").write_text(
        f"{header}\n0,10\n0,10,1,0.1,1,50,nan,8,\n0,10,2,x,1,50,9,8,\n"
    )
    launch = m.read_launch(folder)
    assert launch.config == "{}" and launch.start_s is None
    assert launch.levels[0].tpot_ms == [9.0] and launch.levels[0].errors == 0
    (folder / "requests.csv").write_text(f"{header}\nlevel-one,10\n")
    with pytest.raises(ValueError, match="bad row"):
        m.read_launch(folder)


def test_bytes_that_are_not_utf8_name_the_folder_and_a_zero_tpot_divides_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = _script()
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "result.json").write_text('{"params": {}}')
    (binary / "requests.csv").write_bytes(b"level,rate\n\xff\xfe,1\n")
    assert m.main([str(binary)]) == 2
    assert f"{binary}: 'utf-8' codec" in capsys.readouterr().err
    header = "level,rate,index,sent_s,end_s,ttft_ms,tpot_ms,output_tokens,error"
    zero, other = tmp_path / "zero", tmp_path / "other"
    for folder, tpot, params in ((zero, 0, {}), (other, 5, {"max_num_seqs": 8})):
        folder.mkdir()
        (folder / "result.json").write_text(json.dumps({"params": params}))
        (folder / "requests.csv").write_text(f"{header}\n0,10,1,0.1,1,50,{tpot},8,\n")
    assert m.main([str(zero), str(other)]) == 0  # no ratio over a mean TPOT of 0
    assert capsys.readouterr().out.splitlines()[-1] == "B / A mean TPOT: "
