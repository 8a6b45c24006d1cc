"""benchmarks/engine_cores.py: bad arguments exit 2 before any engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.measure.scripts import load_script


def test_engine_cores_refuses_bad_arguments_before_any_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = load_script("engine_cores")
    assert m.main(["--seconds", "nan"]) == 2
    assert m.main(["--concurrency", "0"]) == 2
    assert m.main(["--rounds", "1000"]) == 2
    assert m.main(["--python", str(tmp_path / "missing")]) == 2
    assert "not an executable file" in capsys.readouterr().err
