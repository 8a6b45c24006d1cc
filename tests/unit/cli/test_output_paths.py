"""Output paths that are not plain files (issue 40, item 6): ``bench -o /dev/null`` as root
used to rename a regular file over the device. A character device or a FIFO is written into
and stays what it was; a directory or a socket is refused with exit 2 before any work.

Never the host's /dev/null: a character device made in the test's folder (root only) and a
FIFO stand in for it.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autotuner.cli import bench as bench_cli
from autotuner.cli import tune as tune_cli
from autotuner.cli.main import main
from autotuner.core.paths import OutputRefused, atomic_write_text
from autotuner.records.promotion import Promotion

ROOT = Path(__file__).resolve().parents[3]
SLA_FILE = str(ROOT / "objectives" / "quickstart-cpu.yaml")


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))


@pytest.fixture
def null_device(tmp_path: Path) -> Path:
    """A character device like /dev/null (major 1, minor 3), in the test's own folder."""
    dev = tmp_path / "null"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return dev


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[Path, list[bytes], threading.Thread]]:
    """A FIFO with a reader that keeps all it reads."""
    path = tmp_path / "pipe"
    os.mkfifo(path)
    got: list[bytes] = []

    def read() -> None:
        with path.open("rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    yield path, got, reader
    if reader.is_alive():  # nothing opened it for writing: let the reader go
        with path.open("wb"):
            pass
    reader.join(timeout=30)


def _tune(tmp_path: Path, *extra: str) -> list[str]:
    return ["tune", SLA_FILE, "--trials-dir", str(tmp_path / "trials"), *extra]


def test_outcome_onto_a_character_device_writes_into_it(
    tmp_path: Path, null_device: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tune_cli, "tune", lambda *a, **k: Promotion("trial-1", meets_sla=True))
    assert main(_tune(tmp_path, "--outcome", str(null_device))) == 0
    assert stat.S_ISCHR(null_device.stat().st_mode)  # still the device, not a file
    assert os.stat(null_device).st_rdev == os.makedev(1, 3)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".null")] == []


def test_outcome_onto_a_fifo_is_read_by_its_reader(
    tmp_path: Path,
    fifo: tuple[Path, list[bytes], threading.Thread],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, got, reader = fifo
    monkeypatch.setattr(tune_cli, "tune", lambda *a, **k: Promotion("trial-1", meets_sla=True))
    assert main(_tune(tmp_path, "--outcome", str(path))) == 0
    assert stat.S_ISFIFO(path.stat().st_mode)
    reader.join(timeout=30)  # it ends when the writer closes; the bound is against a hang
    written = json.loads(got[0])
    assert (written["status"], written["exit_code"]) == ("met", 0)


def _never(*_: Any, **__: Any) -> Any:
    raise AssertionError("ran although its output path can't be written")


def test_bench_output_onto_a_directory_exits_2_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_cli, "bench", _never)
    target = tmp_path / "results"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    argv = ["bench", SLA_FILE, "--trials-dir", str(tmp_path / "trials"), "-o", str(target)]
    assert main(argv) == OutputRefused.exit_code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"error: can't write {target}: it is a directory; name a file to write"
    assert (target / "keep.txt").read_text() == "mine"


def test_outcome_onto_a_socket_exits_2_and_leaves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tune_cli, "tune", _never)
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        assert main(_tune(tmp_path, "--outcome", str(path))) == 2
        assert stat.S_ISSOCK(path.stat().st_mode)
    err = capsys.readouterr().err
    assert f"error: can't write {path}: it is not a file, a FIFO or a character device" in err


def test_atomic_write_still_replaces_a_regular_file_and_a_symlinked_device_stays(
    tmp_path: Path, null_device: Path
) -> None:
    plain = tmp_path / "plain.json"
    plain.write_text("old")
    atomic_write_text(plain, "new")
    assert plain.read_text() == "new"
    link = tmp_path / "link"
    link.symlink_to(null_device)
    atomic_write_text(link, "gone")
    assert link.is_symlink() and stat.S_ISCHR(null_device.stat().st_mode)


@pytest.mark.parametrize("under", ["", "sub/dir"])
def test_trials_dir_naming_a_file_exits_2_not_70(
    under: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tune_cli, "tune", _never)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    trials = a_file / under if under else a_file
    assert main(["tune", SLA_FILE, "--trials-dir", str(trials)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"error: --trials-dir {trials}: {a_file} is a file, not a folder"
    assert a_file.read_text() == "mine"
