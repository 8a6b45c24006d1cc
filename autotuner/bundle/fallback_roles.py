"""Which measured configs the fallback plan offers, and for what (their roles).

A fallback is worth listing when it covers a way the promoted config can fail: the Pareto
points beside it, and among every feasible config the study measured (best-ranked first):

- per hardware-specific setting of the promoted config (fp8 needs compute capability 8.9),
  the best config without it: what to run on a device that lacks it ("no fp8");
- for a promoted config with lossy settings, the best lossless one;
- the best config that measured less peak memory ("less memory");
- the best config on fewer GPUs ("fewer GPUs");
- the next best config, so that a study with one objective (whose Pareto front is one
  point) still lists one when it measured several;
- the baseline (engine defaults), last.

Configs with lossy settings are left out: only a promoted config passes the quality gate, so
no other lossy config is known to keep the SLA's output quality.

:func:`hardware_notes` then says, per hardware-specific setting, which fallback to run
without it and the capacity the study measured for it, or that none was measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotuner.bundle.fallback_plan import Fallback
from autotuner.bundle.metric_names import format_change
from autotuner.core.types import ParamValue
from autotuner.engines.base import OptionRoles
from autotuner.engines.layout import devices_used
from autotuner.search.capability import SettingTraits
from autotuner.search.pareto import Candidate

MEMORY_MARGIN = 0.02  # a peak this much lower or less is measurement noise


@dataclass(frozen=True)
class Pick:
    """A fallback and the roles it fills."""

    cand: Candidate
    roles: tuple[str, ...]

    @property
    def title(self) -> str:
        if self.cand.baseline:
            extra = [r for r in self.roles if r != "engine defaults"]
            return "baseline (engine defaults)" + (f": {', '.join(extra)}" if extra else "")
        return f"trial {self.cand.trial} ({', '.join(self.roles)})"


def without(name: str, value: ParamValue) -> str:
    """The role of a config that does without the promoted config's ``name=value``."""
    return "no fp8" if "fp8" in str(value).lower() else f"no {name}={value}"


def pick(
    chosen: Candidate,
    front: Sequence[Candidate],
    feasible: Sequence[Candidate],
    base: Candidate | None,
    traits: SettingTraits,
    device: str,
    *,
    engine_roles: OptionRoles,
) -> list[Pick]:
    """The fallbacks of ``chosen`` in plan order (module docstring); ``front`` and
    ``feasible`` ranked best first; ``engine_roles`` name the layout's options (fewer GPUs)."""
    roles: dict[int, list[str]] = {}
    cands: dict[int, Candidate] = {}

    def add(c: Candidate | None, role: str) -> None:
        if c is None or c.trial == chosen.trial:
            return
        cands[c.trial] = c
        mine = roles.setdefault(c.trial, [])
        if role not in mine:
            mine.append(role)

    others = [
        c for c in feasible if c.trial != chosen.trial and not traits.lossy_settings(c.params)
    ]
    for c in front:
        if not traits.lossy_settings(c.params):
            add(c, "Pareto point")
    needs = traits.hardware_needs(chosen.params, device)
    for name in needs:
        value = chosen.params[name]
        alt = next((c for c in others if c.params.get(name) != value), None)
        add(alt, without(name, value))
    lossy = traits.lossy_settings(chosen.params)
    if lossy:
        alt = next((c for c in others if not traits.lossy_settings(c.params)), None)
        add(alt, "no fp8" if any("fp8" in str(v) for v in lossy.values()) else "lossless")
    peak = chosen.metrics.get("peak_memory_gib")
    if peak is not None:
        less = [c for c in others if _below(c.metrics.get("peak_memory_gib"), peak)]
        add(less[0] if less else None, "less memory")
    gpus = devices_used(chosen.params, engine_roles)
    fewer = (c for c in others if devices_used(c.params, engine_roles) < gpus)
    add(next(fewer, None), "fewer GPUs")
    tuned = [c for c in others if not c.baseline]  # the baseline is listed anyway
    if tuned and tuned[0].trial not in roles:
        add(tuned[0], "next best")
    if base is not None and base.trial != chosen.trial:
        add(base, "engine defaults")
        # The baseline stays last whatever else it covers.
        roles[base.trial] = roles.pop(base.trial)
    return [Pick(cands[t], tuple(r)) for t, r in roles.items()]


def _below(value: float | None, peak: float) -> bool:
    return value is not None and value < peak * (1 - MEMORY_MARGIN)


def hardware_notes(
    params: Mapping[str, ParamValue],
    fallbacks: Sequence[Fallback],
    traits: SettingTraits,
    device: str,
    unit: str,
) -> list[str]:
    """Per hardware-specific or lossy setting of the promoted ``params``: which fallback runs
    without it and what the study measured for it (its capacity and the change)."""
    out = []
    needs = traits.hardware_needs(params, device)
    for name in traits.lossy_settings(params):
        needs.setdefault(name, "")
    for name, need in needs.items():
        value = params[name]
        setting = f"`{name}={value}` needs {need}" if need else f"`{name}={value}`"
        if traits.is_lossy(name, value):
            setting += " and changes outputs" if need else " changes outputs"
        fb = next((f for f in fallbacks if f.params.get(name) != value), None)
        if fb is None:
            default = traits.defaults.get(name)
            out.append(
                f"{setting}: no config without it was measured in this study; without it, "
                f"set `{name}` to {default if default is not None else 'the engine default'} "
                "(not measured)"
            )
            continue
        cap = fb.metrics.get("capacity")
        basis = fb.basis.get("capacity", "single run")
        measured = (
            "capacity not measured"
            if cap is None
            else f"capacity {cap:.3g} {unit} ({basis}), "
            f"{format_change('capacity', fb.cost.get('capacity'))} against the promoted config"
        )
        shown = fb.params.get(name, traits.defaults.get(name))
        its = f"`{name}={shown}`" if shown is not None else f"`{name}` the engine default"
        out.append(
            f"{setting}: on a device without it (or to keep outputs) run fallback {fb.rank}, "
            f"{fb.label} ({its}): {measured}"
        )
    return out
