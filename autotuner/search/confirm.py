"""Confirmation by capacity: does a candidate really serve more than the engine defaults?

The search measured every config once; one capacity search has a resolution (its bracket) and
run-to-run noise on top. Before anything is promoted over the baseline:

1. **Worth it?** Only candidates whose search capacity leads the baseline's by more than the
   resolution are confirmed (:func:`select_for_confirmation`); when none does, nothing is
   launched and the decision says so. Neither is anything launched when the replicates could
   not decide (fewer than 2: no spread to measure): the decision says that too.
2. **Replicates.** The baseline and the chosen candidates are launched again in interleaved
   order (A B, B A, ...: :func:`interleaved_order`), ``tune.confirm.replicates`` times each.
   Each launch is a narrow capacity search around that config's own claimed capacity
   (``CapacitySearch.around``), never below the SLA's own load: a config that misses the SLA
   there has capacity 0 in that replicate.
3. **Decision.** Per candidate, :func:`compare_capacity` on the paired replicates (log-ratios,
   Student t interval, a spread floor from the resolution). Only ``better`` promotes (the
   largest effect among the better ones); otherwise the baseline stays, and the reason gives
   each candidate's effect with its interval.

Without a measured baseline (it failed to start) there is nothing to compare with: the lead
is re-measured alone and promoted when it met the SLA at its own load in every replicate.
A baseline that missed the SLA in the search only on limits the load does not move (peak
memory: the engine reserves its pool at start) is not launched again: no load would change
that, so its replicates are capacity 0 by construction (:func:`fixed_misses`,
:func:`known_zero`); on an H200 this saved two launches (about 5 GPU-minutes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import asdict, dataclass, field, replace
from statistics import fmean
from typing import TYPE_CHECKING, Any

from autotuner.core.types import ParamValue
from autotuner.engines.layout import CAPACITY_PER_GPU, devices_used
from autotuner.search.capacity_compare import CapacityComparison, compare_capacity

if TYPE_CHECKING:
    from autotuner.sla.spec import Sla


@dataclass(frozen=True)
class Replicate:
    """One confirmation launch of one config."""

    config: str  # "baseline" or "trial-<n>"
    replicate: int
    capacity: float | None  # None: the launch failed; 0: missed the SLA at its own load
    low: float | None  # the capacity's bracket
    high: float | None
    stopped_by: str | None
    goodput: float | None  # goodput at capacity (the highest level that met the SLA)
    feasible: bool  # met the SLA at its own load (capacity > 0)
    metrics: dict[str, float | None]  # at that level (the first level when none met)
    run_dir: str


@dataclass(frozen=True)
class Decision:
    """What promotion does, and why (the manifest's ``decision``)."""

    promoted: str  # config label
    promoted_is_baseline: bool
    reason: str
    confirmed: bool  # replicates were run and decided it
    effect: float | None = None  # the promoted candidate's capacity over the baseline's, - 1
    effect_low: float | None = None  # its confidence interval
    effect_high: float | None = None
    confidence: float | None = None
    min_effect: float | None = None
    verdict: str | None = None  # compare_capacity's verdict for the promoted (or best) one
    basis: str = "capacity"
    # Per config: the capacities of its replicates (mean, min, max, count, met the SLA).
    per_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Per candidate: its comparison with the baseline.
    comparisons: dict[str, dict[str, Any]] = field(default_factory=dict)

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
    """Relative range of replicates, (max - min) / mean (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    m = fmean(values)
    return (max(values) - min(values)) / m if m > 0 else 0.0


def config_stats(reps: Sequence[Replicate]) -> dict[str, dict[str, Any]]:
    """Per config: its replicates' capacities and goodputs at capacity."""
    by: dict[str, list[Replicate]] = {}
    for r in reps:
        by.setdefault(r.config, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for name, rs in by.items():
        caps = [r.capacity for r in rs if r.capacity is not None]
        goods = [r.goodput for r in rs if r.goodput is not None]
        out[name] = {
            "replicates": len(rs),
            "capacities": [r.capacity for r in rs],
            "capacity_mean": fmean(caps) if caps else None,
            "capacity_min": min(caps) if caps else None,
            "capacity_max": max(caps) if caps else None,
            "goodput_mean": fmean(goods) if goods else None,
            "feasible_count": sum(r.feasible for r in rs),
        }
    return out


def _paired(reps: Sequence[Replicate], config: str, n: int) -> list[float | None]:
    """``config``'s capacity in replicates 0 .. n-1 (None where it has none)."""
    by_rep = {r.replicate: r.capacity for r in reps if r.config == config}
    return [by_rep.get(i) for i in range(n)]


def decide(
    reps: Sequence[Replicate],
    candidates: Sequence[str],
    *,
    min_effect: float,
    confidence: float = 0.95,
    resolution: float = 0.03,
) -> Decision:
    """Pick the promoted config from interleaved capacity replicates (module docstring)."""
    if not any(r.config == "baseline" for r in reps):
        raise ValueError("confirmation needs baseline replicates")
    n = 1 + max(r.replicate for r in reps)
    base = _paired(reps, "baseline", n)
    comparisons: dict[str, CapacityComparison] = {}
    for c in candidates:
        if any(r.config == c for r in reps):
            comparisons[c] = compare_capacity(
                base,
                _paired(reps, c, n),
                min_effect=min_effect,
                confidence=confidence,
                resolution=resolution,
                label=c,
            )
    open_base = [r.replicate + 1 for r in reps if r.config == "baseline" and _open(r)]
    if open_base:
        # The baseline's capacity is only a floor there: a candidate's lead over it could be
        # the baseline's unmeasured headroom, so no "better" rests on it.
        why = (
            f"the baseline's capacity was only bounded below in replicate "
            f"{', '.join(map(str, open_base))} (no level above it missed)"
        )
        comparisons = {
            c: replace(cmp, verdict="not_enough_data", reason=f"{cmp.reason}; but {why}")
            if cmp.verdict == "better"
            else cmp
            for c, cmp in comparisons.items()
        }
    stats = config_stats(reps)
    shown = {c: cmp.to_dict() for c, cmp in comparisons.items()}
    better = [(c, cmp) for c, cmp in comparisons.items() if cmp.verdict == "better"]
    if better:
        name, cmp = max(better, key=lambda item: _rank(item[1]))
        return Decision(
            name,
            False,
            cmp.reason,
            True,
            cmp.effect,
            cmp.low,
            cmp.high,
            confidence,
            min_effect,
            cmp.verdict,
            per_config=stats,
            comparisons=shown,
        )
    lead = max(comparisons.values(), key=_rank, default=None)
    reasons = "; ".join(
        f"{cmp.verdict.replace('_', ' ')}: {cmp.reason}" for cmp in comparisons.values()
    )
    return Decision(
        "baseline",
        True,
        "kept the baseline: " + (reasons or "no candidate was measured"),
        True,
        None if lead is None else lead.effect,
        None if lead is None else lead.low,
        None if lead is None else lead.high,
        confidence,
        min_effect,
        None if lead is None else lead.verdict,
        per_config=stats,
        comparisons=shown,
    )


def _open(r: Replicate) -> bool:
    """A replicate whose capacity is a lower bound only: it met the SLA and nothing above
    its highest meeting level missed (the level budget or the rate cap ended its search)."""
    return r.capacity is not None and r.capacity > 0 and r.high is None


def _rank(cmp: CapacityComparison) -> float:
    """Order comparisons by effect; an unbounded win (baseline at zero) ranks first."""
    if cmp.effect is None:
        return float("inf") if cmp.verdict == "better" else float("-inf")
    return cmp.effect


def decide_without_baseline(reps: Sequence[Replicate], names: Sequence[str]) -> Decision:
    """No baseline to compare with: the first config (best-ranked) that met the SLA at its own
    load in every replicate, else the first."""
    ok = [n for n in names if all(r.feasible for r in reps if r.config == n)]
    chosen = ok[0] if ok else names[0]
    return Decision(
        chosen,
        False,
        "the baseline could not be measured (it failed to start); promoted the best-ranked "
        "candidate" + ("" if ok else ", which missed the SLA in a replicate"),
        True,
        per_config=config_stats(reps),
    )


def not_confirmed(reason: str, promoted: str = "baseline") -> Decision:
    """No confirmation launch was spent: the decision rests on ``reason``."""
    return Decision(promoted, promoted == "baseline", reason, False)


def fixed_misses(
    verdicts: Sequence[Mapping[str, str]], metric_of: Mapping[str, str], fixed: Set[str]
) -> list[str]:
    """The constraint keys a config missed at every measured level when all of them are
    limits on a metric in ``fixed`` (those the load does not move); [] when it met the SLA
    somewhere, missed anything else, or no level recorded verdicts (older records)."""
    if not verdicts or any(not v for v in verdicts):
        return []
    missed = {k for v in verdicts for k, outcome in v.items() if outcome != "meets"}
    if not missed or any(metric_of.get(k) not in fixed for k in missed):
        return []
    if any(all(o == "meets" for o in v.values()) for v in verdicts):
        return []
    return sorted(missed)


def known_zero(config: str, replicates: int, where: str) -> list[Replicate]:
    """Replicates of a config known to have capacity 0 without a launch (``where``: the run
    that showed it)."""
    return [
        Replicate(config, r, 0.0, 0.0, None, "fixed_miss", None, False, {}, where)
        for r in range(replicates)
    ]


def per_gpu_scale(sla: Sla, params: Mapping[str, ParamValue]) -> float:
    """What a config's capacity is multiplied by where configs are compared: 1 / its devices
    when the SLA's first objective is capacity per GPU, else 1."""
    if sla.objectives[0].metric == CAPACITY_PER_GPU:
        return 1.0 / devices_used(params)
    return 1.0


def per_gpu_replicate(r: Replicate, scale: float) -> Replicate:
    """A confirmation replicate with its capacity (and bracket) times ``scale``."""
    if scale == 1.0:
        return r

    def times(v: float | None) -> float | None:
        return None if v is None else v * scale

    return replace(r, capacity=times(r.capacity), low=times(r.low), high=times(r.high))
