"""The manifest of a promotion (``optimization_manifest.json``): the promoted config,
its measurements with their spread over the confirmation replicates, its verdicts at the SLA's
own load, the study's decisions on every trial, and the provenance of it all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner import __version__
from autotuner.bundle.context import Context
from autotuner.bundle.deploy_files import serve_argv
from autotuner.bundle.figures import SUMMARY, config_label
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
from autotuner.records.trial import CapacityRecord, TrialRecord
from autotuner.search import accounting
from autotuner.search.confirm import Replicate, sla_record
from autotuner.search.launched import search_capacity, trial_file
from autotuner.search.pareto import Candidate
from autotuner.search.study import feasible, raced_out
from autotuner.search.trial import TrialResult
from autotuner.sla.load import load_unit
from autotuner.sla.spec import to_yaml


def build_manifest(
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
        gpu_minutes=accounting.account(
            ctx.study, ctx.study_dir, [r.run_dir for r in reps if r.launched]
        ),
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
        serve_argv=serve_argv(ctx, chosen.params),
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


def _confirmed_load(reps: list[Replicate], chosen: Candidate) -> float | None:
    """A load the promoted config met the SLA at in every confirmation replicate (the lowest
    of their capacities' low edges), for readers that re-check it at one load
    (compare-engines, the daemon); None without replicates or when one missed."""
    lows = [r.low for r in reps if r.config == config_label(chosen)]
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
    missed = [r for r in reps if r.config == config_label(chosen) and r.missed]
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
