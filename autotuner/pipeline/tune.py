"""A real study on real engines, ending with a promoted bundle (the library of `autotuner
tune`; the command is :mod:`autotuner.cli.tune`).

Wires the parts: model and engine environment, hardware probe, version-specific search space,
Optuna study (resumable), pruning (rules, memory model, earlier crashes), one launch per trial
with several load levels, then confirmation and promotion. Re-running the same command resumes
the study where it stopped: finished trials are never repeated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner.bundle.promote import Context, promote_manifest
from autotuner.core import hardware
from autotuner.core.errors import EngineStartFailed
from autotuner.core.paths import atomic_write_text
from autotuner.core.types import ParamValue
from autotuner.engines import envs, registry
from autotuner.engines.base import EngineAdapter
from autotuner.measure import kernel_profile
from autotuner.measure.gate import run_gate
from autotuner.measure.hostload import busy_warning
from autotuner.measure.kernels import KernelBreakdown
from autotuner.measure.launch import resolve_model
from autotuner.measure.levels import resolution_notes
from autotuner.measure.quality import GateResult
from autotuner.models.folder import read_config
from autotuner.records.manifest import Manifest
from autotuner.records.promotion import Promotion
from autotuner.records.trial import StudyRecord, TrialRecord
from autotuner.search import rerun, rules
from autotuner.search.capacity_compare import two_pair_warning
from autotuner.search.layout_plan import memory_limit_reason
from autotuner.search.lock import study_lock
from autotuner.search.priors import memory_fix, sampler_startup, strategy_for
from autotuner.search.progress import defaults_line
from autotuner.search.study import (
    Budget,
    Grid,
    StudyRunner,
    counted,
    default_budget,
    fail_stale,
    fresh_from,
    grid_budget,
    make_sampler,
    open_study,
    release_own,
    storage_url,
)
from autotuner.search.trial import SearchSettings, TrialResult, run_trial
from autotuner.sla.spec import Sla, to_yaml
from autotuner.space import ParamOverride, SearchSpace, SpaceError, load_space_for
from autotuner.space import ParamValue as SpaceValue

# Levels of one confirmation replicate: a claim that holds is bracketed by the first two and
# closed by the third (CapacitySearch.around); the fourth absorbs one undecided re-measure.
CONFIRM_LEVELS = 4


def _say(msg: str) -> None:
    print(msg, flush=True)


def _identity(
    sla: Sla, engine: str, space: SearchSpace, model_dir: Path, hw: Any, grid: Grid | None = None
) -> dict[str, str]:
    """What must not change within one study, or its trials stop being comparable."""
    workload = json.dumps(sla.workload.model_dump(mode="json"), sort_keys=True)
    extra = {"grid": json.dumps(grid, sort_keys=True)} if grid is not None else {}
    return {
        **extra,
        "engine": engine,
        "space": space.hash()[:16],
        "model": hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()[:16],
        "target": f"{sla.target.kind}:{','.join(sla.target.devices)}",
        "workload": hashlib.sha256(workload.encode()).hexdigest()[:16],
        "constraints": json.dumps({c.key: c.limit for c in sla.constraints}, sort_keys=True),
    }


def _crash_memory(
    study: optuna.Study, space: SearchSpace, engine: EngineAdapter
) -> rules.CrashMemory:
    """Rebuild what earlier launches taught: configs that crashed, with their cause."""
    defaults = {k: v for k, v in space.defaults.items() if v is not None}
    memory = rules.CrashMemory(defaults={**defaults, **space.fixed}, traits=engine.crash_traits)
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        r = TrialRecord.from_trial(t)
        if r.cause:
            memory.record(r.params_or({}), r.cause, label=f"trial {t.number}")
    return memory


def grid_space(
    space: SearchSpace,
    overrides: Mapping[str, ParamOverride],
    load: Callable[[Mapping[str, ParamOverride]], SearchSpace],
) -> tuple[SearchSpace, dict[str, list[SpaceValue]], dict[str, SpaceValue]]:
    """The space of a grid study, its grid, and the grid's one-value dimensions.

    Only the parameters the SLA lists with ``values`` are tuned; every other one is excluded
    (the engine decides), so ``load`` resolves the space again with those exclusions. A
    one-value list (``gpu_memory_utilization: {values: [0.9]}``) is a dimension of the grid,
    given to every grid point but not to the baseline, which stays the engine defaults.
    """
    listed = [n for n, o in overrides.items() if o.values is not None]
    off = {p.name: ParamOverride(exclude=True) for p in space.params if p.name not in listed}
    narrowed = load({**overrides, **off}) if off else space
    single = {n: narrowed.fixed[n] for n in listed if narrowed.fixed_by.get(n) == "only value left"}
    grid = {p.name: list(p.choices or ()) for p in narrowed.params}
    if not grid:
        raise SpaceError(["tune.sampler grid: no parameter of search.params has two values left"])
    fixed = {k: v for k, v in narrowed.fixed.items() if k not in single}
    return dataclasses.replace(narrowed, fixed=fixed), grid, single


def engine_failures(study: optuna.Study) -> tuple[list[str], int]:
    """The launches whose engine failed (it did not start, or crashed while measured), one
    line each, and how many launches measured something: those alone can decide."""
    failed: list[str] = []
    measured = 0
    since = fresh_from(study)  # a re-tune: its own launches
    for t in study.get_trials(deepcopy=False):
        if not counted(t) or t.number < since:
            continue
        r = TrialRecord.from_trial(t)
        if t.state == TrialState.FAIL and r.status == "failed":
            who = "baseline" if r.baseline else f"trial {t.number}"
            failed.append(f"{who} ({r.cause or 'other'}): {r.reason or 'no reason recorded'}")
        else:
            measured += 1
    return failed, measured


def _check_measured(study: optuna.Study, study_dir: Path) -> None:
    """Nothing measured because the engine failed in every launch is an engine failure (exit
    3), never an SLA verdict; when some launches measured, they decide and the failures are
    listed."""
    failed, measured = engine_failures(study)
    if not failed:
        return
    lines = "\n".join(f"  {line}" for line in failed)
    if measured:
        _say(
            f"{len(failed)} launch(es) failed and are left out of the decision (the "
            f"{measured} measured decide):\n{lines}"
        )
        return
    raise EngineStartFailed(
        f"the engine failed in every launch ({len(failed)} of {len(failed)}): nothing was "
        f"measured, so there is no SLA verdict\n{lines}\n"
        f"engine logs: {study_dir}/trial-*/engine.log; `autotuner doctor SLA` checks the host "
        "and the engine before a launch"
    )


def _reprint(manifest: Manifest, study: optuna.Study) -> Promotion | None:
    for line in rerun.describe(manifest, len(rerun.launches(study))):
        _say(line)
    return Promotion.from_manifest(manifest)


def tune(
    sla: Sla,
    *,
    trials_dir: Path,
    budget_trials: int | None = None,
    extra_trials: int = 0,
    executor: str = "local",
    address: str | None = None,
    reconfirm: bool = False,
    fresh: bool = False,
) -> Promotion | None:
    """Run (or resume) the study of ``sla`` and promote. Returns what was promoted (None:
    nothing was); the bundle's manifest holds the rest.

    ``extra_trials`` > 0 sets the budget to the launches already counted plus that many (a
    re-tune of a finished study); with ``fresh`` the re-tune decides on its own launches only,
    the engine defaults measured again among them (search.study.fresh_from): what was
    measured before may be out of date (a failed re-check). A finished study reprints its
    recorded decision and launches nothing (search.rerun) unless ``reconfirm``. The study is
    held for the whole run: another tuner of it gets StudyBusy (search.lock).
    """
    with study_lock(trials_dir / sla.name, sla.name, sla.tune.storage):
        return _tune(
            sla,
            trials_dir=trials_dir,
            budget_trials=budget_trials,
            extra_trials=extra_trials,
            executor=executor,
            address=address,
            reconfirm=reconfirm,
            fresh=fresh,
        )


def _tune(
    sla: Sla,
    *,
    trials_dir: Path,
    budget_trials: int | None,
    extra_trials: int,
    executor: str,
    address: str | None,
    reconfirm: bool,
    fresh: bool = False,
) -> Promotion | None:
    """:func:`tune`, with the study held."""
    model_dir = resolve_model(sla, _say)
    engine_adapter = registry.get(sla.engine.kind)  # the study's engine: resolved once, here
    python, how = envs.resolve_python(sla.engine.name, sla.engine.python, sla.engine.kind)
    dist, version = envs.probe_version(python)
    engine = f"{dist} {version}"
    hw = hardware.probe(sla.target)

    def load(overrides: Mapping[str, ParamOverride]) -> SearchSpace:
        return load_space_for(
            engine_adapter.space_name,
            version,
            hw,
            allow_lossy=sla.search.allow_lossy,
            overrides=overrides,
            engine_params=sla.engine.settings(),  # engine.params and engine.args, merged
        )

    space = load(sla.search.params)
    grid: Grid | None = None
    grid_only: dict[str, SpaceValue] = {}
    if sla.tune.sampler == "grid":
        space, grid, grid_only = grid_space(space, sla.search.params, load)
    study_dir = trials_dir / sla.name
    url = storage_url(study_dir, sla.tune.storage)
    budget = Budget(budget_trials or default_budget(sla, grid), sla.tune.time_budget_s)
    _say(f"study {sla.name} in {study_dir} ({url.split('://')[0]} storage)")
    _say(f"engine: {engine} ({how})")
    _say(hw.summary())
    for line in space.describe():
        _say(f"  {line}")
    dims: Grid | None = None
    if grid is not None:
        dims = {**grid, **{k: [v] for k, v in grid_only.items()}}
        _say(
            f"grid: {' x '.join(f'{k} {v}' for k, v in dims.items())} = "
            f"{grid_budget(grid) - 1} points after the baseline; budget {budget.trials} launches"
        )
    sampler = make_sampler(
        sla.tune.sampler,
        budget.trials,
        len(sla.objectives),
        sla.tune.seed,
        grid,
        startup_trials=sampler_startup(sla),
    )
    identity = _identity(sla, engine, space, model_dir, hw, dims)
    study = open_study(sla, url, sampler, identity, study_dir=study_dir)
    atomic_write_text(study_dir / "sla.yaml", to_yaml(sla))
    fail_stale(study, _say)
    if extra_trials > 0:
        done = sum(counted(t) for t in study.get_trials(deepcopy=False))
        budget = Budget(done + extra_trials, budget.time_s)
        _say(f"re-tune: {done} launches so far, budget raised to {budget.trials}")
        if fresh:
            # What was measured before may be out of date (a failed re-check, a changed
            # host): the re-tune measures the engine defaults again and decides on its own
            # launches only. (A config queued again, waiting to run, is launched now.)
            waiting = [t.number for t in study.get_trials(states=(TrialState.WAITING,))]
            first = min([len(study.trials), *waiting])
            StudyRecord(fresh_from=first).save(study.set_user_attr)
            _say(
                f"fresh re-tune: the decision rests on the launches from trial {first} on (the "
                "engine defaults measured again among them); earlier ones are out of date"
            )
    elif not reconfirm and len(rerun.launches(study)) >= budget.trials:
        decided = rerun.recorded_decision(study, study_dir, sla.tune.confirm.replicates)
        if decided is not None:
            return _reprint(decided, study)
    memory = _crash_memory(study, space, engine_adapter)
    model_cfg = read_config(model_dir)  # checked by load_sla too; it may have changed since
    cuda = None if sla.target.kind == "cpu" else list(sla.target.devices)
    settings = SearchSettings.of(sla)
    warnings, notes = resolution_notes(sla)
    t = sla.tune
    few = two_pair_warning(t.confirm.replicates, t.confidence, t.capacity_resolution)
    warnings += [few] if few is not None else []
    busy = busy_warning(sla.target.kind)  # the host is part of the measurement
    warnings += [busy] if busy is not None else []
    for line in notes:
        _say(f"note: {line}")
    for line in warnings:
        _say(f"warning: {line}")

    mem_limit = next((c.limit for c in sla.constraints if c.metric == "peak_memory_gib"), None)

    def prune(params: dict[str, ParamValue]) -> str | None:
        reasons = rules.check(
            params,
            model_cfg=model_cfg,
            hardware=hw,
            context_len=None,
            env=sla.engine.env,
            engine=engine_adapter,
        )
        over = memory_limit_reason(params, hw, mem_limit, engine_adapter)
        if over:
            reasons.append(over)
        return "; ".join(reasons) if reasons else memory.near_crash(params)

    def run(
        params: Mapping[str, ParamValue], trial_dir: Path, /, *, start_load: float | None = None
    ) -> TrialResult:
        # start_load: a candidate raced against the incumbent starts at its capacity.
        return run_trial(
            params,
            sla,
            python=python,
            model_dir=model_dir,
            run_dir=trial_dir,
            cuda_devices=cuda,
            adapter=engine_adapter,
            settings=(
                settings
                if start_load is None
                else dataclasses.replace(settings, start_load=start_load)
            ),
            say=_say,
        )

    def suggest(trial: optuna.Trial) -> dict[str, ParamValue]:
        return {**space.suggest(trial), **grid_only}

    def crashed(params: dict[str, ParamValue], cause: str) -> None:
        memory.record(params, cause)

    remote = None
    if executor == "ray":
        from autotuner.search.ray_executor import RayExecutor

        remote = RayExecutor(
            sla,
            adapter=engine_adapter,
            python=python,
            model_dir=model_dir,
            settings=settings,
            address=address,
            say=_say,
        )
    plan, stopper = strategy_for(sla, space, study_dir, budget.trials)
    for note in plan.describe() if plan is not None else []:
        _say(f"  {note}")
    if plan is not None:

        def over(params: Mapping[str, ParamValue]) -> str | None:
            return memory_limit_reason(params, hw, mem_limit, engine_adapter)

        plan.engine_defaults = partial(engine_adapter.defaults, hw)  # what a miss ran with
        plan.start_from = memory_fix(space, over)
        if plan.start_from:
            fix = ", ".join(f"{k}={v}" for k, v in plan.start_from.items())
            _say(f"  warm start on {fix}: the engine defaults {over({})}")
    runner = StudyRunner(
        sla,
        study,
        study_dir,
        suggest=suggest,
        fixed=space.fixed,
        prune=prune,
        run=run,
        budget=budget,
        on_crash=crashed,
        say=_say,
        executor=remote,
        plan=plan,
        stopper=stopper,
        race=grid is None,  # a grid measures every point whole; capacity-first SLAs only
    )
    started = time.monotonic()
    try:
        runner.loop()
        _say(
            f"search done: {runner.spent()} launches counted "
            f"({time.monotonic() - started:.0f} s this run)"
        )
        if not reconfirm and not runner.launch_times:  # nothing new measured
            decided = rerun.recorded_decision(study, study_dir, sla.tune.confirm.replicates)
            if decided is not None:
                return _reprint(decided, study)
        _check_measured(study, study_dir)
        if stopper is not None and (said := defaults_line(study, stopper.rule.resolution)):
            _say(said)

        def confirm_run(
            params: Mapping[str, ParamValue], run_dir: Path, claimed: float
        ) -> TrialResult:
            one = dataclasses.replace(
                settings, max_levels=CONFIRM_LEVELS, around=claimed, start_load=None
            )
            if remote is not None:
                return remote.run_one(params, run_dir, one)
            return run_trial(
                params,
                sla,
                python=python,
                model_dir=model_dir,
                run_dir=run_dir,
                cuda_devices=cuda,
                adapter=engine_adapter,
                settings=one,
                say=_say,
            )

        def profile_run(params: Mapping[str, ParamValue], run_dir: Path) -> KernelBreakdown:
            return kernel_profile.profile_config(
                params,
                sla,
                engine=engine_adapter,
                python=python,
                version=version,
                model_dir=model_dir,
                run_dir=run_dir,
                cuda_devices=cuda,
                say=_say,
            )

        def gate_run(
            baseline: Mapping[str, ParamValue], candidate: Mapping[str, ParamValue], run_dir: Path
        ) -> GateResult:
            # On this host, also with --executor ray: two launches, one after the other.
            return run_gate(
                sla,
                engine=engine_adapter,
                python=python,
                model_dir=model_dir,
                baseline=baseline,
                candidate=candidate,
                run_dir=run_dir,
                cuda_devices=cuda,
                say=_say,
            )

        ctx = Context(
            sla, study, study_dir, space, hw, model_dir, engine, python, url, engine_adapter
        )
        profiling = profile_run if kernel_profile.enabled(sla) else None
        manifest = promote_manifest(ctx, confirm_run, _say, profiling, gate=gate_run)
        if manifest.gpu_minutes is not None:
            _say(manifest.gpu_minutes.describe())
        return Promotion.from_manifest(manifest)
    except KeyboardInterrupt:
        release_own(study, _say)  # so a resume on any machine measures them again
        raise
    finally:
        if remote is not None:
            remote.close()
