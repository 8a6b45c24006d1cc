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

import hashlib
import math
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner import __version__
from autotuner.bundle import fallback_roles, lossy_tier, report
from autotuner.core.hardware import HardwareProfile
from autotuner.core.types import ParamValue
from autotuner.engines.base import DeployRenderer, EngineAdapter
from autotuner.engines.deploy import dns_label
from autotuner.measure.kernel_profile import ProfileFailed
from autotuner.measure.kernels import KernelBreakdown, breakdown_csv
from autotuner.measure.launch import layout_of
from autotuner.records.manifest import (
    Confirmation,
    DecisionRecord,
    Decisions,
    LevelSummary,
    Manifest,
    Measurements,
    ModelSource,
    NoDecision,
    PromotedConfig,
    Provenance,
    ReplicateRecord,
    SearchMeasurement,
    SlaSummary,
    SpaceSource,
    Spread,
    StudySource,
    Verdicts,
)
from autotuner.records.trial import CapacityRecord, PromotionNote, StudyRecord, TrialRecord
from autotuner.search import accounting
from autotuner.search.confirm import NOTHING_MET, Decision, Replicate, met_throughout, sla_record
from autotuner.search.confirmation import ConfirmRun, Say, confirm
from autotuner.search.launched import candidates as candidates  # page.py reads it from here
from autotuner.search.launched import search_capacity, trial_file
from autotuner.search.pareto import Candidate, pareto_front, rank
from autotuner.search.study import feasible, raced_out
from autotuner.search.tiers import GateRun
from autotuner.search.trial import TrialResult
from autotuner.sla.load import load_unit
from autotuner.sla.spec import Sla, to_yaml
from autotuner.space import SearchSpace

# Profiles one config under the engine's own profiler, a launch of its own: (params, run
# directory) -> where its time went; raises ProfileFailed when no breakdown came of it.
ProfileRun = Callable[[Mapping[str, ParamValue], Path], KernelBreakdown]

SUMMARY = (
    "capacity",
    "capacity_per_gpu",
    "goodput",
    "p99_ttft_ms",
    "p99_tpot_ms",
    "p99_e2e_ms",
    "peak_memory_gib",
)
# Measured by confirmation replicates (the rest is the search's single run at the SLA's load).
CONFIRMED_METRICS = ("capacity", "capacity_per_gpu", "goodput")


@dataclass(frozen=True)
class Context:
    """Everything provenance needs, gathered once by the caller."""

    sla: Sla
    study: optuna.Study
    study_dir: Path
    space: SearchSpace
    hardware: HardwareProfile
    model_dir: Path
    engine_version: str
    engine_python: Path
    storage: str
    engine: EngineAdapter  # the adapter of the engine kind the study tuned


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
        say(
            f"no measured config met the SLA: nothing to promote{_closest(ctx, cands)} "
            "(see `autotuner report`)"
        )
        nothing = NoDecision(reason="no measured config met the SLA")
        manifest = _manifest(ctx, None, nothing, [], ranked, {})
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
        manifest = _manifest(ctx, None, nothing, [], ranked, {})
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
    manifest = _manifest(ctx, chosen, record, reps, ranked, configs, meets)
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
    """``; the closest: trial-3, p99_ttft_ms missed by 12 % at the SLA's own load``: the
    measured config whose worst constraint margin is the smallest ("" when none recorded)."""
    best: tuple[Candidate, str, float] | None = None
    for c in cands:
        margins = TrialRecord.from_trial(ctx.study.trials[c.trial]).constraints
        if margins:
            key, worst = max(margins.items(), key=lambda kv: kv[1])
            if best is None or worst < best[2]:
                best = (c, key, worst)
    if best is None:
        return ""
    c, key, worst = best
    by = f"by {worst:.0%}" if math.isfinite(worst) else "(not measurable)"
    return f"; the closest: {_label(c)}, {key} missed {by} at the SLA's own load"


def _kernel_profiles(
    ctx: Context, chosen: Candidate, base: Candidate | None, profile: ProfileRun, say: Say
) -> list[tuple[str, KernelBreakdown]]:
    """The promoted config's and the baseline's profiles, labelled as in the latency panels."""
    configs = [(f"promoted (trial {chosen.trial})", chosen)]
    if base is not None and base.trial != chosen.trial:
        configs.append((f"baseline (trial {base.trial})", base))
    out = []
    for label, c in configs:
        name = _label(c)
        say(f"kernel profile of {name}: one more launch, under the engine's profiler")
        try:
            breakdown = profile(c.params, ctx.study_dir / "profile" / name)
        except ProfileFailed as exc:
            say(f"  -> no kernel profile of {name}: {exc}")
            continue
        say(f"  -> {breakdown.summary()}")
        out.append((label, breakdown))
    return out


