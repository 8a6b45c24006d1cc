"""Running a confirmation: which configs to launch again, their interleaved replicate
launches (each a capacity search around the config's claim, resumable through
:class:`~autotuner.search.confirm_plan.ConfirmPlan`), and the decision on what they measured
(:mod:`autotuner.search.confirm` holds the rule). The bundle renders the result."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from autotuner.core.types import ParamValue
from autotuner.engines.base import EngineAdapter, OptionRoles
from autotuner.engines.layout import CAPACITY_PER_GPU, devices_used
from autotuner.measure.levels import LOAD_INDEPENDENT
from autotuner.records.trial import CapacityRecord, TrialRecord
from autotuner.search.capacity_compare import select_for_confirmation
from autotuner.search.confirm import (
    Decision,
    Replicate,
    decide,
    decide_without_baseline,
    fixed_misses,
    interleaved_order,
    known_zero,
    miss_note,
    not_confirmed,
    per_gpu_replicate,
    per_gpu_scale,
)
from autotuner.search.confirm_plan import ConfirmPlan
from autotuner.search.launched import StudyView, candidates, search_capacity, trial_file
from autotuner.search.pareto import Candidate
from autotuner.search.study import fresh_from, raced_out
from autotuner.search.trial import CRASHED, Level, TrialResult
from autotuner.sla.load import load_unit, sla_load
from autotuner.sla.spec import Sla

Say = Callable[[str], None]
# Runs one confirmation launch: (params, run directory, claimed capacity) -> result, a narrow
# capacity search around the claim.
ConfirmRun = Callable[[Mapping[str, ParamValue], Path, float], TrialResult]


class ConfirmContext(StudyView, Protocol):
    """What a confirmation reads: the study, its SLA and the adapter of the engine it tuned."""

    @property
    def sla(self) -> Sla: ...

    @property
    def engine(self) -> EngineAdapter: ...


def confirm(
    ctx: ConfirmContext,
    ranked: list[Candidate],
    run: ConfirmRun,
    say: Say,
    limit: int | None = None,
) -> tuple[Decision, list[Replicate], dict[str, Candidate]]:
    """Decide whether a candidate replaces the baseline (see :mod:`autotuner.search.confirm`);
    launches only when a candidate leads by more than the resolution. ``limit``: how many of
    ``ranked`` may be confirmed (default ``tune.confirm.candidates``)."""
    sla = ctx.sla
    spec = sla.tune.confirm
    resolution = sla.tune.capacity_resolution
    limit = limit or spec.candidates
    top = [c for c in ranked if not c.baseline][:limit]
    configs: dict[str, Candidate] = {f"trial-{c.trial}": c for c in top}
    claims = {name: search_capacity(ctx, c.trial) for name, c in configs.items()}
    launched = candidates(ctx.study)
    base = next((c for c in launched if c.baseline), None)
    if base is None:
        lead = next(iter(configs))
        reps = _replicates(ctx, {lead: configs[lead]}, claims, spec.replicates, run, say)
        return decide_without_baseline(reps, [lead]), reps, configs
    configs["baseline"] = base
    claims["baseline"] = search_capacity(ctx, base.trial)
    # Capacity per GPU as the first objective: configs compare by it (a layout of more GPUs
    # must serve more than proportionally more to win).
    roles = ctx.engine.roles
    scale = {name: per_gpu_scale(sla, c.params, roles) for name, c in configs.items()}
    base_value = _scaled(_held(claims["baseline"], base), scale["baseline"])
    selection = select_for_confirmation(
        {
            name: _scaled(_held(claims[name], c), scale[name])
            for name, c in configs.items()
            if name != "baseline"
        },
        base_value,
        resolution,
        limit=limit,
    )
    if not selection.labels:
        reason = selection.reason
        if not top and any(c.feasible and not c.baseline for c in launched):
            # Candidates met the SLA but none reached the front: the baseline measured best.
            reason = "no confirmation: the baseline measured best (no candidate on the front)"
        elif all(c.baseline for c in launched):
            since = fresh_from(ctx.study)  # a re-tune's own launches only, as `launched`
            raced = sum(
                t.number >= since and raced_out(t) for t in ctx.study.get_trials(deepcopy=False)
            )
            reason = (
                f"no confirmation: {raced} candidate(s) launched, each raced out (it missed "
                "the SLA at the baseline's capacity), so none has a capacity to confirm"
                if raced
                else "no confirmation: only the baseline was launched"
            )
        return not_confirmed(f"kept the baseline, no launch spent: {reason}"), [], configs
    if spec.replicates < 2:
        lead = selection.labels[0]
        if not base_value:
            why = (
                f"promoted {lead} without confirmation: the baseline missed the SLA at its own "
                f"load in the search and {lead} met it (single runs; tune.confirm.replicates "
                f"{spec.replicates} cannot measure the spread)"
            )
            return not_confirmed(why, lead), [], configs
        why = (
            f"kept the baseline, no launch spent: {selection.reason}, but with "
            f"tune.confirm.replicates {spec.replicates} no confirmation can measure the spread "
            "(at least 2 are needed), so none could promote it"
        )
        return not_confirmed(why), [], configs
    say(selection.reason)
    chosen = {name: configs[name] for name in selection.labels}
    fixed = _fixed_miss(ctx, base)
    if not fixed:
        chosen["baseline"] = base
    reps = _replicates(ctx, chosen, claims, spec.replicates, run, say)
    if fixed:
        say(
            f"baseline not launched again: in the search it missed {', '.join(fixed)} at every "
            "level, which no load changes (capacity 0 in every replicate)"
        )
        reps += known_zero("baseline", spec.replicates, f"trial-{base.trial} (search)")
    decision = decide(
        [per_gpu_replicate(r, scale[r.config]) for r in reps],
        list(selection.labels),
        min_effect=spec.min_effect,
        confidence=sla.tune.confidence,
        resolution=resolution,
        search_misses={} if base.feasible else {"baseline": _search_miss(ctx, base)},
    )
    return decision, reps, configs


def _search_miss(ctx: ConfirmContext, c: Candidate) -> str:
    """What a config's search launch saw at the SLA's own load, where it missed the SLA."""
    trial = trial_file(ctx, c.trial)
    if trial is None:
        return TrialRecord.from_trial(ctx.study.trials[c.trial]).reason or "missed the SLA"
    cap = trial.found_capacity()
    last = trial.levels[-1] if trial.levels else None
    return miss_note(
        cap.note if cap is not None else trial.reason,
        cap.stopped_by if cap is not None else None,
        None if last is None else last.generator_behind,
    )


def _fixed_miss(ctx: ConfirmContext, base: Candidate) -> list[str]:
    """The limits the baseline missed in the search that no load changes (see
    :func:`autotuner.search.confirm.fixed_misses`); [] when it must be launched again."""
    if base.feasible:
        return []
    trial = trial_file(ctx, base.trial)
    if trial is None:
        return []
    metric_of = {c.key: c.metric for c in ctx.sla.constraints}
    return fixed_misses([lv.verdicts for lv in trial.levels], metric_of, LOAD_INDEPENDENT)


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def _held(cap: CapacityRecord | None, c: Candidate) -> float | None:
    """The capacity a config held in the search: 0 when it missed the SLA at its own load."""
    if not c.feasible:
        return 0.0
    return None if cap is None else cap.value


def _replicates(
    ctx: ConfirmContext,
    configs: Mapping[str, Candidate],
    claims: Mapping[str, CapacityRecord | None],
    replicates: int,
    run: ConfirmRun,
    say: Say,
) -> list[Replicate]:
    """Interleaved confirmation launches, each a capacity search around the config's claim."""
    names = list(configs)
    plan = interleaved_order(names, replicates)
    unit = load_unit(ctx.sla)
    own = sla_load(ctx.sla)
    around = {}
    for name in names:
        cap = claims.get(name)
        around[name] = cap.value if cap is not None and cap.value > 0 else own
    shown = ", ".join(f"{n} around {around[n]:.3g}" for n in names)
    say(f"confirming by capacity ({unit}): {shown}; {len(plan)} launches, interleaved")
    confirm_dir = ctx.study_dir / "confirm"
    run_dirs = [confirm_dir / f"{name}-r{r}" for r, name in plan]
    recorded = ConfirmPlan(confirm_dir, {n: configs[n].params for n in names}, around, replicates)
    how = recorded.start(run_dirs)
    if how == "resumed":
        say("resuming the interrupted confirmation: the replicates it finished are kept")
    elif how == "extended":
        say(
            f"extending the confirmation of {recorded.earlier} replicates to {replicates}: "
            "the replicates it finished are kept"
        )
    reps: list[Replicate] = []
    took: list[float] = []  # wall seconds of each confirmation launch measured here
    for i, ((r, name), run_dir) in enumerate(zip(plan, run_dirs, strict=True), 1):
        res = recorded.finished(run_dir, r, configs[name].params)
        if res is not None:
            say(f"confirmation {i}/{len(plan)}: {name}, replicate {r + 1}: measured before")
        else:
            say(f"confirmation {i}/{len(plan)}: {name}, replicate {r + 1}{_eta(took, plan, i)}")
            started = time.monotonic()
            res = run(configs[name].params, run_dir, around[name])
            took.append(time.monotonic() - started)
        at = str(run_dir.relative_to(ctx.study_dir))
        reps.append(_replicate(name, r, res, at, ctx.engine.roles))
        got = reps[-1].capacity
        if reps[-1].missed:
            say(f"  -> missed the SLA at its own load (capacity 0): {reps[-1].note}")
        elif got is not None:
            say(f"  -> capacity {got:.3g} {unit}")
        elif res.status == "failed":
            what = (
                "the engine crashed while measured"
                if res.cause == CRASHED
                else f"failed to launch ({res.cause})"
            )
            say(f"  -> {what}: left out of the comparison")
        else:
            cap = res.found_capacity()
            note = cap.note if cap is not None else res.reason
            say(f"  -> capacity unknown ({note}): left out of the comparison")
    recorded.done()
    return reps


