"""The search space of one study, and what must stay the same within it (its identity)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from autotuner.core.hardware import HardwareProfile
from autotuner.engines.base import EngineAdapter
from autotuner.search.study import Grid
from autotuner.sla.spec import Sla
from autotuner.space import ParamOverride, SearchSpace, SpaceError, load_space_for
from autotuner.space import ParamValue as SpaceValue


def study_space(
    sla: Sla, adapter: EngineAdapter, version: str, hw: HardwareProfile
) -> tuple[SearchSpace, Grid | None, dict[str, SpaceValue]]:
    """The space the study searches; for a grid study also its grid and the grid's one-value
    dimensions (:func:`grid_space`), else None and {}."""
    load = partial(_load, sla, adapter, version, hw)
    space = load(sla.search.params)
    if sla.tune.sampler != "grid":
        return space, None, {}
    return grid_space(space, sla.search.params, load)


def _load(
    sla: Sla,
    adapter: EngineAdapter,
    version: str,
    hw: HardwareProfile,
    overrides: Mapping[str, ParamOverride],
) -> SearchSpace:
    return load_space_for(
        adapter.space_name,
        version,
        hw,
        allow_lossy=sla.search.allow_lossy,
        overrides=overrides,
        engine_params=sla.engine.settings(),  # engine.params and engine.args, merged
    )


def grid_space(
    space: SearchSpace,
    overrides: Mapping[str, ParamOverride],
    load: Callable[[Mapping[str, ParamOverride]], SearchSpace],
) -> tuple[SearchSpace, dict[str, list[SpaceValue]], dict[str, SpaceValue]]:
    """The space of a grid study, its grid, and the grid's one-value dimensions.

    Only the parameters the SLA lists with ``values`` are tuned; every other one is excluded
    (the engine decides), so ``load`` resolves the space again with those exclusions. A
    one-value list (``gpu_memory_utilization: {values: [0.9]}``) is a dimension of the grid,
    given to every grid point but not to the baseline, which stays the engine defaults.
    """
    listed = [n for n, o in overrides.items() if o.values is not None]
    off = {p.name: ParamOverride(exclude=True) for p in space.params if p.name not in listed}
    narrowed = load({**overrides, **off}) if off else space
    single = {n: narrowed.fixed[n] for n in listed if narrowed.fixed_by.get(n) == "only value left"}
    grid = {p.name: list(p.choices or ()) for p in narrowed.params}
    if not grid:
        raise SpaceError(["tune.sampler grid: no parameter of search.params has two values left"])
    fixed = {k: v for k, v in narrowed.fixed.items() if k not in single}
    return dataclasses.replace(narrowed, fixed=fixed), grid, single


def identity(
    sla: Sla,
    engine: str,
    space: SearchSpace,
    model_dir: Path,
    hw: HardwareProfile,
    grid: Grid | None = None,
) -> dict[str, str]:
    """What must not change within one study, or its trials stop being comparable."""
    workload = json.dumps(sla.workload.model_dump(mode="json"), sort_keys=True)
    extra = {"grid": json.dumps(grid, sort_keys=True)} if grid is not None else {}
    return {
        **extra,
        "engine": engine,
        "space": space.hash()[:16],
        "model": hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()[:16],
        "target": f"{sla.target.kind}:{','.join(sla.target.devices)}",
        "workload": hashlib.sha256(workload.encode()).hexdigest()[:16],
        "constraints": json.dumps({c.key: c.limit for c in sla.constraints}, sort_keys=True),
    }
