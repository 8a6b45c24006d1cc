"""The entry points: the search space of an engine version for one target and SLA."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from autotuner.space.context import _Context
from autotuner.space.errors import SpaceError
from autotuner.space.files import read_space_file, space_file
from autotuner.space.overrides import ParamOverride
from autotuner.space.resolve import _Resolver
from autotuner.space.resolved import SearchSpace
from autotuner.space.values import Device, ParamValue
from autotuner.space.versions import _version_number, parse_version, version_in

if TYPE_CHECKING:
    from autotuner.core.hardware import HardwareProfile


def load_space(
    engine: str,
    version: str,
    *,
    device: Device,
    gpu_count: int,
    compute_capability: tuple[int, int] | None,
    allow_lossy: bool,
    overrides: Mapping[str, ParamOverride],
    engine_params: Mapping[str, ParamValue] | None = None,
    cpu_flags: Collection[str] | None = None,
    path: Path | None = None,
) -> SearchSpace:
    """Resolve the engine's search space for one context.

    ``version`` is the engine's version text (``"0.32.0"``, ``"vllm 0.32.0 (cpu)"``).
    ``compute_capability`` / ``cpu_flags`` None mean unknown: nothing is dropped for them.
    ``engine_params`` are the SLA's fixed options: passed as they are (also options the space
    does not declare, e.g. ``max_model_len``) and never tuned. ``path`` picks a file instead
    of ``search_spaces/<engine>*.yaml``. Raises :class:`SpaceError` listing every problem
    (unknown override names, values of the wrong type, lossy values without ``allow_lossy``,
    options the version lacks, ...).
    """
    try:
        parsed = parse_version(version)
    except ValueError as e:
        raise SpaceError([str(e)]) from e
    file = path or space_file(engine, version)
    spec = read_space_file(file)
    if spec.engine != engine:
        raise SpaceError([f"{file}: declares engine {spec.engine!r}, not {engine!r}"])
    if not version_in(parsed, spec.versions):
        raise SpaceError([f"{file} covers {engine} {spec.versions}, not {version}"])
    ctx = _Context(
        version=parsed,
        version_text=_version_number(version),
        device=device,
        gpu_count=gpu_count,
        compute_capability=compute_capability,
        cpu_flags=frozenset(cpu_flags) if cpu_flags is not None else None,
        allow_lossy=allow_lossy,
    )
    r = _Resolver(spec, ctx, overrides, dict(engine_params or {}))
    r.run()
    if r.problems:
        raise SpaceError(r.problems)
    return SearchSpace(
        engine=engine,
        version=version,
        device=device,
        params=r.params,
        fixed=r.fixed,
        dropped=r.dropped,
        defaults={d.name: d.default for d in spec.params},
        fixed_by=r.fixed_by,
        source=str(file),
    )


def load_space_for(
    engine: str,
    version: str,
    hardware: HardwareProfile,
    *,
    allow_lossy: bool,
    overrides: Mapping[str, ParamOverride],
    engine_params: Mapping[str, ParamValue] | None = None,
) -> SearchSpace:
    """:func:`load_space` with the device facts taken from a ``HardwareProfile``."""
    return load_space(
        engine,
        version,
        device=hardware.device,
        gpu_count=hardware.gpu_count,
        compute_capability=hardware.compute_capability,
        allow_lossy=allow_lossy,
        overrides=overrides,
        engine_params=engine_params,
        cpu_flags=hardware.cpu.flags,
    )