def _confirmed_load(reps: list[Replicate], chosen: Candidate) -> float | None:
    """A load the promoted config met the SLA at in every confirmation replicate (the lowest
    of their capacities' low edges), for readers that re-check it at one load
    (compare-engines, the daemon); None without replicates or when one missed."""
    lows = [r.low for r in reps if r.config == _label(chosen)]
    if not lows or any(low is None or low <= 0 for low in lows):
        return None
    return min(low for low in lows if low is not None)


def _spread(reps: list[Replicate], name: str) -> dict[str, Spread]:
    """Per metric, the mean/min/max of the replicates that met the SLA: capacity from the
    replicate's search, the others at its capacity (the highest level that met the SLA). A
    replicate that missed the SLA is counted in ``missed``, never averaged in as a zero."""
    out: dict[str, Spread] = {}
    mine = [r for r in reps if r.config == name]
    held = [r for r in mine if r.capacity is not None and not r.missed]
    missed = sum(r.missed for r in mine)
    for metric in SUMMARY:
        if metric == "capacity":
            vals = [r.capacity for r in held if r.capacity is not None]
        else:
            vals = [v for r in held if (v := r.metrics.get(metric)) is not None]
        out[metric] = Spread(
            mean=sum(vals) / len(vals) if vals else None,
            min=min(vals) if vals else None,
            max=max(vals) if vals else None,
            replicates=len(vals),
            missed=missed,
        )
    return out


def _verdicts(
    chosen: Candidate, trial: TrialResult | None, reps: list[Replicate], meets: bool
) -> Verdicts | None:
    """The promoted config's constraints at the SLA's own load: its search launch's, unless a
    confirmation replicate of it missed the SLA there (then that replicate's: the margins of
    a launch that met it must not stand beside ``meets_sla: false``)."""
    how = "margins are relative: <= 0 means the constraint is met"
    missed = [r for r in reps if r.config == _label(chosen) and r.missed]
    if missed:
        r = missed[0]
        measured, n = sla_record(reps, r.config)
        return Verdicts(
            at_sla_load=r.margins,
            note=f"{how}; from confirmation replicate {r.replicate + 1} ({r.run_dir}), which "
            f"missed the SLA at its own load: {_outcomes(r.verdicts)}; {n} of {measured} "
            f"replicates missed it; meets_sla {str(meets).lower()}",
        )
    if trial is None or not trial.levels:
        return None
    first = trial.levels[0]
    said = "met" if chosen.feasible else "missed"
    return Verdicts(
        at_sla_load=first.margins,
        note=f"{how}; from the search launch (trial {chosen.trial}), which {said} the SLA at "
        f"its own load: {_outcomes(first.verdicts)}; meets_sla {str(meets).lower()}",
    )


def _outcomes(verdicts: Mapping[str, str]) -> str:
    """``p99_ttft_ms undecided, p90_tpot_ms meets`` (each constraint's verdict at one level)."""
    return ", ".join(f"{k} {v}" for k, v in verdicts.items()) or "no verdicts recorded"


def _decisions(study: optuna.Study) -> Decisions:
    out: dict[str, list[dict[str, Any]]] = {
        "pruned": [],
        "failed": [],
        "duplicates": [],
        "interrupted": [],
        "infeasible": [],
    }
    for t in study.get_trials(deepcopy=False):
        r = TrialRecord.from_trial(t)
        params = r.params_or(t.params)
        if t.state == TrialState.PRUNED:
            entry = {"trial": t.number, "params": params, "reason": r.reason}
            if raced_out(t):  # launched, and ended at the incumbent's capacity
                entry |= {"race_level": r.race_level, "race_incumbent": r.race_incumbent}
            out["pruned"].append(entry)
        elif t.state == TrialState.FAIL and r.interrupted:
            out["interrupted"].append({"trial": t.number, "params": params})
        elif t.state == TrialState.FAIL:
            out["failed"].append(
                {
                    "trial": t.number,
                    "params": params,
                    "cause": r.cause,
                    "reason": r.reason,
                }
            )
        elif r.duplicate:
            out["duplicates"].append({"trial": t.number, "same_as": r.duplicate_of})
        elif t.state == TrialState.COMPLETE and not feasible(t):
            out["infeasible"].append(
                {
                    "trial": t.number,
                    "params": params,
                    "reason": r.reason,
                    "constraints": t.constraints,
                }
            )
    return Decisions.model_validate(out)