def _eta(took: Sequence[float], plan: Sequence[object], i: int) -> str:
    """``; 5 launches left with this one, ETA 12 min`` from the mean of the confirmation
    launches measured so far (nothing before the first)."""
    if not took:
        return ""
    left = len(plan) - i + 1
    eta = left * sum(took) / len(took)
    return f"; {left} launch{'' if left == 1 else 'es'} left with this one, ETA {eta / 60:.0f} min"


def _replicate(name: str, r: int, res: TrialResult, run_dir: str, roles: OptionRoles) -> Replicate:
    """One confirmation replicate of ``res``; its capacity per GPU divides by the devices its
    params lay out (``roles``: the engine's), also for results read back from older files."""
    whole = res.metric("capacity")
    per_gpu = None if whole is None else whole / devices_used(res.params, roles)
    cap = None if res.status == "failed" else res.found_capacity()
    if cap is not None and cap.low <= 0 and cap.stopped_by == "budget":
        # Stepped down from its claim without reaching the SLA's own load: its capacity is
        # unknown (somewhere below the lowest level tried), not "missed the SLA".
        cap = None
    level = None
    if res.levels:
        level = res.levels[res.best if res.best is not None else 0]
    note, margins, verdicts = None, {}, {}
    if cap is not None and cap.value <= 0 and res.levels:
        # Missed the SLA at its own load: the lowest level measured is that load.
        own = min(res.levels, key=lambda lv: lv.load)
        note = miss_note(cap.note, cap.stopped_by, res.levels[-1].generator_behind)
        margins, verdicts = dict(own.margins), dict(own.verdicts)
    return Replicate(
        config=name,
        replicate=r,
        capacity=None if cap is None else cap.value,
        low=None if cap is None else cap.low,
        high=None if cap is None else cap.high,
        stopped_by=None if cap is None else cap.stopped_by,
        goodput=res.metric("goodput"),
        feasible=res.feasible,
        metrics={
            **(level.metrics if level else {}),
            CAPACITY_PER_GPU: None if cap is None else per_gpu,
        },
        run_dir=run_dir,
        note=note,
        margins=margins,
        verdicts=dict(verdicts),
        paced_out=cap is not None and cap.value > 0 and paced_out_above(res.levels, cap.value),
    )


def paced_out_above(levels: Sequence[Level], capacity: float) -> bool:
    """Whether every level above ``capacity`` met every limit and was undecided only because
    the load generator fell behind (on a CPU target it shares the engine's cores)."""
    above = [lv for lv in levels if lv.load > capacity]
    return bool(above) and all(
        lv.generator_behind is True
        and bool(lv.verdicts)
        and all(v == "meets" for v in lv.verdicts.values())
        for lv in above
    )
