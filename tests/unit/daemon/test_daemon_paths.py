"""Files and paths of the daemon under hostile input (issue 27, section 5): the spool's folders
are the daemon's own and never followed through a link, paths an SLA names are confined when
they are opened (not only when submitted), and text from outside (file names, lock files,
logs, tokens, malformed requests) never reaches a terminal or the log as it came."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from autotuner.cli.main import main
from autotuner.core import confined
from autotuner.core.paths import models_dir
from autotuner.daemon import jobs
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.hostlocks import HostLocks
from autotuner.daemon.main import serve
from autotuner.daemon.service import Daemon
from autotuner.daemon.spool import SpoolTreeError, scan_spool
from autotuner.daemon.tokens import TokenFileError
from autotuner.engines import envs
from autotuner.measure.launch import resolve_model
from autotuner.models import synth
from autotuner.sla.spec import parse_sla
from autotuner.workload.datafiles import DataFileError
from autotuner.workload.datasets import read_dataset
from autotuner.workload.traces import read_trace

from .conftest import SLA, make_daemon


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AUTOTUNER_LEASE_DIR", str(tmp_path / "leases"))


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
    scan_spool(daemon, min_age_s=0)  # every folder made
    _swap_for_link(spool / sub, elsewhere)
    (spool / "good.yaml").write_text(SLA.format(name="good"))
    (spool / "broken.yaml").write_text("model: {synth: tiny-llama}\nworkload: 3\n")
    for _ in range(2):
        with caplog.at_level(logging.INFO, logger="autotuner.daemon"):
            assert scan_spool(daemon, min_age_s=0) == []
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim.yaml"]  # nothing in or out
    assert (spool / "good.yaml").is_file() and (spool / "broken.yaml").is_file()
    assert daemon.store.get_sla("good") is None and daemon.store.get_sla("victim") is None
    refusals = [r.getMessage() for r in caplog.records if "not scanned" in r.getMessage()]
    assert len(refusals) == 1  # logged once, not at every scan
    assert f"{spool / sub} is a symbolic link (to {elsewhere})" in refusals[0]
    assert "not a folder the daemon made" in refusals[0]

    (spool / sub).unlink()  # removed: the daemon makes the folder again and goes on
    assert scan_spool(daemon, min_age_s=0) == [("broken.yaml", False), ("good.yaml", True)]
    assert (spool / sub).is_dir() and not (spool / sub).is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim.yaml"]


def test_a_state_dir_whose_spool_folder_is_a_link_does_not_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "state"
    make_daemon(root).close()
    elsewhere = _elsewhere(tmp_path)
    _swap_for_link(root / "spool" / "failed", elsewhere)
    with pytest.raises(SpoolTreeError) as err:
        make_daemon(root)
    assert err.value.exit_code == 2
    assert str(err.value).startswith(f"{root / 'spool' / 'failed'} is a symbolic link")
    argv = ["daemon", "--state-dir", str(root), "--port", "0"]
    assert main(argv) == 2  # a clear line, not a traceback and exit 70
    out = capsys.readouterr().err
    assert "not a folder the daemon made" in out and "Traceback" not in out
    (root / "spool" / "failed").unlink()
    make_daemon(root).close()  # the failed starts freed the state directory


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_spool_folder_of_another_user_is_refused(daemon: Daemon) -> None:
    done = daemon.root / "spool" / "done"
    os.chown(done, 12345, 12345)
    (daemon.root / "spool" / "good.yaml").write_text(SLA.format(name="good"))
    assert scan_spool(daemon, min_age_s=0) == []
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
    # the SLA's roots, then the tuner's own generated models
    assert env[confined.ROOTS_VAR] == os.pathsep.join(str(r) for r in [*roots, models_dir()])
    assert envs.ENV_PYTHON_VAR not in env and env["PATH"] == "/bin"


def test_a_confined_job_reads_the_tuners_own_generated_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a daemon job of `model: {synth: tiny-llama}` was refused its own model ("outside
    the directories SLA files may be read from"), as the model lives in the tuner's home."""
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    model = synth.synthesize("tiny-llama", synth.default_model_dir("tiny-llama"))
    env = jobs.job_env({}, [tmp_path / "state" / "spool"])
    monkeypatch.setenv(confined.ROOTS_VAR, env[confined.ROOTS_VAR])
    assert confined.read_bytes(model / "config.json").startswith(b"{")
    (tmp_path / "elsewhere.json").write_text("{}")
    with pytest.raises(confined.OutsideRoots):
        confined.read_bytes(tmp_path / "elsewhere.json")


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


# --------------------------------------------------------------------------- 5: text from outside


