"""Promotion with a lossy tier (``search.allow_lossy: true``; :mod:`autotuner.search.tiers`):
confirm the best lossless and the best lossy config against the baseline together, pass the
lossy one through the quality gate when it would be promoted, and record both winners with
the gain and the price (the manifest's ``lossy_tier``, the bundle's ``lossy_tier.md``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from autotuner.bundle.context import Context
from autotuner.measure.quality import GateResult, unmeasurable
from autotuner.records.lossy import LossyTier, TierWinner
from autotuner.search.capability import NO_TRAITS, SettingTraits, traits_of
from autotuner.search.confirm import Decision, Replicate
from autotuner.search.confirmation import ConfirmRun, Say, confirm
from autotuner.search.launched import search_capacity
from autotuner.search.pareto import Candidate
from autotuner.search.tiers import GateRun, gain, gate_due, label, settle, split

Tiered = tuple[Decision, list[Replicate], dict[str, Candidate], LossyTier]


def traits(ctx: Context) -> SettingTraits:
    """The setting traits of the study's space file (none when it is not known)."""
    source = Path(ctx.space.source) if ctx.space.source else None
    return traits_of(source) if source is not None and source.is_file() else NO_TRAITS


def decide(
    ctx: Context,
    cands: Sequence[Candidate],
    run: ConfirmRun,
    say: Say,
    gate_run: GateRun | None,
) -> Tiered | None:
    """The tiered decision; None when the study has no lossy tier (lossy settings not
    allowed, or no lossy config met the SLA): promotion then goes on as usual."""
    if not ctx.sla.search.allow_lossy:
        return None
    t = traits(ctx)
    directions = [o.direction for o in ctx.sla.objectives]
    tiers = split(cands, directions, t.lossy_settings)
    if tiers.lossy is None:
        return None
    lossy, lossless = tiers.lossy, tiers.lossless
    say(
        f"lossy tier: best lossy {label(lossy)}, best lossless "
        f"{label(lossless) if lossless else 'none'}; both confirmed against the baseline"
    )
    pool = [c for c in (lossy, lossless) if c is not None]
    limit = max(1, sum(not c.baseline for c in pool))
    decision, reps, configs = confirm(ctx, pool, run, say, limit=limit)
    gate: GateResult | None = None
    if gate_due(decision, label(lossy)) and gate_run is not None:
        base = configs.get("baseline") or lossless
        if base is None:
            gate = unmeasurable("no lossless config to compare with", ctx.sla.quality.limits)
        else:
            say(f"quality gate: {label(lossy)} against the lossless {label(base)}")
            gate = gate_run(base.params, lossy.params, ctx.study_dir / "quality" / label(lossy))
    settled = settle(
        decision,
        lossy_label=label(lossy),
        lossless_label=None if lossless is None else label(lossless),
        gate=gate,
        promote_unmeasured=ctx.sla.quality.promote_unmeasured,
    )
    record = _record(ctx, t, decision, settled, lossy, lossless, gate)
    say(f"lossy tier: {record.why}")
    return settled, reps, configs, record


def _winner(ctx: Context, c: Candidate, decision: Decision) -> TierWinner:
    name = label(c)
    stats = decision.per_config.get(name) or {}
    cmp = decision.comparisons.get(name) or {}
    n = int(stats.get("replicates") or 0)
    missed = int(stats.get("missed") or 0)
    capacity: float | None
    if n and missed:  # a miss is not averaged in as capacity 0
        mean = stats.get("capacity_mean")
        capacity = 0.0 if mean is None else float(mean)
        held = int(stats.get("measured") or n) - missed
        basis = (
            f"mean of the {held} of {held + missed} replicates that met the SLA"
            if held
            else f"missed the SLA in all {missed} replicates"
        )
    elif n and stats.get("capacity_mean") is not None:
        capacity, basis = float(stats["capacity_mean"]), f"mean of {n} replicates"
    else:
        found = search_capacity(ctx, c.trial)
        capacity = None if found is None else found.value
        if not c.feasible:
            capacity = 0.0
        basis = "single run"
    return TierWinner(
        label=name,
        trial=c.trial,
        params=c.params,
        capacity=capacity,
        basis=basis,
        verdict=cmp.get("verdict"),
        effect=cmp.get("effect"),
        low=cmp.get("low"),
        high=cmp.get("high"),
    )


