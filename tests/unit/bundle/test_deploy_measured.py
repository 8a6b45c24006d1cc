"""What ran is what is recorded and what the bundle deploys: tunes on the fault-injection
harness (autotuner.testing.standin), whose engine interpreter records each launch's argv and
environment (``--record``).

- ``engine.args`` reach the engine as options, once, with the value the trial records (was:
  ``--max-num-seqs 64 ... --max-num-seqs 3``, recorded as 64);
- serve.sh, docker-run.sh, compose.yaml and k8s.yaml carry the measured argv and environment
  (was: ``engine.args`` and ``engine.env`` left out);
- whatever ``check`` accepts, promotion renders (was: an SLA name ending in ``-``, ``_`` or
  ``.``, 64 to 100 characters long, or a model path with ``:`` crashed at promotion, exit 70,
  after every launch and again at every re-run); a renderer that fails costs the deploy files
  only, never the decision or the rest of the bundle.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotuner.cli.main import main
from autotuner.engines.vllm import deploy as vllm_deploy
from autotuner.engines.vllm.launcher import engine_env
from autotuner.models import synth
from autotuner.records.manifest import Manifest
from autotuner.records.outcome import JobOutcome
from autotuner.records.trial import StudyRecord, TrialRecord
from autotuner.search.study import storage_url
from autotuner.search.trial import TrialResult
from autotuner.testing.standin import write_engine_python

ENV = {"OMP_NUM_THREADS": "2", "VLLM_LOGGING_LEVEL": "WARNING"}
ARGS = ["--max-num-seqs", "3", "--enforce-eager"]


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _tune(
    tmp_path: Path,
    name: str,
    *,
    model: dict[str, str] | None = None,
    engine: dict[str, Any] | None = None,
) -> tuple[int, Path]:
    """One launch (the engine defaults) on the recording stand-in; the study's folder."""
    python = write_engine_python(tmp_path / "engine" / "python", record=tmp_path / "launches")
    sla = {
        "name": name,
        "model": model or {"synth": "tiny-llama"},
        "engine": {
            "kind": "vllm",
            "python": str(python),
            "startup_timeout_s": 60,
            **(engine or {}),
        },
        "target": "cpu",
        "workload": {
            "input_tokens": 8,
            "output_tokens": 4,
            "arrival": {"process": "poisson", "rate": 8},
            "requests": 16,
            "warmup_requests": 0,
        },
        "constraints": {"p50_ttft_ms": 2000},
        "tune": {"trials": 1, "max_levels": 1, "confirm": {"replicates": 1}},
    }
    path = tmp_path / "sla.yaml"
    path.write_text(yaml.safe_dump(sla, sort_keys=False))
    out = tmp_path / "outcome.json"
    code = main(
        ["tune", str(path), "--trials-dir", str(tmp_path / "trials"), "--outcome", str(out)]
    )
    assert JobOutcome.read(out).exit_code == code
    return code, tmp_path / "trials" / name


def _launches(tmp_path: Path) -> list[dict[str, Any]]:
    files = sorted((tmp_path / "launches").glob("launch-*.json"))
    return [json.loads(f.read_text()) for f in files]


def _without_port(argv: list[str]) -> list[str]:
    i = argv.index("--port")
    return [*argv[:i], *argv[i + 2 :]]


def test_engine_args_run_once_with_the_value_the_trial_records(tmp_path: Path) -> None:
    code, study_dir = _tune(tmp_path, "args", engine={"args": ARGS})
    assert code == 0
    (launch,) = _launches(tmp_path)
    ran = launch["argv"]
    assert ran.count("--max-num-seqs") == 1 and ran[ran.index("--max-num-seqs") + 1] == "3"
    assert ran.count("--enforce-eager") == 1
    study = optuna.load_study(study_name="args", storage=storage_url(study_dir, None))
    (trial,) = study.trials
    record = TrialRecord.from_trial(trial)
    assert record.params_or({})["max_num_seqs"] == 3  # was the space's default, 64 or 256
    result = TrialResult.read(study_dir / str(record.result_file))
    assert list(result.argv[3:]) == ran  # trial.json's argv is what ran


