"""The layouts a study would launch, decided without a launch (``autotuner check --layouts``).

Every tensor x data parallel combination up to the target's GPUs (powers of two, and one size
past them so that "more than the GPUs" is shown) is put through the engine's rules (heads,
layers, GPU count, memory per GPU) and the SLA's memory limit; what passes is kept when the
SLA's search reaches it (its ``values`` for the engine's tensor / data parallel options, vLLM's
``tensor_parallel_size`` / ``data_parallel_size``, else the engine default 1). Each kept layout
shows what the memory model gives one GPU.

The hardware is the target's as probed, or an assumed GPU model (``--assume-gpu h200``) so
that a plan for a machine one does not have can be checked here.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotuner.core.hardware import CpuInfo, GpuInfo, HardwareProfile
from autotuner.core.types import ParamValue
from autotuner.engines.base import EngineAdapter
from autotuner.engines.layout import Layout
from autotuner.search import rules
from autotuner.space import SearchSpace

GIB = 2**30

# GPUs one can plan for without having them: NVML's memory total and compute capability.
KNOWN_GPUS: dict[str, tuple[str, int, tuple[int, int]]] = {
    "h200": ("NVIDIA H200", 150_754_820_096, (9, 0)),  # 143,771 MiB, as NVML reports it
    "h100": ("NVIDIA H100 80GB HBM3", 85_520_809_984, (9, 0)),
    "a100-80gb": ("NVIDIA A100-SXM4-80GB", 85_899_345_920, (8, 0)),
    "l40s": ("NVIDIA L40S", 48_305_799_168, (8, 9)),
}


def assumed_gpus(name: str, count: int) -> HardwareProfile:
    """A profile of ``count`` GPUs of a known model (``KNOWN_GPUS``) on an unknown host.
    Raises KeyError for a model it does not know."""
    label, total, cc = KNOWN_GPUS[name.lower()]
    gpus = tuple(GpuInfo(i, f"GPU-assumed-{i}", label, cc, total) for i in range(count))
    host = CpuInfo("assumed host", 64, 64, 1024 * GIB, 1024 * GIB)
    return HardwareProfile(device="gpu", cpu=host, gpus=gpus)


@dataclass(frozen=True)
class LayoutVerdict:
    layout: Layout
    kept: bool
    why: str  # why dropped; for a kept one, what one GPU holds
    baseline: bool = False
    unit: str = "GPU"  # what a device is: a GPU, or on a CPU target an engine rank

    def line(self) -> str:
        mark = "keep" if self.kept else "drop"
        base = " [baseline]" if self.baseline else ""
        return f"{mark}  {self.layout.describe(self.unit)}{base}: {self.why}"


def _searched(space: SearchSpace, name: str | None) -> tuple[ParamValue, ...]:
    """The values the study gives ``name``: its choices when searched, else the fixed value
    (or the engine default 1; an engine without the option: 1)."""
    if name is None:
        return (1,)
    if any(p.name == name for p in space.params):
        choices = space.param(name).choices
        if choices is not None:
            return tuple(choices)
    return (space.fixed.get(name, 1),)


def plan(
    space: SearchSpace,
    *,
    model_cfg: Mapping[str, Any],
    hardware: HardwareProfile,
    engine: EngineAdapter,
    env: Mapping[str, str],
    baseline: Mapping[str, ParamValue],
    mode: str,
    memory_limit_gib: float | None = None,
) -> list[LayoutVerdict]:
    """Every candidate layout with its verdict, the smallest first (module docstring)."""
    top = max(hardware.gpu_count, 1)
    sizes = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= 2 * top]
    roles = engine.roles
    tp_name, dp_name = roles.tensor_parallel, roles.data_parallel
    tps, dps = _searched(space, tp_name), _searched(space, dp_name)
    base = {**space.fixed, **baseline}
    unit = "GPU" if hardware.device == "gpu" else "rank"
    out = []
    tp_sizes = sizes if tp_name is not None else [1]
    dp_sizes = sizes if dp_name is not None else [1]
    for tp, dp in itertools.product(tp_sizes, dp_sizes):
        if tp * dp > 2 * top:
            continue
        params: dict[str, ParamValue] = dict(space.fixed)
        params.update({k: v for k, v in ((tp_name, tp), (dp_name, dp)) if k is not None})
        layout = Layout.of(params, roles, "replicas" if mode == "replicas" else "engine")
        reasons = rules.check(
            params,
            model_cfg=model_cfg,
            hardware=hardware,
            context_len=None,
            env=env,
            engine=engine,
        )
        over = memory_limit_reason(params, hardware, memory_limit_gib, engine)
        if over:
            reasons.append(over)
        is_base = Layout.of(base, roles) == Layout.of(params, roles)
        if reasons:
            out.append(LayoutVerdict(layout, False, "; ".join(reasons), is_base, unit))
            continue
        if tp not in tps or dp not in dps:
            why = "fits, but outside the SLA's search values"
            out.append(LayoutVerdict(layout, False, why, is_base, unit))
            continue
        est = engine.estimate_memory(model_cfg, params, hardware, env=env, check_free=False)
        why = (
            f"per {unit} {est.weights_bytes / GIB:.1f} GiB of weights, "
            f"{est.kv_budget_bytes / GIB:.1f} GiB of KV cache ({est.kv_tokens:,} tokens)"
        )
        out.append(LayoutVerdict(layout, True, why, is_base, unit))
    return sorted(out, key=lambda v: (v.layout.devices, v.layout.tp))


def memory_limit_reason(
    params: Mapping[str, ParamValue],
    hw: HardwareProfile,
    limit_gib: float | None,
    engine: EngineAdapter,
) -> str | None:
    """The SLA's memory limit as a hard constraint before launch: a GPU engine claims its
    memory pool up front (``engine``'s ``memory_claim``), so that claim decides."""
    if limit_gib is None:
        return None
    claim = engine.memory_claim(params, hw)
    if claim is None:
        return None
    if claim.gib > limit_gib:
        return (
            f"would take {claim.gib:.1f} GiB ({claim.how}) "
            f"> the SLA's max_gpu_memory_gib {limit_gib:g}"
        )
    return None
