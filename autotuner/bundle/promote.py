"""Promotion: pick the Pareto-best config, confirm it against the baseline by capacity
(:mod:`autotuner.search.confirmation` runs it, :mod:`autotuner.search.confirm` decides: no
launch when no candidate leads by more than the resolution), write the bundle.

Every file of the bundle shows confirmed figures where confirmation measured them (capacity
and goodput at capacity: the replicates' mean) and marks the others "single run", so that the
fallback plan and the Pareto chart never contradict the decision.

The bundle goes to ``<study>/promoted/``, built beside it and swapped in whole, so readers
see the previous bundle or the new one, never half of one. It holds
``optimization_manifest.json`` (config, measurements with spread, verdicts, provenance,
decisions), ``hardware_profile.csv``, ``latency_breakdown.svg``, ``pareto.svg`` /
``pareto.csv``, ``fallback_plan.md``, ``deploy/`` (serve script, docker run, Kubernetes) and,
when profiled, ``kernel_breakdown.csv``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotuner.bundle import lossy_tier, nothing_met
from autotuner.bundle.bundle_files import write_bundle
from autotuner.bundle.context import Context as Context  # tests read it from here
from autotuner.bundle.deploy_files import write_deploy
from autotuner.bundle.figures import Figures, config_label
from autotuner.bundle.manifest_build import build_manifest
from autotuner.bundle.nothing_met import Missed
from autotuner.core.types import ParamValue
from autotuner.engines.layout import devices_used
from autotuner.measure.kernel_profile import ProfileFailed
from autotuner.measure.kernels import KernelBreakdown
from autotuner.records.manifest import DecisionRecord, Manifest, NoDecision
from autotuner.records.trial import PromotionNote, StudyRecord, TrialRecord
from autotuner.search.confirm import NOTHING_MET, Decision, met_throughout
from autotuner.search.confirmation import ConfirmRun, Say, confirm
from autotuner.search.launched import candidates as candidates  # tests read it from here
from autotuner.search.pareto import Candidate, pareto_front, rank
from autotuner.search.tiers import GateRun

# Profiles one config under the engine's own profiler, a launch of its own: (params, run
# directory) -> where its time went; raises ProfileFailed when no breakdown came of it.
ProfileRun = Callable[[Mapping[str, ParamValue], Path], KernelBreakdown]

_write_deploy = write_deploy  # tests/unit/engines/test_layout.py reads it from here


def promote(
    ctx: Context,
    run: ConfirmRun,
    say: Say = print,
    profile: ProfileRun | None = None,
    *,
    gate: GateRun | None = None,
) -> dict[str, Any]:
    """Choose, confirm and write the bundle (:func:`promote_manifest`). Returns the manifest
    as written, in its JSON form."""
    return promote_manifest(ctx, run, say, profile, gate=gate).to_data()


def promote_manifest(
    ctx: Context,
    run: ConfirmRun,
    say: Say = print,
    profile: ProfileRun | None = None,
    *,
    gate: GateRun | None = None,
) -> Manifest:
    """Choose, confirm and write the bundle. Returns the manifest as written.

    ``gate``: the quality gate a lossy winner must pass (``search.allow_lossy``:
    :mod:`autotuner.bundle.lossy_tier`); without it no lossy config is promoted.

    ``profile``: the promoted config and the baseline are profiled for the kernel breakdown
    (``kernel_breakdown.csv`` and a panel of ``latency_breakdown.svg``); a profile that fails
    is reported and left out, never a reason to withhold the bundle.
    """
    sla = ctx.sla
    directions = [o.direction for o in sla.objectives]
    cands = candidates(ctx.study)
    front = pareto_front(cands, directions)
    ranked = rank(front, directions)
    if not ranked:
        closest = _closest(ctx, cands)
        say(f"no measured config met the SLA: nothing to promote{closest} (see `autotuner report`)")
        nothing = NoDecision(reason=f"no measured config met the SLA{closest}")
        manifest = build_manifest(ctx, None, nothing, [], ranked, {})
        manifest.write(ctx.study_dir / "no_promotion.json")
        return manifest
    tiered = lossy_tier.decide(ctx, cands, run, say, gate)
    if tiered is None:
        decision, reps, configs = confirm(ctx, ranked, run, say)
        tier = None
    else:
        decision, reps, configs, tier = tiered
    if decision.promoted not in configs:  # a lossy winner gated out, nothing lossless left
        say(f"nothing to promote: {decision.reason}")
        nothing = NoDecision(reason=decision.reason)
        manifest = build_manifest(ctx, None, nothing, [], ranked, {})
        manifest.write(ctx.study_dir / "no_promotion.json")
        return manifest
    chosen = configs[decision.promoted]
    # It meets the SLA when its search launch and every confirmation replicate of it met it.
    meets = met_throughout(reps, decision.promoted, chosen.feasible)
    if not meets and NOTHING_MET not in decision.reason:
        # Keeping the defaults is the safe choice, but it must not read as a success.
        decision = Decision(
            **{
                **decision.__dict__,
                "reason": decision.reason
                + f"; note: the baseline itself misses the SLA, so {NOTHING_MET}",
            }
        )
    say(f"promoted {decision.promoted}: {decision.reason}")
    record = DecisionRecord.model_validate(decision.to_dict())
    manifest = build_manifest(ctx, chosen, record, reps, ranked, configs, meets)
    if tier is not None:
        manifest = manifest.model_copy(update={"lossy_tier": tier})
    notes = _pareto_notes(ctx, manifest, chosen, front, cands, Figures.of(manifest))
    manifest = manifest.model_copy(update={"pareto_notes": notes})
    base = next((c for c in cands if c.baseline), None)
    kernels = _kernel_profiles(ctx, chosen, base, profile, say) if profile else []
    write_bundle(ctx, manifest, chosen, front, ranked, kernels=kernels)
    note = PromotionNote(
        promoted=decision.promoted,
        trial=chosen.trial,
        reason=decision.reason,
        time=manifest.created or "",
    )
    StudyRecord(promotion=note).save(ctx.study.set_user_attr)
    return manifest


def _closest(ctx: Context, cands: Sequence[Candidate]) -> str:
    """``; the closest: trial-3, p99_ttft_ms missed by 12% at the SLA's own load; it holds
    ...``: the measured config whose worst constraint margin is the smallest, where it holds
    the SLA's limits and the replicas the SLA's load would take (:mod:`.nothing_met`; ""
    when nothing was recorded)."""
    missed = []
    for c in cands:
        r = TrialRecord.from_trial(ctx.study.trials[c.trial])
        held = r.capacity.sustainable if r.capacity is not None else None
        devices = devices_used(c.params, ctx.engine.roles)
        missed.append(Missed(config_label(c), r.constraints, held, devices))
    unit = "engine rank" if ctx.hardware.device == "cpu" else "GPU"
    return nothing_met.answer(missed, unit)


def _kernel_profiles(
    ctx: Context, chosen: Candidate, base: Candidate | None, profile: ProfileRun, say: Say
) -> list[tuple[str, KernelBreakdown]]:
    """The promoted config's and the baseline's profiles, labelled as in the latency panels."""
    configs = [(f"promoted (trial {chosen.trial})", chosen)]
    if base is not None and base.trial != chosen.trial:
        configs.append((f"baseline (trial {base.trial})", base))
    out = []
    for label, c in configs:
        name = config_label(c)
        say(f"kernel profile of {name}: one more launch, under the engine's profiler")
        try:
            breakdown = profile(c.params, ctx.study_dir / "profile" / name)
        except ProfileFailed as exc:
            say(f"  -> no kernel profile of {name}: {exc}")
            continue
        say(f"  -> {breakdown.summary()}")
        out.append((label, breakdown))
    return out


def _pareto_notes(
    ctx: Context,
    manifest: Manifest,
    chosen: Candidate,
    front: Sequence[Candidate],
    cands: Sequence[Candidate],
    figures: Figures,
) -> list[str]:
    """What the Pareto chart says beside its points so that it agrees with the decision: why
    the promoted point is off the front, that it does not meet the SLA, and why a point on
    the front was not promoted when confirmation or the quality gate kept it out."""
    out: list[str] = []
    meets = bool(manifest.promoted and manifest.promoted.meets_sla)
    who = "the baseline (engine defaults)" if chosen.baseline else f"trial {chosen.trial}"
    traits = lossy_tier.traits(ctx)
    lossy = [c for c in front if traits.lossy_settings(c.params) and c.trial != chosen.trial]
    on_front = any(c.trial == chosen.trial for c in front)
    if not on_front:
        if chosen.baseline and not chosen.feasible:
            why = "it missed the SLA in its search launch; kept because no candidate was promoted"
        elif chosen.baseline:
            why = "the engine defaults stay unless a candidate is confirmed better"
        elif lossy:
            why = "the points ahead of it have lossy settings, which only the quality gate admits"
        else:
            why = "it was ranked first of its tier"
        out.append(f"promoted: {who}, not on the front: {why}")
    if not meets:
        out.append(f"{who} does not meet the SLA: {NOTHING_MET}")
    tier = manifest.lossy_tier
    if lossy and tier is not None and tier.promoted != "lossy":
        gate = tier.gate or {}
        said = f"quality gate {gate.get('verdict')}" if gate else "not confirmed better"
        names = ", ".join(f"trial {c.trial}" for c in lossy)
        out.append(f"not promoted: {names} (lossy settings; {said})")
    for c in cands:
        if figures.rejected(c) and c.trial != chosen.trial:
            n = figures.missed[config_label(c)]
            out.append(
                f"not promoted: trial {c.trial} missed the SLA at its own load in {n} of "
                f"{n + figures.replicates.get(config_label(c), 0)} confirmation replicates"
            )
    return out