def _record(
    ctx: Context,
    t: SettingTraits,
    decision: Decision,
    settled: Decision,
    lossy: Candidate,
    lossless: Candidate | None,
    gate: GateResult | None,
) -> LossyTier:
    top = _winner(ctx, lossy, decision)
    base = None if lossless is None else _winner(ctx, lossless, decision)
    both = base is not None and "replicates" in top.basis and "replicates" in base.basis
    promoted: Literal["lossy", "lossless"] = (
        "lossy" if settled.promoted == label(lossy) else "lossless"
    )
    cmp = decision.comparisons.get(top.label) or {}
    shown = cmp.get("reason") or decision.reason
    if promoted == "lossy":
        why = f"promoted the lossy winner {top.label}: {settled.reason}"
    elif gate is not None:
        # What the lossy winner holds by capacity, then why the gate kept it out.
        held = f"{cmp['reason']}; " if cmp.get("reason") else ""
        why = (
            f"{held}not promoted: quality gate {gate.verdict}: {gate.reason}; "
            f"promoted {settled.promoted}"
        )
    else:
        why = (
            f"the lossy winner {top.label} was not promoted by capacity ({shown}), so the "
            f"quality gate was not run; promoted {settled.promoted}"
        )
    return LossyTier(
        lossless=base,
        lossy=top,
        lossy_settings=t.lossy_settings(lossy.params),
        gain=gain(top.capacity, None if base is None else base.capacity),
        gain_basis="means of confirmation replicates" if both else "single runs of the search",
        gate=None if gate is None else gate.to_dict(),
        promoted=promoted,
        why=why,
    )


def lossy_tier_md(study: str, tier: LossyTier, unit: str) -> str:
    """``lossy_tier.md``: both winners, the gain and the price."""

    def cap(w: TierWinner | None) -> str:
        if w is None or w.capacity is None:
            return "n/a"
        return f"{w.capacity:.3g} {unit} ({w.basis})"

    def shown(params: dict[str, Any]) -> str:
        return ", ".join(f"`{k}={json.dumps(v)}`" for k, v in params.items()) or "engine defaults"

    out = [f"# Lossy tier: {study}", ""]
    out += [f"Promoted: **the {tier.promoted} winner**. {tier.why}", ""]
    out += ["| tier | config | capacity | against the baseline |", "|---|---|---|---|"]
    for name, w in (("lossless", tier.lossless), ("lossy", tier.lossy)):
        if w is None:
            out.append(f"| {name} | none met the SLA | | |")
            continue
        out.append(f"| {name} | {w.label} | {cap(w)} | {_against(w)} |")
    out.append("")
    gained = "n/a" if tier.gain is None else f"{tier.gain * 100:+.1f} %"
    out += [f"**Gain** of the lossy winner over the lossless one: {gained} ({tier.gain_basis})", ""]
    out += [f"**Price**: settings that change outputs: {shown(tier.lossy_settings)}", ""]
    g = tier.gate
    if g is None:
        out += ["**Quality gate**: not run (the lossy winner was not promoted by capacity)", ""]
    else:
        out += [f"**Quality gate**: {g['verdict']}: {g['reason']}", ""]
        if g.get("positions"):
            out += [
                "| measure | measured | limit |",
                "|---|---|---|",
                f"| token agreement | {_pct(g.get('token_agreement'))} "
                f"| >= {_pct(g.get('min_token_agreement'))} |",
                f"| mean top-k KL (nats) | {_num(g.get('mean_kl'))} "
                f"| <= {_num(g.get('max_mean_kl'))} |",
                f"| identical completions | {_pct(g.get('exact_match'))} | |",
                f"| baseline against itself | {_pct(g.get('repeat_agreement'))} agreement | |",
                "",
            ]
    if tier.lossless is not None:
        out += [f"**Lossless winner's parameters**: {shown(tier.lossless.params)}", ""]
    out += [f"**Lossy winner's parameters**: {shown(tier.lossy.params)}", ""]
    return "\n".join(out)


def _against(w: TierWinner) -> str:
    """A winner's confirmed effect over the baseline, with its interval where recorded."""
    if w.label == "baseline":
        return "is the baseline"
    if w.effect is None:
        return w.verdict or "not confirmed"
    span = ""
    if w.low is not None and w.high is not None:
        span = f" [{w.low * 100:+.1f} %, {w.high * 100:+.1f} %]"
    return f"{w.effect * 100:+.1f} %{span} ({w.verdict})"


def _pct(v: object) -> str:
    return f"{v * 100:.1f} %" if isinstance(v, int | float) else "n/a"


def _num(v: object) -> str:
    return f"{v:.4f}" if isinstance(v, int | float) else "n/a"
