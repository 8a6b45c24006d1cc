"""A real study on real engines, ending with a promoted bundle (the library of `autotuner
tune`; the command is :mod:`autotuner.cli.tune`).

Wires the parts: model and engine environment, hardware probe, version-specific search space
(pipeline.study_space), Optuna study (resumable), pruning (pipeline.pruning: rules, memory
model, earlier crashes), one launch per trial with several load levels, then confirmation and
promotion. Re-running the same command resumes the study where it stopped: finished trials
are never repeated.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from autotuner.bundle.context import Context
from autotuner.bundle.promote import promote_manifest
from autotuner.core import hardware
from autotuner.core.errors import EngineStartFailed
from autotuner.core.hardware import HardwareProfile
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
from autotuner.pipeline.pruning import Pruning, crash_memory
from autotuner.pipeline.study_space import grid_space as grid_space
from autotuner.pipeline.study_space import identity, study_space
from autotuner.records.manifest import Manifest
from autotuner.records.promotion import Promotion
from autotuner.records.trial import StudyRecord, TrialRecord
from autotuner.search import rerun
from autotuner.search.capacity_compare import two_pair_warning
from autotuner.search.layout_plan import memory_limit_reason as memory_limit_reason
from autotuner.search.levers import load_levers
from autotuner.search.lock import study_lock
from autotuner.search.priors import SearchPlan, memory_fix, sampler_startup, strategy_for
from autotuner.search.progress import StudyStopper, defaults_line
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
from autotuner.space import ParamValue as SpaceValue
from autotuner.space import SearchSpace

if TYPE_CHECKING:
    from autotuner.search.ray_executor import RayExecutor

# Levels of one confirmation replicate: a claim that holds is bracketed by the first two and
# closed by the third (CapacitySearch.around); the fourth absorbs one undecided re-measure.
CONFIRM_LEVELS = 4


def _say(msg: str) -> None:
    print(msg, flush=True)


@dataclass(frozen=True)
class Launches:
    """How this study launches its engine: a search trial, a confirmation replicate (on Ray
    when the search runs there), a kernel profile, a quality gate."""

    sla: Sla
    adapter: EngineAdapter
    python: Path
    version: str
    model_dir: Path
    cuda: list[str] | None  # None for a cpu target
    settings: SearchSettings
    remote: RayExecutor | None = None

    def trial(
        self,
        params: Mapping[str, ParamValue],
        trial_dir: Path,
        /,
        *,
        start_load: float | None = None,
    ) -> TrialResult:
        # start_load: a candidate raced against the incumbent starts at its capacity.
        settings = self.settings
        if start_load is not None:
            settings = dataclasses.replace(settings, start_load=start_load)
        return self._run(params, trial_dir, settings)

    def confirm(
        self, params: Mapping[str, ParamValue], run_dir: Path, claimed: float
    ) -> TrialResult:
        one = dataclasses.replace(
            self.settings, max_levels=CONFIRM_LEVELS, around=claimed, start_load=None
        )
        if self.remote is not None:
            return self.remote.run_one(params, run_dir, one)
        return self._run(params, run_dir, one)

    def _run(
        self, params: Mapping[str, ParamValue], run_dir: Path, settings: SearchSettings
    ) -> TrialResult:
        return run_trial(
            params,
            self.sla,
            python=self.python,
            model_dir=self.model_dir,
            run_dir=run_dir,
            cuda_devices=self.cuda,
            adapter=self.adapter,
            settings=settings,
            say=_say,
        )

    def profile(self, params: Mapping[str, ParamValue], run_dir: Path) -> KernelBreakdown:
        return kernel_profile.profile_config(
            params,
            self.sla,
            engine=self.adapter,
            python=self.python,
            version=self.version,
            model_dir=self.model_dir,
            run_dir=run_dir,
            cuda_devices=self.cuda,
            say=_say,
        )

    def gate(
        self,
        baseline: Mapping[str, ParamValue],
        candidate: Mapping[str, ParamValue],
        run_dir: Path,
    ) -> GateResult:
        # On this host, also with --executor ray: two launches, one after the other.
        return run_gate(
            self.sla,
            engine=self.adapter,
            python=self.python,
            model_dir=self.model_dir,
            baseline=baseline,
            candidate=candidate,
            run_dir=run_dir,
            cuda_devices=self.cuda,
            say=_say,
        )


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
    adapter = registry.get(sla.engine.kind)  # the study's engine: resolved once, here
    python, how = envs.resolve_python(sla.engine.name, sla.engine.python, sla.engine.kind)
    dist, version = envs.probe_version(python)
    engine = f"{dist} {version}"
    hw = hardware.probe(sla.target)
    space, grid, grid_only = study_space(sla, adapter, version, hw)
    study_dir = trials_dir / sla.name
    url = storage_url(study_dir, sla.tune.storage)
    budget = Budget(
        budget_trials or default_budget(sla, grid),
        sla.tune.time_budget_s,
        sla.tune.gpu_minutes(sla.target.kind),
    )
    _say(f"study {sla.name} in {study_dir} ({url.split('://')[0]} storage)")
    _say(f"engine: {engine} ({how})")
    if budget.gpu_minutes is not None:
        _say(
            f"budget: {budget.trials} launches or {budget.gpu_minutes:g} GPU-minutes "
            "(tune.budget_gpu_minutes), whichever comes first"
        )
    dims = _describe(hw, space, grid, grid_only, budget)
    sampler = make_sampler(
        sla.tune.sampler,
        budget.trials,
        len(sla.objectives),
        sla.tune.seed,
        grid,
        startup_trials=sampler_startup(sla),
    )
    ident = identity(sla, engine, space, model_dir, hw, dims)
    study = open_study(sla, url, sampler, ident, study_dir=study_dir)
    atomic_write_text(study_dir / "sla.yaml", to_yaml(sla))
    fail_stale(study, _say)
    if extra_trials > 0:
        budget = _retune_budget(study, budget, extra_trials, fresh)
    elif not reconfirm and len(rerun.launches(study)) >= budget.trials:
        decided = rerun.recorded_decision(study, study_dir, sla.tune.confirm.replicates)
        if decided is not None:
            return _reprint(decided, study)
    model_cfg = read_config(model_dir)  # checked by load_sla too; it may have changed since
    pruning = Pruning(sla, adapter, hw, model_cfg, crash_memory(study, space, adapter))
    launches = Launches(
        sla,
        adapter,
        python,
        version,
        model_dir,
        cuda=None if sla.target.kind == "cpu" else list(sla.target.devices),
        settings=SearchSettings.of(sla),
    )
    _warn(sla)
    if executor == "ray":
        launches = dataclasses.replace(launches, remote=_ray(launches, address))
    plan, stopper = _strategy(sla, space, study_dir, budget, hw, pruning)
    runner = StudyRunner(
        sla,
        study,
        study_dir,
        suggest=partial(_suggest, space, grid_only),
        fixed=space.fixed,
        prune=pruning.why,
        run=launches.trial,
        budget=budget,
        on_crash=pruning.crashed,
        say=_say,
        executor=launches.remote,
        plan=plan,
        stopper=stopper,
        race=grid is None,  # a grid measures every point whole; capacity-first SLAs only
    )
    try:
        measured = _search(runner)
        if not reconfirm and not measured:  # nothing new measured
            decided = rerun.recorded_decision(study, study_dir, sla.tune.confirm.replicates)
            if decided is not None:
                return _reprint(decided, study)
        _check_measured(study, study_dir)
        if stopper is not None and (said := defaults_line(study, stopper.rule.resolution)):
            _say(said)
        ctx = Context(sla, study, study_dir, space, hw, model_dir, engine, python, url, adapter)
        return _promote(ctx, launches)
    except KeyboardInterrupt:
        release_own(study, _say)  # so a resume on any machine measures them again
        raise
    finally:
        if launches.remote is not None:
            launches.remote.close()


def _describe(
    hw: HardwareProfile,
    space: SearchSpace,
    grid: Grid | None,
    grid_only: dict[str, SpaceValue],
    budget: Budget,
) -> Grid | None:
    """Print the host, the space and the grid; returns the grid's dimensions (None: no
    grid), one-value ones included."""
    _say(hw.summary())
    for line in space.describe():
        _say(f"  {line}")
    if grid is None:
        return None
    dims = {**grid, **{k: [v] for k, v in grid_only.items()}}
    _say(
        f"grid: {' x '.join(f'{k} {v}' for k, v in dims.items())} = "
        f"{grid_budget(grid) - 1} points after the baseline; budget {budget.trials} launches"
    )
    return dims


def _retune_budget(study: optuna.Study, budget: Budget, extra: int, fresh: bool) -> Budget:
    """A re-tune: the launches counted so far plus ``extra``; with ``fresh``, the decision
    rests on its own launches from here on."""
    done = sum(counted(t) for t in study.get_trials(deepcopy=False))
    # Extra launches asked for by number: the GPU-minute budget of the first run is spent.
    budget = Budget(done + extra, budget.time_s)
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
    return budget


def _warn(sla: Sla) -> None:
    """Print what limits this study's resolution and what may disturb its measurements."""
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