def _model_hash(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()


def _renderer(ctx: Context) -> DeployRenderer:
    """The deploy renderer of the engine kind the study tuned."""
    return ctx.engine.deploy


def _serve_argv(ctx: Context, params: Mapping[str, Any]) -> list[str]:
    served = ctx.sla.model.served_name or ctx.sla.model.synth or ctx.model_dir.name
    python = str(ctx.engine_python) if ctx.hardware.device == "cpu" else None
    deploy = _renderer(ctx)
    return deploy.serve_command(params, model=str(ctx.model_dir), served_name=served, python=python)


def _manifest(
    ctx: Context,
    chosen: Candidate | None,
    decision: DecisionRecord | NoDecision,
    reps: list[Replicate],
    ranked: list[Candidate],
    configs: Mapping[str, Candidate],
    meets: bool = False,
) -> Manifest:
    sla = ctx.sla
    trial = trial_file(ctx, chosen.trial) if chosen else None
    measured = sorted({r.config for r in reps})
    return Manifest(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        study=sla.name,
        promoted=None if chosen is None else _promoted(ctx, chosen, decision, trial, meets),
        decision=decision,
        measurements=None
        if chosen is None
        else Measurements(
            search=_search(chosen, trial, search_capacity(ctx, chosen.trial)),
            confirmation=Confirmation(
                load=_confirmed_load(reps, chosen),
                load_unit=load_unit(sla),
                spread={name: _spread(reps, name) for name in measured},
                replicates=[ReplicateRecord.model_validate(r.__dict__) for r in reps],
            ),
        ),
        verdicts=None if chosen is None else _verdicts(chosen, trial, reps, meets),
        sla=SlaSummary(
            constraints={c.key: c.limit for c in sla.constraints},
            objectives=[{o.direction: o.metric} for o in sla.objectives],
            file=to_yaml(sla),
        ),
        pareto_front=[c.trial for c in ranked],
        provenance=_provenance(ctx),
        decisions=_decisions(ctx.study),
        gpu_minutes=accounting.account(ctx.study, ctx.study_dir, [r.run_dir for r in reps]),
    )


def _promoted(
    ctx: Context,
    chosen: Candidate,
    decision: DecisionRecord | NoDecision,
    trial: TrialResult | None,
    meets: bool,
) -> PromotedConfig:
    return PromotedConfig(
        label=decision.promoted if isinstance(decision, DecisionRecord) else None,
        trial=chosen.trial,
        is_baseline=chosen.baseline,
        params=chosen.params,
        tuned_params={k: v for k, v in chosen.params.items() if k not in ctx.space.fixed},
        engine_argv=list(trial.argv) if trial else None,
        serve_argv=_serve_argv(ctx, chosen.params),
        meets_sla=meets,
    )


def _search(
    chosen: Candidate, trial: TrialResult | None, capacity: CapacityRecord | None
) -> SearchMeasurement:
    return SearchMeasurement(
        trial=chosen.trial,
        at_sla_load=trial.levels[0].metrics if trial and trial.levels else None,
        max_load_meeting_sla=trial.max_load if trial else None,
        capacity=capacity,
        levels=[
            LevelSummary(load=lv.load, feasible=lv.feasible, goodput=lv.metrics.get("goodput"))
            for lv in (trial.levels if trial else ())
        ],
    )


def _provenance(ctx: Context) -> Provenance:
    sla = ctx.sla
    return Provenance(
        tuner_version=__version__,
        engine_version=ctx.engine_version,
        engine_python=str(ctx.engine_python),
        hardware=ctx.hardware.to_csv_rows(),
        model=ModelSource(
            dir=str(ctx.model_dir),
            synth=sla.model.synth,
            config_sha256=_model_hash(ctx.model_dir),
        ),
        search_space=SpaceSource(
            hash=ctx.space.hash(),
            source=str(ctx.space.source),
            description=ctx.space.describe(),
        ),
        study=StudySource(
            name=sla.name,
            storage=ctx.storage,
            trials=[t.number for t in ctx.study.get_trials(deepcopy=False)],
            sampler=type(ctx.study.sampler).__name__,
        ),
    )


def _profile(ctx: Context, cand: Candidate, title: str) -> report.LatencyProfile | None:
    trial = trial_file(ctx, cand.trial)
    if trial is None or not trial.levels:
        return None
    m = trial.levels[0].metrics
    pct = {
        metric: {q: m.get(f"{q}_{metric}_ms") for q in ("p50", "p90", "p99")}
        for metric in ("ttft", "tpot", "e2e")
    }
    eng = trial.levels[0].engine
    phases = {
        k: float(eng[f"mean_{k}_ms"])
        for k in ("queue", "prefill", "decode")
        if eng.get(f"mean_{k}_ms") is not None
    }
    cache = {
        k: float(eng[k])
        for k in ("prompt_cached_share", "prefix_cache_hit_rate")
        if eng.get(k) is not None
    }
    return report.LatencyProfile(title, pct, phases, cache)


def _label(c: Candidate) -> str:
    return "baseline" if c.baseline else f"trial-{c.trial}"


@dataclass(frozen=True)
class Figures:
    """What the bundle's files show for each config: confirmation replicates' means where
    they exist (capacity, goodput at capacity), the search's single run otherwise."""

    confirmed: dict[str, dict[str, float | None]]  # config label -> metric -> mean
    replicates: dict[str, int]  # config label -> replicates that met the SLA (the mean's)
    comparisons: dict[str, dict[str, Any]]  # candidate label -> its comparison with baseline
    # config label -> replicates that missed the SLA at its own load (not in the mean)
    missed: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, manifest: Manifest) -> Figures:
        conf = manifest.measurements.confirmation if manifest.measurements else None
        confirmed: dict[str, dict[str, float | None]] = {}
        replicates: dict[str, int] = {}
        missed: dict[str, int] = {}
        for name, spreads in (conf.spread if conf else {}).items():
            cap = spreads.get("capacity", Spread())
            if cap.replicates or cap.missed:
                confirmed[name] = {m: spreads[m].mean for m in CONFIRMED_METRICS if m in spreads}
                if not cap.replicates:  # missed the SLA in every replicate: capacity 0
                    confirmed[name].update(capacity=0.0, capacity_per_gpu=0.0)
                replicates[name] = cap.replicates
                missed[name] = cap.missed
        d = manifest.decision
        comparisons = dict(d.comparisons) if isinstance(d, DecisionRecord) else {}
        return cls(confirmed, replicates, comparisons, missed)

    def confirmed_in(self, c: Candidate) -> bool:
        """Whether confirmation measured ``c``."""
        return _label(c) in self.confirmed

    def rejected(self, c: Candidate) -> bool:
        """A candidate (not the baseline) that missed the SLA in a confirmation replicate."""
        return not c.baseline and bool(self.missed.get(_label(c)))

    def rejected_notes(self, cands: Sequence[Candidate], chosen: Candidate) -> list[str]:
        """Why each rejected candidate is not listed as a fallback."""
        return [
            f"trial {c.trial} is not offered as a fallback: it missed the SLA at its own load "
            f"in {self.missed[_label(c)]} of "
            f"{self.missed[_label(c)] + self.replicates.get(_label(c), 0)} confirmation "
            "replicates"
            for c in cands
            if self.rejected(c) and c.trial != chosen.trial
        ]

    def metrics(self, c: Candidate) -> dict[str, float | None]:
        """``c``'s search metrics, with the confirmed means where confirmation has them (a
        config that missed the SLA in every replicate: capacity 0, no goodput)."""
        if not self.confirmed_in(c):
            return dict(c.metrics)
        mine = self.confirmed[_label(c)]
        out = {**c.metrics, **{m: v for m, v in mine.items() if v is not None}}
        if not self.replicates.get(_label(c)):
            out["goodput"] = None
        return out

    def _confirmed_basis(self, c: Candidate) -> str:
        n, missed = self.replicates.get(_label(c), 0), self.missed.get(_label(c), 0)
        if not missed:
            return f"mean of {n} replicates"
        if not n:
            return f"missed the SLA in all {missed} replicates"
        return f"mean of the {n} of {n + missed} replicates that met the SLA"

    def basis(self, c: Candidate, names: Sequence[str]) -> dict[str, str]:
        mine = self._confirmed_basis(c) if self.confirmed_in(c) else None
        return {m: mine if mine and m in CONFIRMED_METRICS else "single run" for m in names}

    def point_basis(self, c: Candidate) -> str:
        if not self.confirmed_in(c):
            return "single run"
        n, missed = self.replicates.get(_label(c), 0), self.missed.get(_label(c), 0)
        if missed:
            return f"confirmed, missed the SLA in {missed} of {n + missed} replicates"
        return f"confirmed, {n} replicates"

    def capacity_change(self, c: Candidate, chosen: Candidate) -> str | None:
        """The confirmed capacity change of ``c`` against ``chosen``, with its interval and
        the decision's verdict (None when confirmation did not compare the two)."""
        if c.baseline and not chosen.baseline:
            cmp, flip = self.comparisons.get(_label(chosen)), True
        elif chosen.baseline and not c.baseline:
            cmp, flip = self.comparisons.get(_label(c)), False
        else:
            return None
        if not cmp:
            return None
        if cmp.get("basis") == "sla":
            # Decided on the SLA: a capacity ratio against a config that missed it is no
            # measure of either.
            who = [x for x in (c, chosen) if self.missed.get(_label(x))]
            said = "; ".join(
                f"{_label(x)} missed the SLA in {self.missed[_label(x)]} of "
                f"{self.missed[_label(x)] + self.replicates.get(_label(x), 0)} replicates"
                for x in who
            )
            return f"not compared: decided on the SLA ({said or 'see Notes'})"
        if cmp.get("effect") is None:
            said = str(cmp.get("verdict") or "not compared").replace("_", " ")
            return f"n/a (confirmed: {said}, from {cmp.get('pairs', 0)} pair(s))"
        effect, low, high = cmp["effect"], cmp.get("low"), cmp.get("high")
        words = {
            "better": ("higher", "lower"),
            "worse": ("lower", "higher"),
            "no_difference": ("no difference",) * 2,
            "not_enough_data": ("not resolved",) * 2,
        }.get(str(cmp.get("verdict")), ("?", "?"))
        if flip:  # the baseline against the promoted candidate: invert the ratio
            effect = 1 / (1 + effect) - 1
            low, high = (
                None if high is None else 1 / (1 + high) - 1,
                None if low is None else 1 / (1 + low) - 1,
            )
        span = "" if low is None or high is None else f" [{low * 100:+.1f}, {high * 100:+.1f}]"
        return f"{effect * 100:+.1f} %{span} (confirmed: {words[1 if flip else 0]})"


