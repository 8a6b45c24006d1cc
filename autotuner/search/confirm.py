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
3. **Decision: the SLA first, capacity second.** A config *meets the SLA* when every
   measurement of it at the SLA's own load met it: its search launch and each of its
   confirmation replicates (a replicate that missed, or stayed undecided, has capacity 0; one
   whose launch failed measured nothing and is left out). Per candidate,
   :func:`compare_capacity` on the paired replicates: a candidate that missed the SLA in
   some replicate is never promoted; one that met it in all of them beats a baseline that
   missed it in some (``basis: sla``: in a replicate, or in its search launch); when both met
   it everywhere, capacity decides (log-ratios, Student t interval, a spread floor from the
   resolution). Only ``better`` promotes (the largest effect among the better ones, or on
   the SLA the highest mean capacity); otherwise the baseline stays, and the reason gives each
   candidate's verdict. When neither the baseline nor any candidate met the SLA in every
   measurement (a candidate needs at least 2 measured replicates), the baseline stays and
   the decision says, once, that nothing meets the SLA and which config measured best
   (:data:`NOTHING_MET`); promotion then exits 1.

Every replicate that missed the SLA carries a note: what it missed, and for an undecided one
what would decide it (more requests per level, or a steadier machine when the load generator
fell behind its schedule); the decision's reason quotes them.

Without a measured baseline (it failed to start) there is nothing to compare with: the lead
is re-measured alone and promoted; it meets the SLA only when it met it in every replicate.
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
from autotuner.engines.base import OptionRoles
from autotuner.engines.layout import CAPACITY_PER_GPU, devices_used
from autotuner.search.capacity_compare import CapacityComparison, compare_capacity

if TYPE_CHECKING:
    from autotuner.sla.spec import Sla