def _ray(launches: Launches, address: str | None) -> RayExecutor:
    from autotuner.search.ray_executor import RayExecutor  # Ray is optional

    return RayExecutor(
        launches.sla,
        adapter=launches.adapter,
        python=launches.python,
        model_dir=launches.model_dir,
        settings=launches.settings,
        address=address,
        say=_say,
    )


def _strategy(
    sla: Sla,
    space: SearchSpace,
    study_dir: Path,
    budget: Budget,
    hw: HardwareProfile,
    pruning: Pruning,
) -> tuple[SearchPlan | None, StudyStopper | None]:
    """The search plan (warm start, hopeless pruning) and the stopping rule, described."""
    plan, stopper = strategy_for(sla, space, study_dir, budget.trials)
    if plan is None:
        return plan, stopper
    for note in plan.describe():
        _say(f"  {note}")
    plan.engine_defaults = partial(pruning.adapter.defaults, hw)  # what a miss ran with
    plan.levers = load_levers(pruning.adapter.levers_file)  # what moves which limit
    plan.where = _where(hw)
    plan.start_from = memory_fix(space, pruning.over_memory)
    if plan.start_from:
        fix = ", ".join(f"{k}={v}" for k, v in plan.start_from.items())
        _say(f"  warm start on {fix}: the engine defaults {pruning.over_memory({})}")
    return plan, stopper


