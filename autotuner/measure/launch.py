"""Launch helpers: the model directory, the engine options and the engine process of one
config, for every stage that launches an engine (bench, trial, quality gate, kernel profile,
tune).

The engine adapter is resolved once per study, where the study starts (the CLI commands,
:mod:`autotuner.pipeline.tune`), and handed to these functions; nothing here looks an engine
up by its kind.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from autotuner.core import confined
from autotuner.core.types import ParamValue
from autotuner.engines.base import EngineAdapter, EngineProcess, LaunchSpec
from autotuner.engines.cores import share_cores, usable_cpus
from autotuner.engines.layout import Layout, Mode, resolve_mode
from autotuner.engines.replicas import ReplicaSet, rank_binding, replica_specs
from autotuner.models import synth
from autotuner.sla.spec import Sla

Say = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def resolve_model(sla: Sla, say: Say = _stderr) -> Path:
    """The model directory; a synthetic model is generated on first use."""
    if sla.model.synth:
        target = synth.default_model_dir(sla.model.synth)
        if not (target / "autotuner-synth.json").exists():
            say(f"generating model {sla.model.synth} in {target} ...")
        return synth.synthesize(sla.model.synth, target)
    assert sla.model.path is not None
    # a daemon job: the folder and every link in it must still resolve where it may read
    path = confined.check_tree(sla.resolve_path(sla.model.path))
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model directory {path} has no config.json")
    return path


def engine_params(
    sla: Sla,
    model_dir: Path,
    overrides: Mapping[str, ParamValue] | None = None,
    *,
    engine: EngineAdapter,
) -> dict[str, ParamValue]:
    """SLA parameters (``engine.params`` and ``engine.args``, merged) + overrides; weightless
    (architecture-only) models load random weights (the engine's options for that, e.g. a
    dummy load format)."""
    params: dict[str, ParamValue] = dict(sla.engine.settings())
    params.update(overrides or {})
    if synth.needs_dummy_load(model_dir):
        for key, value in engine.random_weights.items():
            params.setdefault(key, value)
    return params


def data_parallel_mode(sla: Sla, engine: EngineAdapter) -> Mode:
    """How the study runs data parallelism: the SLA's ``search.data_parallel`` (``auto``: the
    engine's own flag where its adapter lists a data-parallel option, else replicas)."""
    dp = engine.roles.data_parallel
    return resolve_mode(sla.search.data_parallel, dp is not None and dp in engine.options)


def layout_of(sla: Sla, params: Mapping[str, ParamValue], engine: EngineAdapter) -> Layout:
    """The layout ``params`` take under the SLA's way of running data parallelism."""
    return Layout.of(params, engine.roles, data_parallel_mode(sla, engine))


def make_engine(
    sla: Sla,
    python: Path,
    model_dir: Path,
    params: Mapping[str, ParamValue],
    log_path: Path,
    cuda_devices: list[str] | None = None,
    *,
    engine: EngineAdapter,
    tuner_args: Sequence[str] = (),
    tuner_env: Mapping[str, str] | None = None,
) -> EngineProcess:
    """The ``engine`` process of ``params`` (not started).

    ``cuda_devices`` None: the SLA's target devices (none on a CPU target). ``tuner_args`` and
    ``tuner_env`` are the tuner's own additions (the engine's profiler), after the SLA's.
    """
    if cuda_devices is None and sla.target.kind != "cpu":
        cuda_devices = list(sla.target.devices)
    layout = layout_of(sla, params, engine)
    if cuda_devices is not None and layout.replicas == 1 and len(cuda_devices) > layout.devices:
        # One server sees only the GPUs its layout takes (TP=2 of a 4-GPU target: two).
        cuda_devices = cuda_devices[: layout.devices]
    spec = LaunchSpec(
        python=python,
        model=model_dir,
        served_name=sla.model.served_name or sla.model.synth or model_dir.name,
        params=layout.engine_params(params),
        log_path=log_path,
        # engine.args are in ``params`` (sla.engine.settings): the options once, as recorded.
        extra_args=tuple(tuner_args),
        env={**sla.engine.env, **(tuner_env or {})},
        cuda_devices=None if cuda_devices is None else tuple(cuda_devices),
        startup_timeout_s=sla.engine.startup_timeout_s,
    )
    cpus = usable_cpus()
    bind = engine.cpu_bind_env
    if spec.cuda_devices is None and not (bind and bind in spec.env):
        # A CPU target: the load generator keeps a core of its own where one can be spared.
        cpus = list(share_cores(cpus, layout.devices).engine)
        spec = dataclasses.replace(spec, cpus=tuple(cpus))
    if layout.replicas == 1:
        return engine.process(rank_binding(spec, layout, bind, cpus))
    return ReplicaSet(
        [engine.process(replica) for replica in replica_specs(spec, layout, bind, cpus)]
    )
