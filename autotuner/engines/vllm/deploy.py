"""vLLM's deploy renderer: the exact command, a shell script, a hardened ``docker run``
script and a Kubernetes Deployment + Service for a promoted config.

Contract: every function is pure — engine params (the same mapping the tuner launched,
turned into flags by :func:`autotuner.engines.vllm.flags.params_to_args`) in, the argv or
the file's whole content out; the caller writes the files. Nothing here inspects the machine.

- Host and port are never engine params (``params_to_args`` refuses them): the artifact sets
  them. Outside a container the server binds 127.0.0.1; inside one it binds 0.0.0.0 and the
  isolation comes from where the port is published (loopback on the host, a ClusterIP Service).
- ``load_format: dummy`` (random weights, how the tuner benchmarks generated models) is kept,
  so the artifact reproduces what was measured; the scripts say it must go for real serving.
- Images are pinned to the engine version that was tuned (:func:`default_image`); a floating
  ``latest`` would silently serve a config on an engine it was never measured on.
- The environment is the one measured (:func:`deploy_env`): the SLA's ``engine.env`` with
  what the launcher sets for every engine (:data:`~autotuner.engines.vllm.launcher.LAUNCH_ENV`);
  only the devices are each file's own (the GPUs it pins).
- Any model path mounts: one with ``:`` (which ``docker -v`` and compose's short syntax
  cannot take) is mounted with ``--mount`` / compose's long syntax.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from autotuner.core.types import ParamValue
from autotuner.engines.deploy import argv_lines, bash_script
from autotuner.engines.vllm.flags import params_to_args
from autotuner.engines.vllm.launcher import SERVER_MODULE, engine_env

CONTAINER_MODEL_DIR = "/model"
CONTAINER_PORT = 8000
# The vllm/vllm-openai images run as root by default; 1000 is the conventional first user.
NON_ROOT_UID = 1000

GPU_IMAGE = "vllm/vllm-openai"
# vLLM publishes its x86-64 CPU build here, not on Docker Hub (docs: deployment/docker, CPU).
CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo"

_VERSION = re.compile(r"(\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?)")
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def engine_params(params: Mapping[str, object]) -> dict[str, ParamValue]:
    """``params`` checked to hold only values ``params_to_args`` can render (else TypeError)."""
    out: dict[str, ParamValue] = {}
    for key, value in params.items():
        if value is None or isinstance(value, bool | int | float | str):
            out[key] = value
        elif isinstance(value, dict) and all(isinstance(k, str) for k in value):
            out[key] = {str(k): v for k, v in value.items()}
        else:
            raise TypeError(f"engine parameter {key!r} has a value of type {type(value).__name__}")
    return out


def deploy_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The variables a deployed server runs with: as measured, the SLA's ``env`` (its
    ``engine.env``) with what the launcher sets for every engine (engines/vllm/launcher.py)."""
    return engine_env(env or {})


def _mount_arg(model_dir: str) -> list[str]:
    """The read-only model mount of ``docker run``: ``-v DIR:/model:ro``, or for a folder
    whose path has a ``:`` (which ``-v`` splits on) ``--mount`` with the path CSV-quoted."""
    if ":" not in model_dir:
        return ["-v", f"{model_dir}:{CONTAINER_MODEL_DIR}:ro"]
    source = f"source={model_dir}"
    if any(c in model_dir for c in ',"\n'):
        source = '"' + source.replace('"', '""') + '"'  # docker reads --mount as CSV
    return ["--mount", f"type=bind,{source},target={CONTAINER_MODEL_DIR},readonly"]


def _compose_volume(model_dir: str) -> str | dict[str, Any]:
    if ":" not in model_dir:
        return f"{model_dir}:{CONTAINER_MODEL_DIR}:ro"
    return {"type": "bind", "source": model_dir, "target": CONTAINER_MODEL_DIR, "read_only": True}


def uses_dummy_weights(argv: Sequence[str]) -> bool:
    """Whether ``argv`` loads random weights (``--load-format dummy``)."""
    for i, arg in enumerate(argv):
        if arg == "--load-format=dummy" or (
            arg == "--load-format" and i + 1 < len(argv) and argv[i + 1] == "dummy"
        ):
            return True
    return False


