"""The stand-in engine's deploy renderer: its command, a shell script, a ``docker run``
script, a Compose file and a Kubernetes Deployment + Service. Pure, like every renderer:
params in, the argv or the file's text out.

The stand-in is a test tool and is never deployed: it binds 127.0.0.1 even inside a
container (autotuner.testing.standin has no other address), so a published port would not
reach it. The container files exist to satisfy the renderer's contract and show its shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from autotuner.engines.deploy import argv_lines, bash_script, dns_label
from tests.unit.engines.standin_engine.flags import params_to_args
from tests.unit.engines.standin_engine.launcher import SERVER_MODULE, engine_env

IMAGE = "autotuner/standin"
CONTAINER_MODEL_DIR = "/model"
CONTAINER_PORT = 8000


def _params(params: Mapping[str, object]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is not None and not isinstance(value, bool | int | float | str):
            raise TypeError(f"engine parameter {key!r} has a value of type {type(value).__name__}")
        out[key] = value
    return out


def _serve_argv(
    params: Mapping[str, object], *, model: str, served_name: str, host: str, port: int
) -> list[str]:
    return [
        "--model",
        model,
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        *params_to_args(_params(params)),
    ]


class StandinDeploy:
    """The stand-in's :class:`~autotuner.engines.base.DeployRenderer`."""

    def default_image(self, engine_version: str, *, cpu: bool = False) -> str:
        version = engine_version.split()[-1] if engine_version.split() else "latest"
        return f"{IMAGE}:{version}"

    def serve_command(
        self,
        params: Mapping[str, object],
        *,
        model: str,
        served_name: str,
        port: int = 8000,
        host: str = "127.0.0.1",
        python: str | None = None,
    ) -> list[str]:
        head = [python or "python3", "-m", SERVER_MODULE]
        return head + _serve_argv(
            params, model=model, served_name=served_name, host=host, port=port
        )

    def serve_script(
        self,
        argv: Sequence[str],
        *,
        header: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        return bash_script(argv_lines(argv), header, pass_args=True, env=engine_env(env or {}))

    def _container(self, params: Mapping[str, object], served_name: str) -> list[str]:
        words = _serve_argv(
            params,
            model=CONTAINER_MODEL_DIR,
            served_name=served_name,
            host="127.0.0.1",
            port=CONTAINER_PORT,
        )
        return ["python3", "-m", SERVER_MODULE, *words]

    def docker_run(
        self,
        params: Mapping[str, object],
        *,
        model_dir: str,
        served_name: str,
        gpu_uuids: Sequence[str],
        image: str,
        port: int = 8000,
        shm_size: str | None = "16g",
        env: Mapping[str, str] | None = None,
    ) -> str:
        argv = ["docker", "run", "--rm", "--read-only"]
        argv += ["-p", f"127.0.0.1:{port}:{CONTAINER_PORT}"]
        argv += ["--mount", f"type=bind,src={model_dir},dst={CONTAINER_MODEL_DIR},readonly"]
        if shm_size:
            argv += ["--shm-size", shm_size]
        for name, value in engine_env(env or {}).items():
            argv += ["-e", f"{name}={value}"]
        argv += [image, *self._container(params, served_name)]
        return bash_script(argv_lines(argv), ["stand-in engine (tests only)"], pass_args=True)

    def compose_file(
        self,
        params: Mapping[str, object],
        *,
        model_dir: str,
        served_name: str,
        gpu_slices: Sequence[Sequence[str]],
        image: str,
        port: int = 8000,
        env: Mapping[str, str] | None = None,
    ) -> str:
        services = {
            f"standin-{i}": {
                "image": image,
                "command": self._container(params, served_name),
                "ports": [f"127.0.0.1:{port + i}:{CONTAINER_PORT}"],
                "volumes": [f"{model_dir}:{CONTAINER_MODEL_DIR}:ro"],
                "environment": engine_env(env or {}),
            }
            for i in range(max(1, len(gpu_slices)))
        }
        return yaml.safe_dump({"services": services}, sort_keys=False)

    def k8s_deployment(
        self,
        params: Mapping[str, object],
        *,
        name: str,
        served_name: str,
        image: str,
        gpus: int,
        model_subpath: str,
        model_pvc: str = "models",
        env: Mapping[str, str] | None = None,
        startup_timeout_s: int = 1200,
        replicas: int = 1,
    ) -> str:
        label = dns_label(name)
        container: dict[str, Any] = {
            "name": "standin",
            "image": image,
            "command": self._container(params, served_name),
            "ports": [{"containerPort": CONTAINER_PORT}],
            "env": [{"name": k, "value": v} for k, v in engine_env(env or {}).items()],
            "volumeMounts": [
                {"name": "model", "mountPath": CONTAINER_MODEL_DIR, "subPath": model_subpath}
            ],
            "startupProbe": {
                "httpGet": {"path": "/health", "port": CONTAINER_PORT},
                "periodSeconds": 10,
                "failureThreshold": max(1, startup_timeout_s // 10),
            },
        }
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": label},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": label}},
                "template": {
                    "metadata": {"labels": {"app": label}},
                    "spec": {
                        "containers": [container],
                        "volumes": [
                            {"name": "model", "persistentVolumeClaim": {"claimName": model_pvc}}
                        ],
                    },
                },
            },
        }
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": label},
            "spec": {
                "type": "ClusterIP",
                "selector": {"app": label},
                "ports": [{"port": CONTAINER_PORT, "targetPort": CONTAINER_PORT}],
            },
        }
        return yaml.safe_dump_all([deployment, service], sort_keys=False)
