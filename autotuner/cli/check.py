"""`autotuner check FILE...`: validate SLA files without running anything.

Exit 0 when every file is a valid SLA, else 2 (each problem on stderr, with file and line).
A valid SLA may still get warnings (stderr, exit 0): load levels too small to show a
percentile limit met (:mod:`autotuner.measure.levels`), a confirmation of 2 replicates that
can confirm only a large, closely repeated effect; notes (stdout) say how levels were sized and
what a confirmation with one replicate cannot do.
"""

from __future__ import annotations

import sys

from autotuner.core.errors import BadInput
from autotuner.measure.levels import resolution_notes
from autotuner.models.folder import read_config
from autotuner.search.capacity_compare import two_pair_warning
from autotuner.sla.spec import Sla, SlaError, load_sla


def _report(p: str, sla: Sla) -> None:
    warnings, notes = resolution_notes(sla)
    if sla.tune.confirm.replicates < 2:
        notes.append(
            f"tune.confirm.replicates {sla.tune.confirm.replicates}: a confirmation needs at "
            "least 2 replicates to measure the spread, so none is run and no candidate is "
            "promoted over engine defaults that meet the SLA"
        )
    t = sla.tune
    few = two_pair_warning(t.confirm.replicates, t.confidence, t.capacity_resolution)
    if few is not None:
        warnings.append(few)
    for line in notes:
        print(f"{p}: note: {line}")
    for line in warnings:
        print(f"{p}: warning: {line}", file=sys.stderr)


def check_main(
    paths: list[str],
    *,
    layouts: bool = False,
    assume_gpu: str | None = None,
    engine_version: str | None = None,
) -> int:
    if not paths:
        print("usage: autotuner check SLA_FILE...", file=sys.stderr)
        return 2
    ok = True
    for p in paths:
        try:
            sla = load_sla(p)
        except SlaError as exc:
            ok = False
            print(exc, file=sys.stderr)
        except Exception as exc:  # one file's bug must not stop the check of the others
            ok = False
            print(
                f"{p}: internal error while checking: {type(exc).__name__}: {exc}", file=sys.stderr
            )
        else:
            print(f"OK {p}")
            _report(p, sla)
            if layouts:
                try:
                    for line in layout_lines(sla, assume_gpu, engine_version):
                        print(f"{p}: {line}")
                except BadInput as exc:
                    ok = False
                    print(f"{p}: {exc}", file=sys.stderr)
    return 0 if ok else 2


def layout_lines(sla: Sla, assume_gpu: str | None, engine_version: str | None) -> list[str]:
    """The layouts of ``sla``'s study (autotuner.search.layout_plan), as printed lines.
    Raises BadInput when the plan cannot be made (unknown GPU model, no engine, bad space)."""
    from autotuner.core import hardware
    from autotuner.engines import envs, registry
    from autotuner.measure.launch import data_parallel_mode
    from autotuner.models import synth
    from autotuner.search import layout_plan
    from autotuner.space import SpaceError, load_space_for

    adapter = registry.get(sla.engine.kind)
    if assume_gpu is not None:
        if sla.target.kind != "gpu":
            raise BadInput("--assume-gpu needs a GPU target ({gpus: N} or {gpu: [...]})")
        try:
            hw = layout_plan.assumed_gpus(assume_gpu, len(sla.target.devices))
        except KeyError:
            known = ", ".join(layout_plan.KNOWN_GPUS)
            raise BadInput(f"unknown GPU model {assume_gpu!r}; known: {known}") from None
    else:
        hw = hardware.probe(sla.target)
    if engine_version is None:
        try:
            python, _ = envs.resolve_python(sla.engine.name, sla.engine.python, sla.engine.kind)
            engine_version = envs.probe_version(python)[1]
        except (envs.EngineEnvError, OSError) as exc:
            raise BadInput(f"{exc} (or give --engine-version)") from None
    if sla.model.synth:
        model_cfg = synth.ARCHS[sla.model.synth].config()
    else:
        assert sla.model.path is not None
        model_cfg = read_config(sla.resolve_path(sla.model.path))  # bad input if unusable
    try:
        space = load_space_for(
            adapter.space_name,
            engine_version,
            hw,
            allow_lossy=sla.search.allow_lossy,
            overrides=sla.search.params,
            engine_params=sla.engine.settings(),  # engine.params and engine.args, merged
        )
    except SpaceError as exc:
        raise BadInput(str(exc)) from None
    mode = data_parallel_mode(sla, adapter)
    limit = next((c.limit for c in sla.constraints if c.metric == "peak_memory_gib"), None)
    verdicts = layout_plan.plan(
        space,
        model_cfg=model_cfg,
        hardware=hw,
        engine=adapter,
        env=sla.engine.env,
        baseline=sla.search.baseline,
        mode=mode,
        memory_limit_gib=limit,
    )
    where = f"{hw.gpu_count} x {hw.gpus[0].name}" if hw.gpus else f"the CPU ({hw.cpu.cores} cores)"
    head = (
        f"layouts on {where} ({adapter.display_name} {engine_version}, "
        f"data parallel: {mode}; {sum(v.kept for v in verdicts)} kept of {len(verdicts)})"
    )
    return [head, *(f"  {v.line()}" for v in verdicts)]