def default_image(engine_version: str, *, cpu: bool = False) -> str:
    """The official vLLM image for ``engine_version`` (``"vllm 0.32.0 (cpu)"``, ``"0.32.0"``).

    GPU: ``vllm/vllm-openai:vX.Y.Z`` (Docker Hub). CPU: vLLM's x86-64 CPU release image on
    public ECR (there is no CPU tag on Docker Hub); arm64 hosts need a different repository.
    """
    match = _VERSION.search(engine_version)
    if match is None:
        raise ValueError(f"no version number in engine version {engine_version!r}")
    return f"{CPU_IMAGE if cpu else GPU_IMAGE}:v{match[1]}"


def serve_command(
    params: Mapping[str, object],
    *,
    model: str,
    served_name: str,
    port: int = 8000,
    host: str = "127.0.0.1",
    python: str | None = None,
) -> list[str]:
    """The argv that serves ``model`` with ``params``: ``vllm serve MODEL ...``.

    With ``python`` (an interpreter path) it is ``PYTHON -m vllm.entrypoints.openai.api_server
    --model MODEL ...`` instead, which also works for the ``vllm-cpu`` distribution whose
    ``vllm`` console script fails (see :mod:`autotuner.engines.vllm.launcher`).
    """
    if python is None:
        head = ["vllm", "serve", model]
    else:
        head = [python, "-m", SERVER_MODULE, "--model", model]
    return [
        *head,
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        *params_to_args(engine_params(params)),
    ]


def _dummy_comment(argv: Sequence[str]) -> list[str]:
    if not uses_dummy_weights(argv):
        return []
    return [
        "",
        "--load-format dummy: random weights, as benchmarked. For benchmarking only: remove it",
        "to serve the model's real weights (same speed, real answers).",
    ]


