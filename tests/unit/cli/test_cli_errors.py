"""The one error wrapper: an unexpected exception exits 70 with one line naming it and the file
holding its traceback; an AutotunerError exits with its code; Ctrl-C exits 130."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotuner.cli import bench as bench_cli
from autotuner.cli import compare as compare_cli
from autotuner.cli import report as report_cli
from autotuner.cli import tune as tune_cli
from autotuner.cli.errors import MAX_LINE, one_line
from autotuner.cli.main import main
from autotuner.core.errors import (
    EXIT_CODES,
    AutotunerError,
    BadInput,
    EngineStartFailed,
    InternalError,
    Interrupted,
    SlaNotMet,
)
from autotuner.engines.base import EngineLaunchError, LaunchCause
from autotuner.search.study import StudyMismatch, storage_url

ROOT = Path(__file__).resolve().parents[3]
SLA = str(ROOT / "objectives" / "quickstart-cpu.yaml")
LINE = re.compile(
    r"^internal error: ZeroDivisionError: division by zero "
    r"\(traceback: (?P<path>\S+); --debug prints it\)$"
)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _divide(*_: Any, **__: Any) -> Any:
    return 1 / 0


async def _divide_async(*_: Any, **__: Any) -> Any:
    return 1 / 0


def _study(tmp_path: Path) -> Path:
    sdir = tmp_path / "trials" / "s"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="s", storage=storage_url(sdir, None))
    return sdir


# command -> (module, library function its handler calls, replacement, argv)
Setup = Callable[[Path], tuple[Any, str, Any, list[str]]]
COMMANDS: dict[str, Setup] = {
    "tune": lambda t: (
        tune_cli,
        "tune",
        _divide,
        ["tune", SLA, "--trials-dir", str(t / "trials")],
    ),
    "bench": lambda t: (
        bench_cli,
        "bench",
        _divide_async,
        ["bench", SLA, "--trials-dir", str(t / "trials")],
    ),
    "compare-engines": lambda t: (
        compare_cli,
        "compare_engines",
        _divide,
        [
            "compare-engines",
            SLA,
            "--bundle",
            str(t / "b"),
            "--old",
            "a",
            "--new",
            "b",
            "--work-dir",
            str(t / "w"),
        ],
    ),
    "report": lambda t: (report_cli, "render", _divide, ["report", str(_study(t))]),
}


def _patched(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replacement: Any = None
) -> list[str]:
    module, name, divide, argv = COMMANDS[command](tmp_path)
    monkeypatch.setattr(module, name, replacement or divide)
    return argv


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_unexpected_exception_exits_70_with_one_line_and_a_traceback_file(
    command: str,
    tmp_path: Path,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = _patched(command, tmp_path, monkeypatch)
    assert main(argv) == 70
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    m = LINE.match(lines[0])
    assert m, lines[0]
    path = Path(m["path"])
    assert path.parent == home / "logs" and path.name.startswith("crash-")
    text = path.read_text()
    assert text.startswith("autotuner ")
    assert f"command: autotuner {' '.join(argv)}" in text
    assert "Traceback (most recent call last)" in text
    assert "in _divide" in text and "ZeroDivisionError: division by zero" in text


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_prints_the_traceback_instead(
    where: str,
    tmp_path: Path,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = _patched("report", tmp_path, monkeypatch)
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    assert main(argv) == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in _divide" in err
    assert err.splitlines()[-1] == "internal error: ZeroDivisionError: division by zero"
    assert not (home / "logs").exists()


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (BadInput("no such thing"), 2, "error: no such thing"),
        (SlaNotMet("nothing meets it"), 1, "error: nothing meets it"),
        (EngineStartFailed("it died"), 3, "error: it died"),
        (Interrupted("interrupted: stopped"), 130, "interrupted: stopped"),
        (StudyMismatch("made for another SLA"), 2, "error: made for another SLA"),
        (AutotunerError("plain"), 70, "error: plain"),
    ],
)
def test_an_autotuner_error_exits_with_its_code_and_its_line(
    error: AutotunerError,
    code: int,
    line: str,
    tmp_path: Path,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fail(*_: Any, **__: Any) -> Any:
        raise error

    argv = _patched("tune", tmp_path, monkeypatch, fail)
    assert main(argv) == code
    assert capsys.readouterr().err.splitlines() == [line]
    assert not (home / "logs").exists()  # a deliberate error writes no traceback


def test_internal_error_is_logged_like_any_bug(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(*_: Any, **__: Any) -> Any:
        raise InternalError("the cache went missing")

    assert main(_patched("report", tmp_path, monkeypatch, fail)) == 70
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("internal error: InternalError: the cache went missing (traceback: ")
    (log,) = (home / "logs").iterdir()
    assert "InternalError: the cache went missing" in log.read_text()


def test_engine_start_failure_in_bench_exits_3_with_the_log_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fail(*_: Any, **__: Any) -> Any:
        raise EngineLaunchError(LaunchCause.OTHER, "exited with 1", "Boom: bad flag", 1)

    assert main(_patched("bench", tmp_path, monkeypatch, fail)) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: engine failed to start (other): exited with 1\n--- last lines")
    assert err.rstrip().endswith("Boom: bad flag")


@pytest.mark.parametrize(
    ("command", "line"),
    [
        ("tune", "interrupted: engines stopped; run the same command again to resume"),
        ("compare-engines", "interrupted: engines stopped; run the same command again to resume"),
        ("bench", "interrupted; engine stopped"),
        ("report", "interrupted"),  # no handler of its own: the wrapper's line
    ],
)
def test_ctrl_c_exits_130(
    command: str,
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def stop(*_: Any, **__: Any) -> Any:
        raise KeyboardInterrupt

    async def stop_async(*_: Any, **__: Any) -> Any:
        raise KeyboardInterrupt

    argv = _patched(command, tmp_path, monkeypatch, stop_async if command == "bench" else stop)
    assert main(argv) == 130
    assert capsys.readouterr().err.splitlines() == [line]


def test_without_a_writable_home_the_traceback_goes_to_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tempfile

    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "file"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert main(_patched("report", tmp_path, monkeypatch)) == 70
    m = LINE.match(capsys.readouterr().err.strip())
    assert m and Path(m["path"]).parent == tmp_path / "tmp"
    assert "ZeroDivisionError" in Path(m["path"]).read_text()


def test_the_line_stays_one_line() -> None:
    assert one_line(RuntimeError("first\n\n  second  ")) == "RuntimeError: first | second"
    assert one_line(KeyError()) == "KeyError"
    long = one_line(ValueError("x" * 1000))
    assert len(long) == len("ValueError: ") + MAX_LINE and long.endswith("...")


def test_readme_documents_every_exit_code_and_where_tracebacks_go() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("Exit codes")
    section = readme[start : start + 1500]
    for code in EXIT_CODES:
        assert re.search(rf"`{code}`", section), code
    assert "crash-" in section and "--debug" in section


def test_an_unreadable_record_is_bad_input_not_a_bug(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autotuner.records import RecordVersionError

    def fail(*_: Any, **__: Any) -> Any:
        raise RecordVersionError("m.json", "manifest", 9, (0, 1))

    assert main(_patched("report", tmp_path, monkeypatch, fail)) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: m.json: manifest has schema_version 9, but this autotuner reads")
    assert not (home / "logs").exists()
