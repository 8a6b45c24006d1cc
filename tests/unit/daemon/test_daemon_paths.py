"""Files and paths of the daemon under hostile input (issue 27, section 5): the spool's folders
are the daemon's own and never followed through a link, paths an SLA names are confined when
they are opened (not only when submitted), and text from outside (file names, lock files,
logs, tokens, malformed requests) never reaches a terminal or the log as it came."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autotuner.cli.main import main
from autotuner.core import confined
from autotuner.daemon import jobs
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.service import Daemon
from autotuner.daemon.spool import SpoolTreeError
from autotuner.engines import envs
from autotuner.measure.bench import resolve_model
from autotuner.sla.spec import parse_sla
from autotuner.workload.datafiles import DataFileError
from autotuner.workload.datasets import read_dataset
from autotuner.workload.traces import read_trace

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


# --------------------------------------------------------------------------- 2: confined at open

SECRET_RECORD = '{"prompt": ["TOP-SECRET-LINE"]}\n'  # a data file's message would quote it


def _wait_job(d: Daemon, job_id: int, timeout_s: float = 120.0) -> None:
    async def go() -> None:
        await d.dispatch()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = d.store.job(job_id)
            assert job is not None
            if job.state not in ("queued", "running"):
                return
            await asyncio.sleep(0.2)
        for run in d.running.values():
            run.proc.kill()
        raise AssertionError(f"job {job_id} did not end within {timeout_s} s")

    asyncio.run(go())


def test_a_link_placed_after_submission_is_not_followed_by_the_job(
    daemon: Daemon, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.jsonl"
    secret.write_text(SECRET_RECORD)
    data = daemon.root / "spool" / "data"
    data.mkdir()
    dataset = data / "prompts.jsonl"  # does not exist yet: accepted over HTTP
    text = SLA.format(name="later").replace("input_tokens: 16", f"dataset: {dataset}")
    result = daemon.submit(text, source="later.yaml", base_dir=None)
    assert result["created"]
    dataset.symlink_to(secret)  # placed once the submission was checked

    _wait_job(daemon, result["job"])
    job = daemon.store.job(result["job"])
    assert job is not None and job.state == "failed" and job.exit_code == 2
    shown = json.dumps(job.to_dict())  # what GET /v1/jobs answers
    assert "TOP-SECRET" not in shown
    assert f"resolves to {secret}, outside the directories" in shown
    log = daemon.layout.log(result["job"]).read_text()
    assert "TOP-SECRET" not in log


def test_job_env_confines_the_job_to_the_spool_and_allowed_paths(tmp_path: Path) -> None:
    roots = [tmp_path / "state" / "spool", tmp_path / "models"]
    env = jobs.job_env({"PATH": "/bin", envs.ENV_PYTHON_VAR: "/x/python"}, roots)
    assert env[confined.ROOTS_VAR] == os.pathsep.join(str(r) for r in roots)
    assert envs.ENV_PYTHON_VAR not in env and env["PATH"] == "/bin"


def test_data_files_are_checked_on_what_was_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "spool"
    root.mkdir()
    secret = tmp_path / "secret.jsonl"
    secret.write_text(SECRET_RECORD)
    (root / "inside.jsonl").write_text('{"prompt": "hello"}\n')
    (root / "escape.jsonl").symlink_to(secret)
    (root / "trace.csv").symlink_to(secret)
    with confined.confined_to([root]):
        assert read_dataset(root / "inside.jsonl")[0] == "prompts"
        with pytest.raises(DataFileError) as err:
            read_dataset(root / "escape.jsonl")
        assert "outside" in str(err.value) and "TOP-SECRET" not in str(err.value)
        with pytest.raises(DataFileError, match="outside"):
            read_trace(root / "trace.csv")
    # the daemon sets it for a whole job process through the environment
    monkeypatch.setenv(confined.ROOTS_VAR, str(root))
    with pytest.raises(DataFileError, match="outside"):
        read_dataset(root / "escape.jsonl")
    monkeypatch.delenv(confined.ROOTS_VAR)
    with pytest.raises(DataFileError, match="TOP-SECRET"):  # the CLI run by hand: not confined
        read_dataset(root / "escape.jsonl")


def test_a_model_folder_with_a_link_out_of_the_roots_is_refused_when_a_job_opens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models"
    model = models / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    sla = parse_sla(
        SLA.format(name="m").replace("{synth: tiny-llama}", f"{{path: {model}}}"), "m.yaml"
    )
    monkeypatch.setenv(confined.ROOTS_VAR, str(models))
    assert resolve_model(sla) == model
    (model / "tokenizer.json").symlink_to("/etc/passwd")  # placed after submission
    with pytest.raises(confined.OutsideRoots, match=r"tokenizer\.json: resolves to /etc/passwd"):
        resolve_model(sla)
    (model / "tokenizer.json").unlink()
    (models / "m2").symlink_to(tmp_path)  # the folder itself a link out of the roots
    sla2 = parse_sla(
        SLA.format(name="m2").replace("{synth: tiny-llama}", f"{{path: {models / 'm2'}}}"),
        "m2.yaml",
    )
    with pytest.raises(confined.OutsideRoots, match="outside"):
        resolve_model(sla2)