def serve_script(
    argv: Sequence[str], *, header: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> str:
    """A bash script that exports :func:`deploy_env` of ``env`` and ``exec``s ``argv``
    (arguments given to the script are appended).

    ``header`` lines become comments at the top (what was tuned, when, measured what).
    """
    comments = [*header, *_dummy_comment(argv)]
    return bash_script(argv_lines(argv), comments, pass_args=True, env=deploy_env(env))


def docker_argv(
    params: Mapping[str, object],
    *,
    model_dir: str,
    served_name: str,
    gpu_uuids: Sequence[str],
    image: str,
    port: int = 8000,
    shm_size: str | None = "16g",
    env: Mapping[str, str] | None = None,
) -> list[list[str]]:
    """The ``docker run`` argv, grouped a line per option (see :func:`docker_run`)."""
    for uuid in gpu_uuids:
        if not uuid.startswith(("GPU-", "MIG-")) or "," in uuid or '"' in uuid:
            raise ValueError(f"{uuid!r} is not a GPU UUID (GPU-... or MIG-...)")
    lines: list[list[str]] = [["docker", "run", "--rm"]]
    if gpu_uuids:
        # Pinned by UUID: indexes change with driver order and CUDA_VISIBLE_DEVICES.
        # The inner double quotes are docker's syntax for a list of devices.
        lines.append(["--gpus", '"device=' + ",".join(gpu_uuids) + '"'])
    # PyTorch passes tensors between processes through /dev/shm (tensor parallelism).
    lines.append(["--shm-size", shm_size] if shm_size else ["--ipc=host"])
    lines += [
        ["--user", f"{NON_ROOT_UID}:{NON_ROOT_UID}"],
        ["--cap-drop", "ALL"],
        ["--security-opt", "no-new-privileges"],
    ]
    if not gpu_uuids:
        # vLLM's CPU backend binds threads and memory to NUMA nodes (needs CAP_SYS_NICE).
        lines.append(["--cap-add", "SYS_NICE"])
    lines += [
        ["-p", f"127.0.0.1:{port}:{CONTAINER_PORT}"],
        _mount_arg(model_dir),
        # A non-root user has no writable home in the image; caches go to /tmp.
        ["-e", "HOME=/tmp"],
    ]
    lines += [["-e", f"{k}={v}"] for k, v in deploy_env(env).items()]
    inner = _container_args(served_name, params)
    lines.append([image])
    lines += argv_lines(inner)
    return lines


def docker_run(
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
    """A bash script running the config in the official image, locked down.

    GPUs pinned by UUID (none: a CPU run — pass a CPU image), the port published on
    127.0.0.1 only, the model directory mounted read-only at /model, a non-root user with
    no capabilities, ``--shm-size`` (``None``: ``--ipc=host``), offline. ``image`` is pinned,
    e.g. :func:`default_image` of the engine version that was tuned.
    """
    lines = docker_argv(
        params,
        model_dir=model_dir,
        served_name=served_name,
        gpu_uuids=gpu_uuids,
        image=image,
        port=port,
        shm_size=shm_size,
        env=env,
    )
    flat = [arg for line in lines for arg in line]
    comments = [
        f"Serves {served_name!r} on http://127.0.0.1:{port}/v1 (OpenAI API).",
        "",
        "Inside the container the server listens on 0.0.0.0 so that Docker's port forward",
        "reaches it; the port is published on the host's 127.0.0.1 only, so nothing outside",
        "this machine can connect. Put an authenticating TLS proxy in front to expose it.",
        *_dummy_comment(flat),
    ]
    return bash_script(lines, comments, pass_args=False)


def compose_file(
    params: Mapping[str, object],
    *,
    model_dir: str,
    served_name: str,
    gpu_slices: Sequence[Sequence[str]],
    image: str,
    port: int = 8000,
    shm_size: str = "16g",
    env: Mapping[str, str] | None = None,
) -> str:
    """A Docker Compose file with one service per engine server of the layout: ``replica-N``
    on GPUs ``gpu_slices[N]`` (pinned by UUID; empty: a CPU run), published on 127.0.0.1 at
    ``port + N``; locked down like :func:`docker_run`. A client (or a proxy) spreads the
    requests over the ports."""
    if not gpu_slices:
        raise ValueError("a compose file needs at least one server")
    command = _container_args(served_name, params)
    services: dict[str, Any] = {}
    for i, gpus in enumerate(gpu_slices):
        for uuid in gpus:
            if not uuid.startswith(("GPU-", "MIG-")):
                raise ValueError(f"{uuid!r} is not a GPU UUID (GPU-... or MIG-...)")
        service: dict[str, Any] = {
            "image": image,
            "command": list(command),
            "user": f"{NON_ROOT_UID}:{NON_ROOT_UID}",
            "cap_drop": ["ALL"],
            **({} if gpus else {"cap_add": ["SYS_NICE"]}),
            "security_opt": ["no-new-privileges"],
            "shm_size": shm_size,
            "ports": [f"127.0.0.1:{port + i}:{CONTAINER_PORT}"],
            "volumes": [_compose_volume(model_dir)],
            "environment": {"HOME": "/tmp", **deploy_env(env)},
        }
        if gpus:
            device = {"driver": "nvidia", "device_ids": list(gpus), "capabilities": ["gpu"]}
            service["deploy"] = {"resources": {"reservations": {"devices": [device]}}}
        services[f"replica-{i}"] = service
    head = (
        f"# {len(gpu_slices)} server(s) of {served_name!r}: http://127.0.0.1:{port}"
        f"{f'-{port + len(gpu_slices) - 1}' if len(gpu_slices) > 1 else ''}/v1 (OpenAI API)\n"
    )
    return head + yaml.safe_dump({"services": services}, sort_keys=False)


def k8s_deployment(
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
    """A Kubernetes Deployment and its ClusterIP Service, as two YAML documents.

    The model comes read-only from PVC ``model_pvc`` at ``model_subpath``; ``gpus`` is the
    ``nvidia.com/gpu`` limit of one pod (0: a CPU pod, with a CPU image); ``replicas`` pods
    (a data-parallel layout run as engine replicas) share the Service, which spreads the
    requests over them. The pod runs as a non-root user
    with a read-only root file system (``/tmp`` and ``/dev/shm`` are emptyDirs), no
    capabilities and no service-account token. A startup probe gives model loading
    ``startup_timeout_s`` before the liveness probe may restart the pod.
    """
    if not _K8S_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid Kubernetes name (lowercase DNS label)")
    if gpus < 0:
        raise ValueError("gpus must be >= 0")
    if replicas < 1:
        raise ValueError("replicas must be >= 1")

    # Fresh dicts wherever one would repeat: safe_dump turns shared objects into &id anchors.
    def labels() -> dict[str, str]:
        return {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "autotuner"}

    def probe() -> dict[str, Any]:
        return {"httpGet": {"path": "/health", "port": "http"}}

    args = _container_args(served_name, params)
    env_vars = {"HOME": "/tmp", **deploy_env(env)}
    container: dict[str, Any] = {
        "name": "vllm",
        "image": image,
        "args": args,
        "env": [{"name": k, "value": v} for k, v in env_vars.items()],
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "startupProbe": {
            **probe(),
            "periodSeconds": 10,
            "failureThreshold": max(1, startup_timeout_s // 10),
        },
        "readinessProbe": {**probe(), "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {
            **probe(),
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 3,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], **({} if gpus else {"add": ["SYS_NICE"]})},
        },
        "volumeMounts": [
            {
                "name": "model",
                "mountPath": CONTAINER_MODEL_DIR,
                "subPath": model_subpath,
                "readOnly": True,
            },
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels()},
        "spec": {
            "replicas": replicas,
            # A rolling update would need a second set of GPUs while the old pod still runs.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": labels()},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": NON_ROOT_UID,
                        "runAsGroup": NON_ROOT_UID,
                        "fsGroup": NON_ROOT_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "model",
                            "persistentVolumeClaim": {"claimName": model_pvc, "readOnly": True},
                        },
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels()},
        "spec": {
            "type": "ClusterIP",
            "selector": {"app.kubernetes.io/name": name},
            "ports": [{"name": "http", "port": CONTAINER_PORT, "targetPort": "http"}],
        },
    }
    header = [
        f"# {name}: serves {served_name!r} (OpenAI API) inside the cluster only (ClusterIP).",
        f"# Image pinned to the tuned engine version: {image}",
    ]
    if uses_dummy_weights(args):
        header.append("# --load-format dummy: random weights, for benchmarking only; remove it.")
    body = yaml.safe_dump_all([deployment, service], sort_keys=False, default_flow_style=False)
    return "\n".join(header) + "\n" + body


class VllmDeploy:
    """The functions above as the adapter's :class:`~autotuner.engines.base.DeployRenderer`."""

    def default_image(self, engine_version: str, *, cpu: bool = False) -> str:
        return default_image(engine_version, cpu=cpu)

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
        return serve_command(
            params, model=model, served_name=served_name, port=port, host=host, python=python
        )

    def serve_script(
        self,
        argv: Sequence[str],
        *,
        header: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        return serve_script(argv, header=header, env=env)

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
        return docker_run(
            params,
            model_dir=model_dir,
            served_name=served_name,
            gpu_uuids=gpu_uuids,
            image=image,
            port=port,
            shm_size=shm_size,
            env=env,
        )

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
        return compose_file(
            params,
            model_dir=model_dir,
            served_name=served_name,
            gpu_slices=gpu_slices,
            image=image,
            port=port,
            env=env,
        )

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
        return k8s_deployment(
            params,
            name=name,
            served_name=served_name,
            image=image,
            gpus=gpus,
            model_subpath=model_subpath,
            model_pvc=model_pvc,
            env=env,
            startup_timeout_s=startup_timeout_s,
            replicas=replicas,
        )


def _container_args(served_name: str, params: Mapping[str, object]) -> list[str]:
    """The server's arguments inside a container: the mounted model, every interface of the
    container (the host publishes the port on 127.0.0.1 only), the tuned parameters."""
    return [
        "--model",
        CONTAINER_MODEL_DIR,
        "--served-model-name",
        served_name,
        "--host",
        "0.0.0.0",
        "--port",
        str(CONTAINER_PORT),
        *params_to_args(engine_params(params)),
    ]