def _fallbacks(
    ctx: Context,
    chosen: Candidate,
    ranked: list[Candidate],
    base: Candidate | None,
    figures: Figures,
) -> list[report.Fallback]:
    directions = [o.direction for o in ctx.sla.objectives]
    # A candidate that missed the SLA in a confirmation replicate is no fallback for it.
    usable = [c for c in ranked if not figures.rejected(c)]
    feasible = rank(
        [c for c in candidates(ctx.study) if c.feasible and not figures.rejected(c)], directions
    )
    traits = lossy_tier.traits(ctx)
    picks = fallback_roles.pick(
        chosen, usable, feasible, base, traits, ctx.hardware.device, engine_roles=ctx.engine.roles
    )
    promoted = figures.metrics(chosen)
    out = []
    for i, fallback in enumerate(picks, 1):
        c = fallback.cand
        mine = figures.metrics(c)
        cost = {}
        for m in SUMMARY:
            a, b = mine.get(m), promoted.get(m)
            cost[m] = (a - b) / b if a is not None and b not in (None, 0) else None
        what = fallback.title
        change = figures.capacity_change(c, chosen)
        both = _label(c) in figures.replicates and _label(chosen) in figures.replicates
        out.append(
            report.Fallback(
                rank=i,
                label=what,
                params=c.params,
                argv=_serve_argv(ctx, c.params),
                metrics={m: mine.get(m) for m in SUMMARY},
                cost=cost,
                triggers=report.trigger_sentences(
                    c.params,
                    mine,
                    promoted_params=chosen.params,
                    promoted_metrics=promoted,
                    is_baseline=c.baseline,
                    roles=ctx.engine.roles,
                    rate_margin=ctx.sla.tune.capacity_resolution,
                    rate_settled=both,
                    rate_basis=None if both else "single runs of the search, not confirmed",
                ),
                basis=figures.basis(c, SUMMARY),
                change_text={"capacity": change} if change else {},
            )
        )
    return out


