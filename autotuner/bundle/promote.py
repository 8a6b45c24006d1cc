"""Promotion: pick the Pareto-best config, confirm it against the baseline, write the bundle.

The bundle goes to ``<study>/promoted/``, built beside it and swapped in whole, so readers
see the previous bundle or the new one, never half of one. It holds
``optimization_manifest.json`` (config, measurements with spread, verdicts, provenance,
decisions), ``hardware_profile.csv``, ``latency_breakdown.svg``, ``pareto.svg`` /
``pareto.csv``, ``fallback_plan.md`` and ``deploy/`` (serve script, docker run, Kubernetes).
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotuner import __version__
from autotuner.bundle import report
from autotuner.core.hardware import HardwareProfile
from autotuner.core.types import ParamValue
from autotuner.engines import registry
from autotuner.engines.base import DeployRenderer
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
from autotuner.records.trial import PromotionNote, StudyRecord, TrialRecord
from autotuner.search.confirm import Decision, Replicate, decide, interleaved_order
from autotuner.search.pareto import Candidate, pareto_front, rank
from autotuner.search.space import SearchSpace
from autotuner.search.study import feasible
from autotuner.search.trial import TrialResult
from autotuner.sla.spec import Sla, to_yaml

Say = Callable[[str], None]
# Runs one confirmation launch: (params, run directory, load) -> result.
ConfirmRun = Callable[[Mapping[str, ParamValue], Path, float], TrialResult]

SUMMARY = ("goodput", "p99_ttft_ms", "p99_tpot_ms", "p99_e2e_ms", "peak_memory_gib")


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


def label(t: FrozenTrial) -> str:
    return "baseline" if TrialRecord.from_trial(t).baseline else f"trial-{t.number}"


def measured(study: optuna.Study) -> list[FrozenTrial]:
    """Completed trials that launched an engine (not reused duplicates)."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not TrialRecord.from_trial(t).duplicate
    ]


def candidates(study: optuna.Study) -> list[Candidate]:
    return [
        Candidate(
            trial=t.number,
            values=tuple(t.values),
            feasible=feasible(t),
            metrics=dict(r.metrics),
            params=r.params_or({}),
            baseline=r.baseline,
        )
        for t in measured(study)
        for r in (TrialRecord.from_trial(t),)
    ]


def confirm(
    ctx: Context, ranked: list[Candidate], run: ConfirmRun, say: Say
) -> tuple[Decision, list[Replicate], float, dict[str, Candidate]]:
    """Re-measure the top candidates and the baseline, interleaved, at one common load."""
    sla = ctx.sla
    spec = sla.tune.confirm
    by_number = {t.number: t for t in ctx.study.get_trials(deepcopy=False)}
    top = [c for c in ranked if not c.baseline][: spec.candidates]
    configs: dict[str, Candidate] = {f"trial-{c.trial}": c for c in top}
    base = next((c for c in candidates(ctx.study) if c.baseline), None)
    if base is not None:
        configs["baseline"] = base
    lead = top[0] if top else base
    assert lead is not None
    load = _common_load(
        TrialRecord.from_trial(by_number[lead.trial]).max_load or _sla_load(sla),
        TrialRecord.from_trial(by_number[base.trial]).max_load if base is not None else None,
    )
    names = list(configs)
    plan = interleaved_order(names, spec.replicates)
    say(
        f"confirming {', '.join(names)} at {load:.2f} {_unit(sla)}: "
        f"{len(plan)} launches, interleaved"
    )
    reps: list[Replicate] = []
    for i, (r, name) in enumerate(plan, 1):
        run_dir = ctx.study_dir / "confirm" / f"{name}-r{r}"
        say(f"confirmation {i}/{len(plan)}: {name}, replicate {r + 1}")
        res = run(configs[name].params, run_dir, load)
        level = res.levels[0] if res.levels else None
        reps.append(
            Replicate(
                config=name,
                replicate=r,
                goodput=level.metrics.get("goodput") if level else None,
                feasible=bool(level and level.feasible),
                metrics=dict(level.metrics) if level else {},
                run_dir=str(run_dir.relative_to(ctx.study_dir)),
                slack=_slack(level.margins) if level else None,
            )
        )
        g = reps[-1].goodput
        say(
            f"  -> goodput {'-' if g is None else f'{g:.2f}'}, "
            f"{'meets' if reps[-1].feasible else 'misses'} the SLA"
        )
    if base is None:
        decision = _without_baseline(reps, names)
    else:
        decision = decide(reps, [n for n in names if n != "baseline"], spec.min_effect)
    return decision, reps, float(load), configs


def _common_load(lead_max: float, base_max: float | None) -> float:
    """Where to compare: the geometric mean of the two highest sustained loads when the lead
    sustained more, so that neither runs exactly at its own (noisy) edge; else the lead's."""
    if base_max and base_max < lead_max:
        return float((lead_max * base_max) ** 0.5)
    return float(lead_max)