def test_deploy_files_carry_the_measured_argv_and_environment(tmp_path: Path) -> None:
    code, study_dir = _tune(tmp_path, "deployed", engine={"args": ARGS, "env": ENV})
    assert code == 0
    (launch,) = _launches(tmp_path)
    measured_env = {k: launch["env"][k] for k in engine_env(ENV)}
    assert measured_env == engine_env(ENV)  # the launcher gave the engine exactly these
    deploy = study_dir / "promoted" / "deploy"

    # serve.sh, run from an empty environment, starts the engine as it was measured: its
    # interpreter (the recording stand-in, told to exit at once now) records what it got.
    write_engine_python(tmp_path / "engine" / "python", fault="exit0", record=tmp_path / "launches")
    subprocess.run(
        ["env", "-i", f"PATH={os.environ['PATH']}", "bash", str(deploy / "serve.sh")],
        capture_output=True,
        timeout=120,
        check=True,
    )
    served = _launches(tmp_path)[1]
    assert _without_port(served["argv"]) == _without_port(launch["argv"])
    assert {k: served["env"].get(k) for k in measured_env} == measured_env

    # docker run, compose and Kubernetes: the same options after the container's own, and
    # the same variables (HOME is the container's own: its user has no home).
    script = (deploy / "docker-run.sh").read_text()
    words = shlex.split(script[script.index("\nexec ") + 1 :].replace("\\\n", ""))[1:]
    docker_env = dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "-e")
    inner = words[words.index("--port", words.index("--served-model-name")) + 2 :]
    options = launch["argv"][launch["argv"].index("--port") + 2 :]
    assert inner == options
    assert docker_env == {"HOME": "/tmp", **measured_env}
    (service,) = yaml.safe_load((deploy / "compose.yaml").read_text())["services"].values()
    assert service["command"][service["command"].index("--port") + 2 :] == options
    assert service["environment"] == {"HOME": "/tmp", **measured_env}
    k8s, _ = yaml.safe_load_all((deploy / "k8s.yaml").read_text())
    (container,) = k8s["spec"]["template"]["spec"]["containers"]
    assert container["args"][container["args"].index("--port") + 2 :] == options
    assert {e["name"]: e["value"] for e in container["env"]} == {"HOME": "/tmp", **measured_env}


@pytest.mark.parametrize("name", ["edge-", "edge_", "Edge.", "a" * 100])
def test_every_name_check_accepts_is_promoted_with_its_deploy_files(
    tmp_path: Path, name: str
) -> None:
    code, study_dir = _tune(tmp_path, name)
    assert code == 0
    k8s, _ = yaml.safe_load_all((study_dir / "promoted" / "deploy" / "k8s.yaml").read_text())
    label = k8s["metadata"]["name"]
    assert len(label) <= 63 and label[0].isalnum() and label[-1].isalnum() and label.islower()


def test_a_model_path_with_a_colon_is_mounted(tmp_path: Path) -> None:
    model = tmp_path / "models:v1" / "tiny"
    shutil.copytree(synth.synthesize("tiny-llama", tmp_path / "synth"), model)
    code, study_dir = _tune(tmp_path, "colon", model={"path": str(model)})
    assert code == 0
    script = (study_dir / "promoted" / "deploy" / "docker-run.sh").read_text()
    words = shlex.split(script[script.index("\nexec ") + 1 :].replace("\\\n", ""))
    assert words[words.index("--mount") + 1] == (f"type=bind,source={model},target=/model,readonly")
    compose = yaml.safe_load((study_dir / "promoted" / "deploy" / "compose.yaml").read_text())
    (service,) = compose["services"].values()
    assert service["volumes"] == [
        {"type": "bind", "source": str(model), "target": "/model", "read_only": True}
    ]


def test_a_failing_renderer_keeps_the_decision_and_the_rest_of_the_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_: Any, **__: Any) -> str:
        raise ValueError("no such thing")

    monkeypatch.setattr(vllm_deploy, "k8s_deployment", broken)
    code, study_dir = _tune(tmp_path, "broken")
    assert code == 0
    assert "warning: deploy files not rendered (ValueError: no such thing)" in (
        capsys.readouterr().out
    )
    bundle = study_dir / "promoted"
    assert Manifest.read(bundle / "optimization_manifest.json").promoted is not None
    assert (bundle / "fallback_plan.md").is_file()
    assert "ValueError: no such thing" in (bundle / "deploy" / "NOT_RENDERED.txt").read_text()
    study = optuna.load_study(study_name="broken", storage=storage_url(study_dir, None))
    assert StudyRecord.from_attrs(study.user_attrs, "broken").promotion is not None
    again, _ = _tune(tmp_path, "broken")  # a re-run reprints the decision, launches nothing
    assert again == 0 and len(_launches(tmp_path)) == 1
