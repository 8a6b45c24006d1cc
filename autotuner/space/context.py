"""The context a space is resolved for (engine version, device and hardware, whether lossy
settings are allowed), and whether a value's hardware requirement holds in it."""

from __future__ import annotations

from dataclasses import dataclass

from autotuner.space.schema import _Requirement
from autotuner.space.values import Device, ParamValue, _member


@dataclass
class _Context:
    version: tuple[int, ...]
    version_text: str
    device: Device
    gpu_count: int
    compute_capability: tuple[int, int] | None
    cpu_flags: frozenset[str] | None
    allow_lossy: bool


def _parse_cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def _unmet(req: _Requirement, value: ParamValue, ctx: _Context) -> str | None:
    """Why ``value`` can't run on this hardware under ``req``; None when it can (or unknown)."""
    if req.values is not None and not _member(value, req.values):
        return None
    if (
        req.at_most_gpus
        and ctx.device == "gpu"
        and isinstance(value, int)
        and value > max(ctx.gpu_count, 1)
    ):
        return f"more than the target's {ctx.gpu_count} GPU(s)"
    if ctx.device == "gpu" and req.compute_capability and ctx.compute_capability is not None:
        need = _parse_cc(req.compute_capability)
        if ctx.compute_capability < need:
            have = ".".join(map(str, ctx.compute_capability))
            return f"needs compute capability >= {req.compute_capability} (have {have})"
    if (
        ctx.device == "cpu"
        and req.cpu_flags_any
        and ctx.cpu_flags is not None
        and not set(req.cpu_flags_any) & ctx.cpu_flags
    ):
        return f"needs one of the CPU flags {', '.join(req.cpu_flags_any)}"
    return None