def _slack(margins: Mapping[str, float | None]) -> float | None:
    values = [m for m in margins.values() if m is not None]
    if len(values) < len(margins):
        return -1.0  # a constraint could not be measured at all: far outside
    return -max(values) if values else None


def _without_baseline(reps: list[Replicate], names: list[str]) -> Decision:
    ok = [n for n in names if all(r.feasible for r in reps if r.config == n)]
    chosen = ok[0] if ok else names[0]
    return Decision(
        chosen,
        False,
        None,
        0.0,
        0.0,
        "the baseline could not be measured (it failed to start); promoted the "
        "best-ranked candidate" + ("" if ok else ", which missed the SLA in a replicate"),
        {},
    )


def _sla_load(sla: Sla) -> float:
    a = sla.workload.arrival
    value = getattr(a, "rate", None) or getattr(a, "concurrency", None) or 1
    return float(value)


def _unit(sla: Sla) -> str:
    return "req/s" if hasattr(sla.workload.arrival, "rate") else "concurrent requests"


def promote(ctx: Context, run: ConfirmRun, say: Say = print) -> dict[str, Any]:
    """Choose, confirm and write the bundle. Returns the manifest as written (its JSON form)."""
    sla = ctx.sla
    directions = [o.direction for o in sla.objectives]
    cands = candidates(ctx.study)
    front = pareto_front(cands, directions)
    ranked = rank(front, directions)
    if not ranked:
        say("no measured config met the SLA: nothing to promote (see `autotuner report`)")
        nothing = NoDecision(reason="no measured config met the SLA")
        manifest = _manifest(ctx, None, nothing, [], 0.0, ranked, {})
        manifest.write(ctx.study_dir / "no_promotion.json")
        return manifest.to_data()
    decision, reps, load, configs = confirm(ctx, ranked, run, say)
    chosen = configs[decision.promoted]
    meets = chosen.feasible
    if not meets:
        # Keeping the defaults is the safe choice, but it must not read as a success.
        decision = Decision(
            **{
                **decision.__dict__,
                "reason": decision.reason
                + ("; note: the baseline itself misses the SLA, so no confirmed config meets it"),
            }
        )
    say(f"promoted {decision.promoted}: {decision.reason}")
    record = DecisionRecord.model_validate(decision.to_dict())
    manifest = _manifest(ctx, chosen, record, reps, load, ranked, configs, meets)
    write_bundle(ctx, manifest, chosen, front, ranked)
    note = PromotionNote(
        promoted=decision.promoted,
        trial=chosen.trial,
        reason=decision.reason,
        time=manifest.created or "",
    )
    StudyRecord(promotion=note).save(ctx.study.set_user_attr)
    return manifest.to_data()


def _trial_file(ctx: Context, number: int) -> TrialResult | None:
    rel = TrialRecord.from_trial(ctx.study.trials[number]).result_file
    if not rel or not (ctx.study_dir / rel).exists():
        return None
    return TrialResult.read(ctx.study_dir / rel)


