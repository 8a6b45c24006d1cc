"""The lossy tier: with ``search.allow_lossy: true`` a study keeps two winners, the best
lossless config and the best lossy one (fp8 weights, fp8 KV cache: the settings the space
file marks ``lossy``), and promotes the lossy one only through the quality gate.

Pure functions over the promotion policy's records:

- :func:`split` ranks the feasible configs of each tier (the baseline is lossless).
- Both winners are confirmed against the baseline together (one interleaved confirmation);
  its decision promotes the one with the larger confirmed effect, as for any candidates.
- :func:`gate_due`: the gate runs when the lossy winner would be promoted, or was confirmed
  better than the baseline (its price is then worth knowing).
- :func:`settle`: a lossy pick stands only when the gate passed (or could not measure and the
  SLA's ``quality.promote_unmeasured`` says to promote anyway); otherwise the lossless winner
  is promoted if confirmation found it better than the baseline, else the baseline stays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotuner.core.types import ParamValue
from autotuner.measure.quality import GateResult
from autotuner.search.confirm import Decision
from autotuner.search.pareto import Candidate, Direction, rank


@dataclass(frozen=True)
class Tiers:
    """The best feasible config of each tier (None: the tier has none)."""

    lossless: Candidate | None
    lossy: Candidate | None


def label(c: Candidate) -> str:
    return "baseline" if c.baseline else f"trial-{c.trial}"


def split(
    cands: Sequence[Candidate],
    directions: Sequence[Direction],
    lossy_settings: Callable[[Mapping[str, ParamValue]], Mapping[str, ParamValue]],
) -> Tiers:
    """Rank each tier's feasible configs by the promotion policy; keep each tier's first."""
    feasible = [c for c in cands if c.feasible]
    lossy = [c for c in feasible if lossy_settings(c.params) and not c.baseline]
    lossless = [c for c in feasible if c not in lossy]
    best = [rank(group, directions)[0] if group else None for group in (lossless, lossy)]
    return Tiers(best[0], best[1])


def gate_due(decision: Decision, lossy_label: str) -> bool:
    cmp = decision.comparisons.get(lossy_label) or {}
    return decision.promoted == lossy_label or cmp.get("verdict") == "better"


def gate_opens(gate: GateResult | None, promote_unmeasured: bool) -> bool:
    """Whether a lossy config may be promoted after this gate."""
    if gate is None:
        return False
    return gate.verdict == "pass" or (gate.verdict == "not_measurable" and promote_unmeasured)


def settle(
    decision: Decision,
    *,
    lossy_label: str,
    lossless_label: str | None,
    gate: GateResult | None,
    promote_unmeasured: bool,
) -> Decision:
    """The decision after the gate (module docstring)."""
    if decision.promoted != lossy_label:
        return decision
    said = "not run" if gate is None else f"{gate.verdict}: {gate.reason}"
    if gate_opens(gate, promote_unmeasured):
        extra = (
            " (promoted unmeasured: the SLA sets quality.promote_unmeasured)"
            if gate is not None and gate.verdict == "not_measurable"
            else ""
        )
        return replace(decision, reason=f"{decision.reason}; quality gate {said}{extra}")
    why = f"the lossy winner {lossy_label} is not promoted: quality gate {said}"
    cmp: Mapping[str, Any] = decision.comparisons.get(lossless_label or "") or {}
    # Better than the baseline, or nothing compared it with one (no confirmation ran, or the
    # baseline could not be measured): then it is the best config that keeps outputs.
    lossless_ok = lossless_label not in (None, "baseline") and (
        cmp.get("verdict") == "better" or not decision.confirmed or not decision.comparisons
    )
    if lossless_label is not None and lossless_ok:
        return replace(
            decision,
            promoted=lossless_label,
            promoted_is_baseline=False,
            reason=f"{cmp.get('reason') or 'the lossless winner'}; {why}",
            effect=cmp.get("effect"),
            effect_low=cmp.get("low"),
            effect_high=cmp.get("high"),
            verdict=cmp.get("verdict"),
        )
    return replace(
        decision,
        promoted="baseline",
        promoted_is_baseline=True,
        reason=f"kept the baseline: {why}",
        effect=None,
        effect_low=None,
        effect_high=None,
        verdict=None,
    )


def gain(lossy_capacity: float | None, lossless_capacity: float | None) -> float | None:
    """The lossy winner's capacity over the lossless winner's, - 1 (None: not both known)."""
    if lossy_capacity is None or not lossless_capacity:
        return None
    return lossy_capacity / lossless_capacity - 1


# Runs the quality gate: (lossless baseline's params, lossy candidate's params, run directory)
# -> its verdict; launches both (none on random weights).
GateRun = Callable[[Mapping[str, ParamValue], Mapping[str, ParamValue], Path], GateResult]