def write_bundle(
    ctx: Context,
    manifest: Manifest,
    chosen: Candidate,
    front: list[Candidate],
    ranked: list[Candidate],
    *,
    kernels: Sequence[tuple[str, KernelBreakdown]] = (),
) -> Path:
    """Write every artifact into a fresh directory and swap it in as ``promoted/``;
    ``kernels`` (label, profiled window) add ``kernel_breakdown.csv`` and the kernel panel."""
    final = ctx.study_dir / "promoted"
    tmp = ctx.study_dir / f".promoted.{int(time.time() * 1000)}.tmp"
    (tmp / "deploy").mkdir(parents=True)
    sla = ctx.sla
    objs = [o.metric for o in sla.objectives]
    front_ids = {c.trial for c in front}
    cands = candidates(ctx.study)
    base = next((c for c in cands if c.baseline), None)
    figures = Figures.of(manifest)
    points = [
        report.Point(
            trial=c.trial,
            values={
                m: figures.metrics(c).get(m, v) if m in CONFIRMED_METRICS else v
                for m, v in zip(objs, c.values, strict=True)
            },
            feasible=c.feasible,
            on_front=c.trial in front_ids,
            promoted=c.trial == chosen.trial,
            baseline=c.baseline,
            params=c.params,
            basis=figures.point_basis(c),
        )
        for c in cands
    ]
    manifest.write(tmp / "optimization_manifest.json")
    ctx.hardware.write_csv(tmp / "hardware_profile.csv")
    (tmp / "pareto.csv").write_text(
        report.pareto_csv(points, list(dict.fromkeys([*objs, "p99_ttft_ms"])), figures=True)
    )
    better = {o.metric: ("max" if o.direction == "maximize" else "min") for o in sla.objectives}
    y = objs[1] if len(objs) > 1 else None
    (tmp / "pareto.svg").write_text(
        report.pareto_svg(
            points,
            objs[0],
            y,
            x_better=better[objs[0]],  # type: ignore[arg-type]
            y_better=better.get(y or "", "min"),  # type: ignore[arg-type]
            title=f"{sla.name}: trials",
            notes=manifest.pareto_notes,
        )
    )
    profiles = [_profile(ctx, chosen, f"promoted (trial {chosen.trial})")]
    if base is not None and base.trial != chosen.trial:
        profiles.append(_profile(ctx, base, f"baseline (trial {base.trial})"))
    (tmp / "latency_breakdown.svg").write_text(
        report.latency_breakdown_svg(
            [p for p in profiles if p is not None],
            title=f"{sla.name}: latency at the SLA's load",
            kernels=kernels,
            limits=report.sla_limits(
                [(c.metric, c.limit) for c in sla.constraints if c.bound == "max"]
            ),
        )
    )
    if kernels:
        (tmp / "kernel_breakdown.csv").write_text(breakdown_csv(kernels))
    reason = manifest.decision.reason if manifest.decision else ""
    if figures.replicates or figures.missed:
        where = (
            "capacity and goodput at capacity marked 'mean of N replicates' come from the "
            "confirmation replicates; every figure marked 'single run' is one launch of the "
            "search (latencies at the SLA's own load)"
        )
        if any(figures.missed.values()):
            where += (
                "; a replicate that missed the SLA at its own load is counted as a miss, never "
                "averaged in as capacity 0"
            )
    else:
        where = "no confirmation launch was run: every figure is a single run of the search"
    fallbacks = _fallbacks(ctx, chosen, ranked, base, figures)
    traits = lossy_tier.traits(ctx)
    needs = fallback_roles.hardware_notes(
        chosen.params, fallbacks, traits, ctx.hardware.device, load_unit(sla)
    )
    (tmp / "fallback_plan.md").write_text(
        report.fallback_plan_md(
            sla.name,
            f"{'baseline (engine defaults)' if chosen.baseline else f'trial {chosen.trial}'}",
            {m: figures.metrics(chosen).get(m) for m in SUMMARY},
            fallbacks,
            [
                *needs,
                reason,
                *figures.rejected_notes(cands, chosen),
                where,
                f"engine: {ctx.engine_version}; hardware: {ctx.hardware.summary().splitlines()[0]}",
            ],
            promoted_basis=figures.basis(chosen, SUMMARY),
        )
    )
    if manifest.lossy_tier is not None:
        md = lossy_tier.lossy_tier_md(sla.name, manifest.lossy_tier, load_unit(sla))
        (tmp / "lossy_tier.md").write_text(md)
    _deploy_or_say_why(ctx, tmp / "deploy", chosen)
    from autotuner.bundle import page  # the study as one page; it reads this bundle's manifest

    page.write(ctx.study, ctx.study_dir, tmp / "report.html", bundle=tmp)
    _swap(tmp, final)
    return final


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
            n = figures.missed[_label(c)]
            out.append(
                f"not promoted: trial {c.trial} missed the SLA at its own load in {n} of "
                f"{n + figures.replicates.get(_label(c), 0)} confirmation replicates"
            )
    return out