def _spread(reps: list[Replicate], name: str) -> dict[str, Spread]:
    out: dict[str, Spread] = {}
    mine = [r for r in reps if r.config == name]
    for metric in SUMMARY:
        vals = [v for r in mine if (v := r.metrics.get(metric)) is not None]
        out[metric] = Spread(
            mean=sum(vals) / len(vals) if vals else None,
            min=min(vals) if vals else None,
            max=max(vals) if vals else None,
            replicates=len(vals),
        )
    return out


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
            out["pruned"].append({"trial": t.number, "params": params, "reason": r.reason})
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
    return registry.get(ctx.sla.engine.kind).deploy


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
    load: float,
    ranked: list[Candidate],
    configs: Mapping[str, Candidate],
    meets: bool = False,
) -> Manifest:
    sla = ctx.sla
    trial = _trial_file(ctx, chosen.trial) if chosen else None
    return Manifest(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        study=sla.name,
        promoted=None if chosen is None else _promoted(ctx, chosen, decision, trial, meets),
        decision=decision,
        measurements=None
        if chosen is None
        else Measurements(
            search=_search(chosen, trial),
            confirmation=Confirmation(
                load=load,
                load_unit=_unit(sla),
                spread={name: _spread(reps, name) for name in configs},
                replicates=[ReplicateRecord.model_validate(r.__dict__) for r in reps],
            ),
        ),
        verdicts=None
        if trial is None or not trial.levels
        else Verdicts(
            at_sla_load=trial.levels[0].margins,
            note="margins are relative: <= 0 means the constraint is met",
        ),
        sla=SlaSummary(
            constraints={c.key: c.limit for c in sla.constraints},
            objectives=[{o.direction: o.metric} for o in sla.objectives],
            file=to_yaml(sla),
        ),
        pareto_front=[c.trial for c in ranked],
        provenance=_provenance(ctx),
        decisions=_decisions(ctx.study),
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


def _search(chosen: Candidate, trial: TrialResult | None) -> SearchMeasurement:
    return SearchMeasurement(
        trial=chosen.trial,
        at_sla_load=trial.levels[0].metrics if trial and trial.levels else None,
        max_load_meeting_sla=trial.max_load if trial else None,
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
    trial = _trial_file(ctx, cand.trial)
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
    return report.LatencyProfile(title, pct, phases)


def _fallbacks(
    ctx: Context, chosen: Candidate, ranked: list[Candidate], base: Candidate | None
) -> list[report.Fallback]:
    others = [c for c in ranked if c.trial != chosen.trial]
    if base is not None and base.trial != chosen.trial and base not in others:
        others.append(base)
    out = []
    for i, c in enumerate(others, 1):
        cost = {}
        for m in SUMMARY:
            a, b = c.metrics.get(m), chosen.metrics.get(m)
            cost[m] = (a - b) / b if a is not None and b not in (None, 0) else None
        what = "baseline (engine defaults)" if c.baseline else f"trial {c.trial} (Pareto point)"
        out.append(
            report.Fallback(
                rank=i,
                label=what,
                params=c.params,
                argv=_serve_argv(ctx, c.params),
                metrics={m: c.metrics.get(m) for m in SUMMARY},
                cost=cost,
                triggers=report.trigger_sentences(
                    c.params,
                    c.metrics,
                    promoted_params=chosen.params,
                    promoted_metrics=chosen.metrics,
                    is_baseline=c.baseline,
                ),
            )
        )
    return out


def write_bundle(
    ctx: Context,
    manifest: Manifest,
    chosen: Candidate,
    front: list[Candidate],
    ranked: list[Candidate],
) -> Path:
    """Write every artifact into a fresh directory and swap it in as ``promoted/``."""
    final = ctx.study_dir / "promoted"
    tmp = ctx.study_dir / f".promoted.{int(time.time() * 1000)}.tmp"
    (tmp / "deploy").mkdir(parents=True)
    sla = ctx.sla
    objs = [o.metric for o in sla.objectives]
    front_ids = {c.trial for c in front}
    cands = candidates(ctx.study)
    base = next((c for c in cands if c.baseline), None)
    points = [
        report.Point(
            trial=c.trial,
            values={m: v for m, v in zip(objs, c.values, strict=True)},
            feasible=c.feasible,
            on_front=c.trial in front_ids,
            promoted=c.trial == chosen.trial,
            baseline=c.baseline,
            params=c.params,
        )
        for c in cands
    ]
    manifest.write(tmp / "optimization_manifest.json")
    ctx.hardware.write_csv(tmp / "hardware_profile.csv")
    (tmp / "pareto.csv").write_text(
        report.pareto_csv(points, list(dict.fromkeys([*objs, "p99_ttft_ms"])))
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
        )
    )
    profiles = [_profile(ctx, chosen, f"promoted (trial {chosen.trial})")]
    if base is not None and base.trial != chosen.trial:
        profiles.append(_profile(ctx, base, f"baseline (trial {base.trial})"))
    (tmp / "latency_breakdown.svg").write_text(
        report.latency_breakdown_svg(
            [p for p in profiles if p is not None], title=f"{sla.name}: latency at the SLA's load"
        )
    )
    reason = manifest.decision.reason if manifest.decision else ""
    (tmp / "fallback_plan.md").write_text(
        report.fallback_plan_md(
            sla.name,
            f"{'baseline (engine defaults)' if chosen.baseline else f'trial {chosen.trial}'}",
            {m: chosen.metrics.get(m) for m in SUMMARY},
            _fallbacks(ctx, chosen, ranked, base),
            [
                reason,
                f"engine: {ctx.engine_version}; hardware: {ctx.hardware.summary().splitlines()[0]}",
            ],
        )
    )
    _write_deploy(ctx, tmp / "deploy", chosen)
    _swap(tmp, final)
    return final


def _write_deploy(ctx: Context, out: Path, chosen: Candidate) -> None:
    served = ctx.sla.model.served_name or ctx.sla.model.synth or ctx.model_dir.name
    cpu = ctx.hardware.device == "cpu"
    deploy = _renderer(ctx)
    image = deploy.default_image(ctx.engine_version, cpu=cpu)
    header = [
        f"autotuner {__version__}: promoted config of study {ctx.sla.name}",
        f"engine {ctx.engine_version}",
    ]
    serve = out / "serve.sh"
    serve.write_text(deploy.serve_script(_serve_argv(ctx, chosen.params), header=header))
    serve.chmod(0o755)
    docker = out / "docker-run.sh"
    docker.write_text(
        deploy.docker_run(
            chosen.params,
            model_dir=str(ctx.model_dir),
            served_name=served,
            gpu_uuids=[g.uuid for g in ctx.hardware.gpus],
            image=image,
        )
    )
    docker.chmod(0o755)
    (out / "k8s.yaml").write_text(
        deploy.k8s_deployment(
            chosen.params,
            name=ctx.sla.name.lower().replace("_", "-").replace(".", "-"),
            served_name=served,
            image=image,
            gpus=ctx.hardware.gpu_count,
            model_subpath=ctx.model_dir.name,
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