def test_a_spool_file_name_with_control_characters_is_refused_and_shown_escaped(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    spool = daemon.root / "spool"
    name = "evil\x1b]0;pwned\x07\nALERT critical.yaml"
    (spool / name).write_text(SLA.format(name="evil"))
    with caplog.at_level(logging.WARNING, logger="autotuner.daemon"):
        assert scan_spool(daemon, min_age_s=0) == [(name, False)]
    assert daemon.store.get_sla("evil") is None
    logged = [r.getMessage() for r in caplog.records]
    alert = daemon.store.alerts()[0]
    recent = daemon.status()["spool"]["recent"][0]
    for text in [*logged, alert["summary"], *recent["errors"], recent["file"]]:
        assert not any(c in text for c in "\x1b\x07\n"), text
    assert "evil\\x1b]0;pwned\\x07\\nALERT critical.yaml" in logged[0]
    assert "control characters" in recent["errors"][0]
    (error,) = (daemon.root / "spool" / "failed").glob("*.error.txt")
    assert "\x1b" not in error.read_text()


def test_a_lease_holder_is_read_without_links_and_shown_escaped(tmp_path: Path) -> None:
    locks = HostLocks(tmp_path / "leases", owner="/srv/state")
    other = HostLocks(tmp_path / "leases", owner="/srv/other")
    try:
        assert other.take("cpu")
        assert locks.holder("cpu") == f"pid {os.getpid()} /srv/other"
        (tmp_path / "leases" / "cpu.lock").write_text("pid 1 \x1b[2J\x1b[Hfake\nline")
        assert locks.holder("cpu") == "pid 1 \\x1b[2J\\x1b[Hfake\\nline"
        other.drop("cpu")
        (tmp_path / "leases" / "cpu.lock").unlink()
        (tmp_path / "leases" / "cpu.lock").symlink_to("/etc/passwd")
        assert locks.holder("cpu") == ""  # a planted link is never read
        with pytest.raises(ValueError, match="not a device name"):  # whole names only
            locks.take("cpu\n")
    finally:
        locks.close()
        other.close()


def test_status_escapes_what_the_daemon_quotes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autotuner.cli import daemon as cli_daemon

    status = {
        "daemon": {"pid": 1, "url": "http://127.0.0.1:1", "bind": "", "started": 0,
                   "state_dir": "/s"},
        "running": [{"id": 1, "kind": "tune", "sla": "a", "engine": "e", "devices": ["cpu"],
                     "started": 0, "log_tail": ["\x1b[31mred\x1b]0;title\x07", "ok"]}],
        "queue": [{"id": 2, "kind": "tune", "sla": "b", "engine": "e", "priority": 0,
                   "waiting_for": "cpu is held by pid 9 \x1b[2Jfake\nline"}],
        "leases": {"held": {}, "draining": []},
        "slas": [],
        "spool": {"rejected": 1, "recent": [{"time": 0, "file": "x\x1b.yaml", "errors": ["e"]}]},
        "alerts": [{"time": 0, "severity": "warning", "kind": "k", "summary": "s\x9b2J",
                    "delivered": 1}],
    }  # fmt: skip
    monkeypatch.setattr(cli_daemon, "_endpoint", lambda *a: ("http://x", "t"))
    monkeypatch.setattr(cli_daemon, "call", lambda *a: (200, status))
    assert cli_daemon.main_status(None, None, None, False) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\x9b")
    assert "\\x1b[31mred" in out and "fake\\nline" in out and "x\\x1b.yaml" in out


def test_a_non_ascii_token_file_stops_the_start_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "state"
    make_daemon(root).close()
    (root / "token").write_text("tökén-" * 8 + "\n")
    with pytest.raises(TokenFileError) as err:
        make_daemon(root)
    assert err.value.exit_code == 2
    assert str(err.value).startswith(f"{root / 'token'}: the API token must be printable ASCII")
    assert main(["daemon", "--state-dir", str(root), "--port", "0"]) == 2
    assert "delete it and the daemon makes a new one" in capsys.readouterr().err
    (root / "token").unlink()
    d = make_daemon(root)  # a new token, and the failed starts left nothing held
    try:
        assert d.token.isascii() and len(d.token) >= 32
    finally:
        d.close()


def test_malformed_requests_leave_no_traceback_or_body_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(envs, "list_envs", lambda: [])
    config = DaemonConfig(state_dir=tmp_path / "state", port=0, spool_poll_s=3600)
    payloads = [
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\nBad Header\x01: SECRET-HEADER\r\n\r\n",
        b"POST /v1/studies HTTP/1.1\r\nHost: x\r\nContent-Length: SECRET-LEN\r\n\r\nbody",
        b"\x16\x03\x01SECRET-TLS-GARBAGE\r\n\r\n",
    ]

    async def go() -> int:
        ready = asyncio.Event()
        served = asyncio.create_task(serve(config, ready=ready))
        await asyncio.wait_for(ready.wait(), 60)
        url = json.loads((config.state_dir / "daemon.json").read_text())["url"]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        for payload in payloads:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(payload)
            await writer.drain()
            assert (await reader.read(100)).startswith(b"HTTP/1.")
            writer.close()
        os.kill(os.getpid(), signal.SIGTERM)  # serve() stops on it
        return await asyncio.wait_for(served, 60)

    assert asyncio.run(go()) == 0
    captured = capsys.readouterr()
    log = captured.out + captured.err
    assert "SECRET" not in log and "Traceback" not in log
    assert log.count("malformed HTTP request") == 1  # once, not a line per request


# --------------------------------------------------------------------------- 3: the study's file


def test_the_status_page_never_writes_into_a_study_file_that_is_not_a_study(
    daemon: Daemon,
) -> None:
    db = daemon.layout.study_dir("s", "eng-a") / "study.db"
    db.parent.mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(db)) as con:
        con.execute("CREATE TABLE mine (x)")
        con.commit()
    before = db.read_bytes()
    summary = jobs.study_summary(daemon.layout, "s", "eng-a")
    assert "is not an Optuna storage" in summary["error"]
    assert db.read_bytes() == before
