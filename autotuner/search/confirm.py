"""Noise-aware confirmation: is the winner really better than the baseline?

The top candidates and the baseline are re-launched in interleaved order (A B C, B C A, ...),
several replicates each, all at one common load (chosen by the caller: between the baseline's
and the candidate's highest sustained load). A candidate must meet the SLA in every replicate,
and then win in one of two ways:

- goodput: its mean goodput (requests per second meeting every per-request SLO) beats the
  baseline's by more than the larger of the minimum effect and the run-to-run noise measured
  here (the relative range, max-min over mean, of its replicates plus the baseline's); or
- the SLA itself (with at least 3 replicates): the baseline missed the SLA in most of them,
  and the candidate's mean slack (minus the worst constraint margin: how far inside every
  limit it stayed) exceeds the baseline's by more than the two configs' slack ranges added.
  With 2 replicates a range says too little about the noise (an A/A test promoted 4% of the
  time in simulation), so this path needs 3 (0.4%).

Both tests are conservative on purpose: an A/A comparison (one config measured twice) must not
promote. Otherwise the baseline stays, and the decision says why, with the numbers.
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
    slack: float | None = None  # -(worst constraint margin); > 0 means inside every limit


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
        slacks = [r.slack for r in rs if r.slack is not None]
        stats[name] = {
            "replicates": len(rs),
            "slack_mean": mean(slacks) if slacks else None,
            "slack_range": (max(slacks) - min(slacks)) if slacks else None,
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
        if effect <= threshold and not _wins_on_sla(s, base):
            note = (
                f"{c} changed goodput by {effect:+.1%} against the baseline, not more than "
                f"the threshold {threshold:.1%}"
            )
            if base["feasible_all"]:
                note += ", and the baseline met the SLA in every replicate too"
            else:
                note += ", and its lead inside the SLA's limits was within the noise"
            notes.append(note)
            continue
        if best is None or effect > best[0]:
            best = (effect, c, threshold)
    if best is None:
        reason = "kept the baseline: " + ("; ".join(notes) or "no candidate to confirm")
        return Decision("baseline", True, None, threshold, noise, reason, stats)
    effect, name, threshold = best
    s = stats[name]
    if effect > threshold:
        reason = (
            f"{name} beat the baseline by {effect:+.1%} mean goodput, above the threshold "
            f"{threshold:.1%} (the larger of the minimum effect {min_effect:.0%} and the "
            "replicates' spread), and met the SLA in every replicate"
        )
    else:
        reason = (
            f"{name} met the SLA in all {s['replicates']} replicates while the baseline missed "
            f"it in {base['replicates'] - base['feasible_count']} of {base['replicates']}; its "
            f"mean slack {s['slack_mean']:+.1%} vs the baseline's {base['slack_mean']:+.1%} "
            "differs by more than their ranges added"
        )
    return Decision(name, False, effect, threshold, noise, reason, stats)


def _wins_on_sla(cand: dict[str, Any], base: dict[str, Any]) -> bool:
    """Candidate inside the SLA every time, baseline mostly outside, gap beyond the noise."""
    if cand["slack_mean"] is None or base["slack_mean"] is None:
        return False
    base_missed = base["replicates"] - base["feasible_count"]
    if min(cand["replicates"], base["replicates"]) < 3:
        return False
    if not cand["feasible_all"] or 2 * base_missed <= base["replicates"]:
        return False
    gap = cand["slack_mean"] - base["slack_mean"]
    return bool(gap > cand["slack_range"] + base["slack_range"])


def _effect(cand: float, base: float) -> float:
    if base > 0:
        return (cand - base) / base
    return 1.0 if cand > 0 else 0.0  # the baseline served nothing well: count it as +100%
