"""Files and paths of the daemon under hostile input (issue 27, section 5): the spool's folders
are the daemon's own and never followed through a link, paths an SLA names are confined when
they are opened (not only when submitted), and text from outside (file names, lock files,
logs, tokens, malformed requests) never reaches a terminal or the log as it came."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autotuner.cli.main import main
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.service import Daemon
from autotuner.daemon.spool import SpoolTreeError
from autotuner.engines import envs

from .test_daemon_input import SLA, _env


@pytest.fixture(autouse=True)
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reg = {"eng-a": _env("eng-a")}
    monkeypatch.setattr(envs, "list_envs", lambda: list(reg.values()))
    monkeypatch.setattr(envs, "get", lambda name: reg[name])
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AUTOTUNER_LEASE_DIR", str(tmp_path / "leases"))


def _daemon(state: Path, **config: Any) -> Daemon:
    return Daemon(DaemonConfig(state_dir=state, **config))


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = _daemon(tmp_path / "state")
    yield d
    d.close()


def _elsewhere(tmp_path: Path) -> Path:
    """A folder outside the state directory, with a file of its own."""
    out = tmp_path / "elsewhere"
    out.mkdir()
    (out / "victim.yaml").write_text(SLA.format(name="victim"))
    return out


def _swap_for_link(folder: Path, target: Path) -> None:
    shutil.rmtree(folder)
    folder.symlink_to(target)


# --------------------------------------------------------------------------- 1: the spool's folders


@pytest.mark.parametrize("sub", ["failed", "done", ".work"])
def test_a_spool_folder_swapped_for_a_link_is_never_moved_through(
    daemon: Daemon, tmp_path: Path, sub: str, caplog: pytest.LogCaptureFixture
) -> None:
    spool = daemon.root / "spool"
    elsewhere = _elsewhere(tmp_path)
    daemon.scan_spool(min_age_s=0)  # every folder made
    _swap_for_link(spool / sub, elsewhere)
    (spool / "good.yaml").write_text(SLA.format(name="good"))
    (spool / "broken.yaml").write_text("model: {synth: tiny-llama}\nworkload: 3\n")
    for _ in range(2):
        with caplog.at_level(logging.INFO, logger="autotuner.daemon"):
            assert daemon.scan_spool(min_age_s=0) == []
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim.yaml"]  # nothing in or out
    assert (spool / "good.yaml").is_file() and (spool / "broken.yaml").is_file()
    assert daemon.store.get_sla("good") is None and daemon.store.get_sla("victim") is None
    refusals = [r.getMessage() for r in caplog.records if "not scanned" in r.getMessage()]
    assert len(refusals) == 1  # logged once, not at every scan
    assert f"{spool / sub} is a symbolic link (to {elsewhere})" in refusals[0]
    assert "not a folder the daemon made" in refusals[0]

    (spool / sub).unlink()  # removed: the daemon makes the folder again and goes on
    assert daemon.scan_spool(min_age_s=0) == [("broken.yaml", False), ("good.yaml", True)]
    assert (spool / sub).is_dir() and not (spool / sub).is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim.yaml"]


def test_a_state_dir_whose_spool_folder_is_a_link_does_not_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "state"
    _daemon(root).close()
    elsewhere = _elsewhere(tmp_path)
    _swap_for_link(root / "spool" / "failed", elsewhere)
    with pytest.raises(SpoolTreeError) as err:
        _daemon(root)
    assert err.value.exit_code == 2
    assert str(err.value).startswith(f"{root / 'spool' / 'failed'} is a symbolic link")
    argv = ["daemon", "--state-dir", str(root), "--port", "0"]
    assert main(argv) == 2  # a clear line, not a traceback and exit 70
    out = capsys.readouterr().err
    assert "not a folder the daemon made" in out and "Traceback" not in out
    (root / "spool" / "failed").unlink()
    _daemon(root).close()  # the failed starts freed the state directory


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_spool_folder_of_another_user_is_refused(daemon: Daemon) -> None:
    done = daemon.root / "spool" / "done"
    os.chown(done, 12345, 12345)
    (daemon.root / "spool" / "good.yaml").write_text(SLA.format(name="good"))
    assert daemon.scan_spool(min_age_s=0) == []
    assert daemon.spool.problem is not None and "belongs to user 12345" in daemon.spool.problem
    assert daemon.store.get_sla("good") is None
