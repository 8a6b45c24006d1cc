"""The answer when no measured config met the SLA: the config that came closest, which limit
it missed by how much at the SLA's own load, the load at which it does hold every limit (the
sustainable load, :mod:`autotuner.measure.sustainable`), and what the SLA's load would take
in data-parallel copies of the config that needs the fewest devices for it.

The copies are a plan, not a measurement: one copy was measured to hold its share of the
load, and the plan assumes copies on their own devices add up (each gets 1/N of the
requests). No layout of that many copies was launched, and the words say so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotuner.records.trial import SustainableRecord


@dataclass(frozen=True)
class Missed:
    """One measured config that missed the SLA."""

    label: str  # "baseline", "trial-3"
    margins: Mapping[str, float]  # per constraint key at the SLA's own load (> 0: missed)
    sustainable: SustainableRecord | None  # where it held every limit below that load
    devices: int  # devices one copy takes (tensor x pipeline x data parallel)


@dataclass(frozen=True)
class Replicas:
    """The SLA's load spread over ``copies`` data-parallel copies of ``config``."""

    config: Missed
    copies: int
    devices: int  # copies x devices of one copy


def closest(launches: Sequence[Missed]) -> tuple[Missed, str, float] | None:
    """The config whose worst constraint margin is the smallest, with that constraint and
    margin (None when no launch recorded margins)."""
    best: tuple[Missed, str, float] | None = None
    for m in launches:
        if m.margins:
            key, worst = max(m.margins.items(), key=lambda kv: kv[1])
            if best is None or worst < best[2]:
                best = (m, key, worst)
    return best


def replicas(launches: Sequence[Missed]) -> Replicas | None:
    """The plan that takes the fewest devices for the SLA's load (ties: the config that holds
    the most per copy); None when no config held its limits at any load."""
    plans = []
    for m in launches:
        held = m.sustainable
        copies = held.replicas() if held is not None else None
        if held is not None and copies is not None:
            plans.append((copies * m.devices, -held.value, Replicas(m, copies, copies * m.devices)))
    if not plans:
        return None
    return min(plans, key=lambda p: (p[0], p[1]))[2]


def _devices(n: int, unit: str) -> str:
    return f"{n} {unit}" + ("" if n == 1 else "s")


def answer(launches: Sequence[Missed], device_unit: str = "GPU") -> str:
    """``; the closest: trial-3, p99_tpot_ms missed by 12% at the SLA's own load; it holds
    ...`` ("" when nothing was recorded). ``device_unit``: "GPU", or "engine rank" on a CPU
    target."""
    near = closest(launches)
    if near is None:
        return ""
    m, key, worst = near
    by = f"by {worst:.0%}" if math.isfinite(worst) else "(not measurable)"
    out = f"; the closest: {m.label}, {key} missed {by} at the SLA's own load"
    if m.sustainable is not None:
        out += f"; it {m.sustainable.describe()}"
    plan = replicas(launches)
    if plan is None:
        return out
    held = plan.config.sustainable
    assert held is not None  # a plan comes only from a config that held
    who = plan.config.label
    if plan.config is not m:
        one = _devices(plan.config.devices, device_unit)
        who += f" (holds up to {held.value:.3g} {held.unit} on {one})"
    return (
        f"{out}; the SLA's {held.target:.3g} {held.unit} would take {plan.copies} data-parallel "
        f"copies of {who}, {_devices(plan.devices, device_unit)} in all: a plan from the load "
        "one copy held, not a measurement (no layout of that many copies was launched)"
    )