FIXED_MISS = "fixed_miss"  # a replicate's stopped_by when it is known without a launch


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
    # Where it missed the SLA at its own load (capacity 0): what it missed and, when undecided,
    # what would decide it; the margins and verdicts of that level (empty otherwise).
    note: str | None = None
    margins: dict[str, float | None] = field(default_factory=dict)
    verdicts: dict[str, str] = field(default_factory=dict)
    # Every level above its capacity met every limit and was left undecided only because the
    # load generator fell behind: the ceiling is the client's, so the capacity is a floor.
    paced_out: bool = False

    @property
    def missed(self) -> bool:
        """Measured, and did not meet the SLA at its own load."""
        return self.capacity is not None and self.capacity <= 0

    @property
    def launched(self) -> bool:
        """An engine was started for it (not a replicate known without one: :func:`known_zero`)."""
        return self.stopped_by != FIXED_MISS


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
    """Per config: its replicates' capacities and goodputs at capacity. The mean, min and max
    are over the replicates that met the SLA (a miss is capacity 0, not a small capacity:
    averaged in, 2.95, 0 and 0 would read as 0.98); ``missed`` counts the others."""
    by: dict[str, list[Replicate]] = {}
    for r in reps:
        by.setdefault(r.config, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for name, rs in by.items():
        held = [r for r in rs if r.capacity is not None and not r.missed]
        caps = [r.capacity for r in held if r.capacity is not None]
        goods = [r.goodput for r in held if r.goodput is not None]
        out[name] = {
            "replicates": len(rs),
            "capacities": [r.capacity for r in rs],
            "capacity_mean": fmean(caps) if caps else None,
            "capacity_min": min(caps) if caps else None,
            "capacity_max": max(caps) if caps else None,
            "goodput_mean": fmean(goods) if goods else None,
            "feasible_count": sum(r.feasible for r in rs),
            "measured": sum(r.capacity is not None for r in rs),
            "missed": sum(r.missed for r in rs),
        }
    return out


def sla_record(reps: Sequence[Replicate], config: str) -> tuple[int, int]:
    """``config``'s confirmation replicates: (measured, of those the ones that missed the SLA)."""
    mine = [r for r in reps if r.config == config and r.capacity is not None]
    return len(mine), sum(r.missed for r in mine)


def met_throughout(reps: Sequence[Replicate], config: str, search_met: bool) -> bool:
    """Whether ``config`` meets the SLA: its search launch met it at the SLA's own load, and
    so did every confirmation replicate of it that measured something."""
    return search_met and sla_record(reps, config)[1] == 0


def miss_account(reps: Sequence[Replicate], config: str) -> str:
    """Where ``config``'s replicates missed the SLA, grouped by what they said:
    ``replicates 2, 3: could not tell ... after 60 requests; more requests ...``."""
    by_note: dict[str, list[int]] = {}
    for r in reps:
        if r.config == config and r.missed:
            by_note.setdefault(r.note or "missed the SLA at its own load", []).append(
                r.replicate + 1
            )
    parts = []
    for note, which in by_note.items():
        word = "replicate" if len(which) == 1 else "replicates"
        parts.append(f"{word} {', '.join(map(str, which))}: {note}")
    return "; ".join(parts)


def _paired(reps: Sequence[Replicate], config: str, n: int) -> list[float | None]:
    """``config``'s capacity in replicates 0 .. n-1 (None where it has none)."""
    by_rep = {r.replicate: r.capacity for r in reps if r.config == config}
    return [by_rep.get(i) for i in range(n)]


# Said once, in the decision's reason, when no config met the SLA in its search launch and in
# at least 2 confirmation replicates, every one of them.
NOTHING_MET = "no config was confirmed to meet the SLA"


def decide(
    reps: Sequence[Replicate],
    candidates: Sequence[str],
    *,
    min_effect: float,
    confidence: float = 0.95,
    resolution: float = 0.03,
    search_misses: Mapping[str, str] | None = None,
) -> Decision:
    """Pick the promoted config from interleaved capacity replicates (module docstring).

    ``search_misses``: the configs whose search launch missed the SLA at its own load (only
    the baseline can: candidates are confirmed only when they met it), with what it missed.
    """
    if not any(r.config == "baseline" for r in reps):
        raise ValueError("confirmation needs baseline replicates")
    n = 1 + max(r.replicate for r in reps)
    base = _paired(reps, "baseline", n)
    searched = dict(search_misses or {})
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
    if "baseline" in searched:
        comparisons = {
            c: _over_search_miss(cmp, c, reps, searched) for c, cmp in comparisons.items()
        }
    reps_of_base = {r.replicate: r for r in reps if r.config == "baseline"}
    open_base = {i for i, r in reps_of_base.items() if _open(r)}
    for c, cmp in comparisons.items():
        # Where the baseline's capacity is only a floor, a candidate's lead over it could be
        # the baseline's unmeasured headroom, so no "better" by capacity rests on it; a floor
        # whose pair lacks the candidate's capacity is not in the comparison and cannot veto.
        theirs = _paired(reps, c, n)
        floors = sorted(i + 1 for i in open_base if theirs[i] is not None)
        if floors and cmp.verdict == "better" and cmp.basis == "capacity":
            paced = [i for i in floors if reps_of_base[i - 1].paced_out]
            why = (
                f"the baseline's capacity was only bounded below in replicate "
                f"{', '.join(map(str, floors))} (no level above it missed the SLA"
                + ("; the load generator fell behind there" if paced else "")
                + ")"
            )
            comparisons[c] = replace(
                cmp, verdict="not_enough_data", reason=f"{cmp.reason}; but {why}"
            )
    stats = config_stats(reps)
    shown = {c: cmp.to_dict() for c, cmp in comparisons.items()}
    better = [(c, cmp) for c, cmp in comparisons.items() if cmp.verdict == "better"]
    base_account = miss_account(reps, "baseline")
    if better:
        name, cmp = max(better, key=lambda item: _rank(item[1], stats.get(item[0], {})))
        reason = cmp.reason
        if cmp.basis == "sla" and base_account:
            reason += f" (baseline {base_account})"
        return Decision(
            name,
            False,
            reason,
            True,
            cmp.effect,
            cmp.low,
            cmp.high,
            confidence,
            min_effect,
            cmp.verdict,
            basis=cmp.basis,
            per_config=stats,
            comparisons=shown,
        )
    lead = max(comparisons.values(), key=lambda cmp: _rank(cmp, {}), default=None)
    reasons = "; ".join(
        f"{cmp.verdict.replace('_', ' ')}: {cmp.reason}" for cmp in comparisons.values()
    )
    basis = "capacity" if lead is None else lead.basis
    kept = "kept the baseline: " + (reasons or "no candidate was measured")
    if "baseline" in searched or sla_record(reps, "baseline")[1]:
        kept = _nothing_met(reps, comparisons, searched, reasons)
        basis = "sla"
    return Decision(
        "baseline",
        True,
        kept,
        True,
        None if lead is None else lead.effect,
        None if lead is None else lead.low,
        None if lead is None else lead.high,
        confidence,
        min_effect,
        None if lead is None else lead.verdict,
        basis=basis,
        per_config=stats,
        comparisons=shown,
    )


def _over_search_miss(
    cmp: CapacityComparison, name: str, reps: Sequence[Replicate], searched: Mapping[str, str]
) -> CapacityComparison:
    """A candidate that met the SLA in every replicate against a baseline that met it in
    every replicate too but missed it in its search launch: the SLA decides (the baseline
    did not meet it in every measurement), not the capacities."""
    measured, missed = sla_record(reps, name)
    if cmp.basis != "capacity" or cmp.verdict == "better" or missed or measured < 2:
        return cmp
    base_n = sla_record(reps, "baseline")[0]
    return replace(
        cmp,
        verdict="better",
        effect=None,
        low=None,
        high=None,
        basis="sla",
        reason=f"{name} met the SLA at its own load in its search launch and all {measured} "
        f"replicates, the baseline missed it in its search launch ({searched['baseline']}) "
        f"and met it in its {base_n} replicates (by capacity, not what decided: "
        f"{cmp.verdict.replace('_', ' ')}: {cmp.reason})",
    )


def _nothing_met(
    reps: Sequence[Replicate],
    comparisons: Mapping[str, CapacityComparison],
    searched: Mapping[str, str],
    reasons: str,
) -> str:
    """The reason of a decision where no config met the SLA in every measurement: each
    config's misses once, and the best measured config named."""
    accounts = [reasons] if reasons else []
    if "baseline" in searched:
        accounts.append(f"the baseline missed it in its search launch ({searched['baseline']})")
    for name in ["baseline", *comparisons]:
        if account := miss_account(reps, name):
            accounts.append(f"{name} {account}")
    best = best_measured(reps, ["baseline", *comparisons], searched)
    return (
        f"kept the baseline (engine defaults), although the baseline itself misses the SLA: "
        f"{NOTHING_MET}: "
        f"{'; '.join(accounts)}; the best measured: {best}"
    )


def best_measured(
    reps: Sequence[Replicate], names: Sequence[str], searched: Mapping[str, str]
) -> str:
    """The config that met the SLA in the largest share of its measurements (its search
    launch and its replicates), then served the most where it met it, described."""
    stats = config_stats(reps)

    def share(name: str) -> tuple[int, int]:
        measured, missed = sla_record(reps, name)
        return measured - missed + (name not in searched), measured + 1

    def key(name: str) -> tuple[float, float]:
        met, of = share(name)
        return met / of, stats.get(name, {}).get("capacity_mean") or 0.0

    name = max(names, key=key)
    met, of = share(name)
    mean = stats.get(name, {}).get("capacity_mean")
    served = "" if mean is None else f", capacity {mean:.3g} where it met it"
    return f"{name} (met the SLA in {met} of {of} measurements, search launch included{served})"


def _open(r: Replicate) -> bool:
    """A replicate whose capacity is a lower bound only: it met the SLA and nothing above
    its highest meeting level missed (the level budget or the rate cap ended its search, or
    the load generator fell behind at every level above it)."""
    return r.capacity is not None and r.capacity > 0 and (r.high is None or r.paced_out)


def _rank(cmp: CapacityComparison, stats: Mapping[str, Any]) -> tuple[float, float]:
    """Order comparisons: by effect; a win on the SLA (no effect) first, then by the mean
    capacity of the replicates (``stats``: the candidate's :func:`config_stats`)."""
    if cmp.effect is None:
        first = float("inf") if cmp.verdict == "better" else float("-inf")
        return first, float(stats.get("capacity_mean") or 0.0)
    return cmp.effect, 0.0


def decide_without_baseline(reps: Sequence[Replicate], names: Sequence[str]) -> Decision:
    """No baseline to compare with: the first config (best-ranked) that met the SLA at its own
    load in every replicate, else the first (which then does not meet the SLA)."""
    ok = [n for n in names if (rec := sla_record(reps, n))[0] and not rec[1]]
    chosen = ok[0] if ok else names[0]
    why = "the baseline could not be measured (it failed to start); promoted the best-ranked "
    if ok:
        why += "candidate"
    else:
        accounts = "; ".join(f"{n}: {a}" for n in names if (a := miss_account(reps, n)))
        why += (
            f"candidate {chosen}, which itself misses the SLA: {NOTHING_MET}"
            + (f": {accounts}" if accounts else "")
            + f"; the best measured: {best_measured(reps, names, {})}"
        )
    basis = "capacity" if ok else "sla"
    return Decision(chosen, False, why, True, per_config=config_stats(reps), basis=basis)


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


def miss_note(note: str | None, stopped_by: str | None, generator_behind: bool | None) -> str:
    """What a launch that missed the SLA at its own load saw there (``note``: its capacity's
    ``describe_stop``), and for an undecided level what would decide it: a level the load
    generator could not send on time needs a steadier machine (more requests would lag the
    same way); otherwise the limit lies inside the percentile's interval, which more
    requests narrow."""
    said = note or "missed the SLA at its own load"
    if stopped_by != "undecided":
        return said
    if generator_behind:
        return (
            f"{said}; the load generator fell behind its schedule (a busy machine): a "
            "steadier machine would decide it, more requests would not"
        )
    return (
        f"{said}; the limit lies inside the percentile's confidence interval: more requests "
        "per level (workload.requests, up to tune.max_requests_per_level) would decide it"
    )


def known_zero(config: str, replicates: int, where: str) -> list[Replicate]:
    """Replicates of a config known to have capacity 0 without a launch (``where``: the run
    that showed it)."""
    return [
        Replicate(config, r, 0.0, 0.0, None, FIXED_MISS, None, False, {}, where)
        for r in range(replicates)
    ]


def per_gpu_scale(sla: Sla, params: Mapping[str, ParamValue], roles: OptionRoles) -> float:
    """What a config's capacity is multiplied by where configs are compared: 1 / its devices
    (read through the engine's option ``roles``) when the SLA's first objective is capacity
    per GPU, else 1."""
    if sla.objectives[0].metric == CAPACITY_PER_GPU:
        return 1.0 / devices_used(params, roles)
    return 1.0


def per_gpu_replicate(r: Replicate, scale: float) -> Replicate:
    """A confirmation replicate with its capacity (and bracket) times ``scale``."""
    if scale == 1.0:
        return r

    def times(v: float | None) -> float | None:
        return None if v is None else v * scale

    return replace(r, capacity=times(r.capacity), low=times(r.low), high=times(r.high))