def _where(hw: HardwareProfile) -> str:
    """The target in the "infeasible losslessly" answer: "on this GPU", "on these 2 GPUs"."""
    n = len(hw.gpus)
    if n == 0:
        return "on this host's CPU"
    return "on this GPU" if n == 1 else f"on these {n} GPUs"


def _suggest(
    space: SearchSpace, grid_only: dict[str, SpaceValue], trial: optuna.Trial
) -> dict[str, ParamValue]:
    return {**space.suggest(trial), **grid_only}


def _search(runner: StudyRunner) -> bool:
    """Run the search to its budget; whether it launched anything this run."""
    started = time.monotonic()
    runner.loop()
    _say(
        f"search done: {runner.spent()} launches counted "
        f"({time.monotonic() - started:.0f} s this run)"
    )
    return bool(runner.launch_times)


def _promote(ctx: Context, launches: Launches) -> Promotion | None:
    """Confirm the best, profile and gate it where the SLA asks, write the bundle."""
    profiling = launches.profile if kernel_profile.enabled(ctx.sla) else None
    manifest = promote_manifest(ctx, launches.confirm, _say, profiling, gate=launches.gate)
    if manifest.gpu_minutes is not None:
        _say(manifest.gpu_minutes.describe())
    return Promotion.from_manifest(manifest)
