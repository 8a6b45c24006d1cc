"""The bundle's ``deploy/`` files (serve script, docker run, compose, Kubernetes) and the
command that serves a config, rendered by the adapter of the engine the study tuned.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotuner import __version__
from autotuner.bundle.context import Context
from autotuner.engines.base import DeployRenderer
from autotuner.engines.deploy import dns_label
from autotuner.measure.launch import layout_of
from autotuner.search.pareto import Candidate


def renderer(ctx: Context) -> DeployRenderer:
    """The deploy renderer of the engine kind the study tuned."""
    return ctx.engine.deploy


def serve_argv(ctx: Context, params: Mapping[str, Any]) -> list[str]:
    served = ctx.sla.model.served_name or ctx.sla.model.synth or ctx.model_dir.name
    python = str(ctx.engine_python) if ctx.hardware.device == "cpu" else None
    deploy = renderer(ctx)
    return deploy.serve_command(params, model=str(ctx.model_dir), served_name=served, python=python)


def write_deploy_files(ctx: Context, out: Path, chosen: Candidate) -> None:
    """The deploy files; a renderer that fails costs those files only, never the decision or
    the rest of the bundle: ``deploy/NOT_RENDERED.txt`` says why, and so does the tuner."""
    try:
        write_deploy(ctx, out, chosen)
    except Exception as exc:  # any renderer's failure: the bundle goes on without it
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        why = f"{type(exc).__name__}: {exc}"
        (out / "NOT_RENDERED.txt").write_text(
            f"The deploy files of this config could not be rendered: {why}\n"
            "The decision and the rest of the bundle stand; optimization_manifest.json has "
            "the exact engine command that was measured.\n"
        )
        print(f"warning: deploy files not rendered ({why}); the rest of the bundle is written")


def write_deploy(ctx: Context, out: Path, chosen: Candidate) -> None:
    served = ctx.sla.model.served_name or ctx.sla.model.synth or ctx.model_dir.name
    env = dict(ctx.sla.engine.env)  # what the launch was given; the renderer adds its own
    cpu = ctx.hardware.device == "cpu"
    deploy = renderer(ctx)
    image = deploy.default_image(ctx.engine_version, cpu=cpu)
    header = [
        f"autotuner {__version__}: promoted config of study {ctx.sla.name}",
        f"engine {ctx.engine_version}",
    ]
    layout = layout_of(ctx.sla, chosen.params, ctx.engine)
    params = layout.engine_params(chosen.params)
    header.append(f"layout: {layout.describe('rank' if cpu else 'GPU')}")  # CPU: engine ranks
    # Each engine server's GPUs (one slice per replica); on a CPU target none.
    uuids = [g.uuid for g in ctx.hardware.gpus]
    slices = layout.slices(uuids) if uuids else [[] for _ in range(layout.replicas)]
    for i, gpus in enumerate(slices):
        suffix = f"-r{i}" if layout.replicas > 1 else ""
        mine = list(header)
        if layout.replicas > 1:
            mine.append(
                f"replica {i + 1} of {layout.replicas}: GPUs {','.join(gpus) or 'none'}, port "
                f"{8000 + i}; run every replica and spread requests over their ports"
            )
        serve = out / f"serve{suffix}.sh"
        argv = deploy.serve_command(
            params,
            model=str(ctx.model_dir),
            served_name=served,
            port=8000 + i,
            python=str(ctx.engine_python) if cpu else None,
        )
        serve.write_text(deploy.serve_script(argv, header=mine, env=env))
        serve.chmod(0o755)
        docker = out / f"docker-run{suffix}.sh"
        docker.write_text(
            deploy.docker_run(
                params,
                model_dir=str(ctx.model_dir),
                served_name=served,
                gpu_uuids=gpus,
                image=image,
                port=8000 + i,
                env=env,
            )
        )
        docker.chmod(0o755)
    (out / "compose.yaml").write_text(
        deploy.compose_file(
            params,
            model_dir=str(ctx.model_dir),
            served_name=served,
            gpu_slices=slices,
            image=image,
            env=env,
        )
    )
    (out / "k8s.yaml").write_text(
        deploy.k8s_deployment(
            params,
            name=dns_label(ctx.sla.name),  # any SLA name check accepts
            served_name=served,
            image=image,
            gpus=len(slices[0]),
            model_subpath=ctx.model_dir.name,
            replicas=layout.replicas,
            env=env,
        )
    )