def _deploy_or_say_why(ctx: Context, out: Path, chosen: Candidate) -> None:
    """The deploy files; a renderer that fails costs those files only, never the decision or
    the rest of the bundle: ``deploy/NOT_RENDERED.txt`` says why, and so does the tuner."""
    try:
        _write_deploy(ctx, out, chosen)
    except Exception as exc:  # any renderer's failure: the bundle goes on without it
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        why = f"{type(exc).__name__}: {exc}"
        (out / "NOT_RENDERED.txt").write_text(
            f"The deploy files of this config could not be rendered: {why}\n"
            "The decision and the rest of the bundle stand; optimization_manifest.json has "
            "the exact engine command that was measured.\n"
        )
        print(f"warning: deploy files not rendered ({why}); the rest of the bundle is written")


def _write_deploy(ctx: Context, out: Path, chosen: Candidate) -> None:
    served = ctx.sla.model.served_name or ctx.sla.model.synth or ctx.model_dir.name
    env = dict(ctx.sla.engine.env)  # what the launch was given; the renderer adds its own
    cpu = ctx.hardware.device == "cpu"
    deploy = _renderer(ctx)
    image = deploy.default_image(ctx.engine_version, cpu=cpu)
    header = [
        f"autotuner {__version__}: promoted config of study {ctx.sla.name}",
        f"engine {ctx.engine_version}",
    ]
    layout = layout_of(ctx.sla, chosen.params, ctx.engine)
    params = layout.engine_params(chosen.params)
    header.append(f"layout: {layout.describe('rank' if cpu else 'GPU')}")  # CPU: engine ranks
    # Each engine server's GPUs (one slice per replica); on a CPU target none.
    uuids = [g.uuid for g in ctx.hardware.gpus]
    slices = layout.slices(uuids) if uuids else [[] for _ in range(layout.replicas)]
    for i, gpus in enumerate(slices):
        suffix = f"-r{i}" if layout.replicas > 1 else ""
        mine = list(header)
        if layout.replicas > 1:
            mine.append(
                f"replica {i + 1} of {layout.replicas}: GPUs {','.join(gpus) or 'none'}, port "
                f"{8000 + i}; run every replica and spread requests over their ports"
            )
        serve = out / f"serve{suffix}.sh"
        argv = deploy.serve_command(
            params,
            model=str(ctx.model_dir),
            served_name=served,
            port=8000 + i,
            python=str(ctx.engine_python) if cpu else None,
        )
        serve.write_text(deploy.serve_script(argv, header=mine, env=env))
        serve.chmod(0o755)
        docker = out / f"docker-run{suffix}.sh"
        docker.write_text(
            deploy.docker_run(
                params,
                model_dir=str(ctx.model_dir),
                served_name=served,
                gpu_uuids=gpus,
                image=image,
                port=8000 + i,
                env=env,
            )
        )
        docker.chmod(0o755)
    (out / "compose.yaml").write_text(
        deploy.compose_file(
            params,
            model_dir=str(ctx.model_dir),
            served_name=served,
            gpu_slices=slices,
            image=image,
            env=env,
        )
    )
    (out / "k8s.yaml").write_text(
        deploy.k8s_deployment(
            params,
            name=dns_label(ctx.sla.name),  # any SLA name check accepts
            served_name=served,
            image=image,
            gpus=len(slices[0]),
            model_subpath=ctx.model_dir.name,
            replicas=layout.replicas,
            env=env,
        )
    )


def _swap(tmp: Path, final: Path) -> None:
    """Replace ``final`` by ``tmp``; a crash leaves either the old or the new bundle."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)
