"""Noise-aware confirmation: is the winner really better than the baseline?

The top candidates and the baseline are re-launched in interleaved order (A B C, B C A, ...),
several replicates each, all at one common load: the highest load the top candidate sustained
during the search. The statistic is goodput at that load (requests per second that met every
per-request SLO). A candidate is promoted only when it met the SLA in every replicate and its
mean goodput beats the baseline's by more than the larger of the minimum effect and the
run-to-run noise measured here: the relative range (max-min over mean) of the candidate's
replicates plus that of the baseline's. Conservative on purpose: an A/A comparison (one config
measured twice) must not promote. Otherwise the baseline stays, and the decision says why,
with the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import mean
from typing import Any


@dataclass(frozen=True)
class Replicate:
    config: str  # "baseline" or "trial-<n>"
    replicate: int
    goodput: float | None
    feasible: bool
    metrics: dict[str, float | None]
    run_dir: str


@dataclass(frozen=True)
class Decision:
    promoted: str  # config label
    promoted_is_baseline: bool
    effect: float | None  # relative goodput win of the promoted candidate over the baseline
    threshold: float  # what the win had to exceed
    noise: float  # run-to-run spread measured
    reason: str
    per_config: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def interleaved_order(configs: Sequence[str], replicates: int) -> list[tuple[int, str]]:
    """Replicate r runs the configs rotated by r, so no config always goes first."""
    order = []
    for r in range(replicates):
        k = r % len(configs)
        for c in [*configs[k:], *configs[:k]]:
            order.append((r, c))
    return order


def spread(values: Sequence[float]) -> float:
    """Relative range of replicates (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return (max(values) - min(values)) / m if m > 0 else 0.0


def decide(reps: Sequence[Replicate], candidates: Sequence[str], min_effect: float) -> Decision:
    """Pick the promoted config from confirmation replicates (see the module docstring)."""
    by: dict[str, list[Replicate]] = {}
    for r in reps:
        by.setdefault(r.config, []).append(r)
    stats: dict[str, dict[str, Any]] = {}
    for name, rs in by.items():
        goods = [r.goodput or 0.0 for r in rs]
        stats[name] = {
            "replicates": len(rs),
            "goodput_mean": mean(goods),
            "goodput_min": min(goods),
            "goodput_max": max(goods),
            "goodput_spread": spread(goods),
            "feasible_all": all(r.feasible for r in rs),
            "feasible_count": sum(r.feasible for r in rs),
        }
    noise = max((s["goodput_spread"] for s in stats.values()), default=0.0)
    base = stats.get("baseline")
    if base is None:
        raise ValueError("confirmation needs baseline replicates")
    best: tuple[float, str, float] | None = None
    threshold = min_effect
    notes = []
    for c in candidates:
        s = stats.get(c)
        if s is None:
            continue
        if not s["feasible_all"]:
            notes.append(
                f"{c} missed the SLA in {s['replicates'] - s['feasible_count']} "
                f"of {s['replicates']} replicates"
            )
            continue
        effect = _effect(s["goodput_mean"], base["goodput_mean"])
        threshold = max(min_effect, s["goodput_spread"] + base["goodput_spread"])
        if effect <= threshold:
            notes.append(
                f"{c} beat the baseline by {effect:+.1%}, not more than the "
                f"threshold {threshold:.1%}"
            )
            continue
        if best is None or effect > best[0]:
            best = (effect, c, threshold)
    if best is None:
        reason = "kept the baseline: " + ("; ".join(notes) or "no candidate to confirm")
        return Decision("baseline", True, None, threshold, noise, reason, stats)
    effect, name, threshold = best
    reason = (
        f"{name} beat the baseline by {effect:+.1%} mean goodput, above the threshold "
        f"{threshold:.1%} (the larger of the minimum effect {min_effect:.0%} and the "
        "replicates' spread), and met the SLA in every replicate"
    )
    return Decision(name, False, effect, threshold, noise, reason, stats)


def _effect(cand: float, base: float) -> float:
    if base > 0:
        return (cand - base) / base
    return 1.0 if cand > 0 else 0.0  # the baseline served nothing well: count it as +100%
