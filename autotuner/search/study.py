"""The study: an Optuna ask/tell loop over engine configs, stored in an RDB (SQLite default).

The storage is the single source of truth: re-running the same command resumes the study.
At start-up, trials left RUNNING by a crash are failed and their configs queued again; the
engine defaults run first as the baseline; each suggestion is checked against known rules,
the memory model and earlier launch crashes before anything is launched (pruned with the
reason otherwise); a config measured before is not launched again (its result is reused).
Feasibility is stored as Optuna constraints (``trial.set_constraint``; feasible when every
value is <= 0), one per SLA constraint, measured at the SLA's own load.

Racing (``race=True``, a capacity-first study): a candidate's first level is the incumbent's
capacity (the feasible launch with the highest capacity so far, at its bracket's low end, so
that a candidate merely equal to it still meets). A miss there means it cannot beat the
incumbent by more than the resolution: the launch ends after that level and the trial is
PRUNED in Optuna, the level reported as its intermediate value (step 0) and kept with the
reason as user attributes; it has no capacity, only that level, and never reaches the Pareto
front. A meet climbs from there to the candidate's own capacity. The baseline is never raced.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import time
import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotuner.core.errors import BadInput
from autotuner.core.types import ParamValue
from autotuner.records.trial import StudyRecord, TrialRecord
from autotuner.search.executors import Executor, LocalExecutor, RunTrial
from autotuner.search.lock import current_owner, owner_state
from autotuner.search.storage import create_or_load
from autotuner.search.tpe import RacingTPESampler
from autotuner.search.trial import TrialResult, own_load
from autotuner.sla.spec import Sla
from autotuner.space import ParamValue as GridValue

if TYPE_CHECKING:  # both import this module
    from autotuner.search.priors import SearchPlan
    from autotuner.search.progress import StudyStopper

Say = Callable[[str], None]

# What a trial whose config was measured before takes over from that earlier trial.
_REUSED = {"result_file", "status", "max_load", "capacity", "metrics"}

# The constraint a trial gets when its SLA load was undecided although every point value was
# inside its limit (feasible only when every constraint is <= 0).
UNDECIDED = "sla_undecided_at_own_load"

# Safety valves for tiny spaces: stop asking when nothing new comes out.
MAX_CONSECUTIVE_SKIPS = 40
# Proposals out of reach since the last launch before the latest one is moved into reach
# (search.nearby): the sampler's own proposal near a feasible config is the better
# candidate, and on spaces of a few knobs it finds one within a few tries; on the H200's 12
# it found none in 40.
MOVE_AFTER = 10


class StudyMismatch(BadInput):
    """The stored study was made for another SLA, engine or search space."""


@dataclass(frozen=True)
class Budget:
    trials: int  # finished launches, baseline included
    time_s: float | None = None
    gpu_minutes: float | None = None  # GPU-minutes of the counted launches (None: no limit)


def config_key(params: Mapping[str, ParamValue]) -> str:
    return json.dumps(dict(sorted(params.items())), sort_keys=True, separators=(",", ":"))


def storage_url(study_dir: Path, url: str | None) -> str:
    if url:
        return url
    study_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(study_dir / 'study.db').resolve()}"


Grid = Mapping[str, Sequence[GridValue]]


class GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, fitted to this study loop.

    A grid point is taken when a trial first suggests a parameter, not when it is asked:
    the baseline trial suggests nothing, so it must not use up a point (upstream gives trial
    ``n`` point ``n`` on ask). Points go in the seeded shuffled order, the lowest free index
    first, so a resumed study continues the same sequence. The loop stops on the budget or an
    exhausted grid, not through ``study.stop()``, which raises outside ``optimize``.
    """

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        pass

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        pass

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: optuna.distributions.BaseDistribution,
    ) -> Any:
        if "grid_id" not in trial.system_attrs:
            storage = study._storage
            if "grid_id" not in storage.get_trial_system_attrs(trial._trial_id):
                free = self.free_points(study)
                grid_id = min(free) if free else 0  # none free: a repeat, reused as such
                storage.set_trial_system_attr(trial._trial_id, "search_space", self._search_space)
                storage.set_trial_system_attr(trial._trial_id, "grid_id", grid_id)
            trial = storage.get_trial(trial._trial_id)
        return super().sample_independent(study, trial, param_name, param_distribution)

    def free_points(self, study: optuna.Study) -> list[int]:
        """Grid points neither settled nor running (in a re-tune: since it began, so that it
        measures the grid again). Upstream's unvisited list falls back to the running ones
        once all have started: with trials in flight that launches a repeat."""
        since = fresh_from(study)
        taken = {
            t.system_attrs["grid_id"]
            for t in study._storage.get_all_trials(study._study_id, deepcopy=False)
            if "grid_id" in t.system_attrs
            and t.number >= since
            and self._same_search_space(t.system_attrs["search_space"])
            and (t.state.is_finished() or t.state == TrialState.RUNNING)
        }
        return [i for i in range(len(self._all_grids)) if i not in taken]


def grid_budget(grid: Grid) -> int:
    """Launches that cover a whole grid: every point once, plus the baseline."""
    return math.prod(len(v) for v in grid.values()) + 1


def default_budget(sla: Sla, grid: Grid | None) -> int:
    """The SLA's ``tune.trials``; a grid study that does not set it covers its whole grid."""
    if grid is not None and "trials" not in sla.tune.model_fields_set:
        return grid_budget(grid)
    return sla.tune.trials


def make_sampler(
    kind: str,
    budget: int,
    n_objectives: int,
    seed: int,
    grid: Grid | None = None,
    startup_trials: int | None = None,
) -> optuna.samplers.BaseSampler:
    """``auto``: TPE (multivariate) for small budgets, NSGA-II from 100 trials up.

    ``startup_trials``: finished trials before TPE models instead of sampling at random (None:
    a quarter of the budget, 2 to 10); a warm start's trials are better first observations.
    ``grid``: every combination of ``grid``'s values (vLLM auto_tune style), needs ``grid``.
    Optuna's GP sampler would suit small budgets well but needs PyTorch, which the tuner
    itself must not depend on.
    """
    if kind == "grid":
        if not grid:
            raise ValueError("the grid sampler needs parameters with explicit values")
        return GridSampler(grid, seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "nsga2" or (kind == "auto" and budget >= 100):
        return optuna.samplers.NSGAIISampler(
            seed=seed, population_size=min(50, max(8, budget // 5))
        )
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    # group=True: the baseline trial has no params, so without groups the multivariate
    # search space (params common to every finished trial) stays empty all study long.
    # Optuna marks ``group`` experimental and warns on every tune: that warning, and only
    # here, is silenced (the choice is deliberate; any other warning still shows).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RacingTPESampler(
            seed=seed,
            multivariate=True,
            group=True,
            constant_liar=True,
            n_startup_trials=(
                startup_trials if startup_trials is not None else max(2, min(10, budget // 4))
            ),
        )


def open_study(
    sla: Sla,
    url: str,
    sampler: optuna.samplers.BaseSampler,
    identity: dict[str, str],
    *,
    study_dir: Path | None = None,
) -> optuna.Study:
    """Create or load the study; refuse one made for another SLA, engine or space, and a
    storage that can't be used as it is (``study_dir``: where its trials are; see
    :func:`~autotuner.search.storage.check_sqlite`)."""
    directions = [o.direction for o in sla.objectives]
    study = create_or_load(sla.name, url, sampler, directions, study_dir=study_dir)
    if [d.name.lower() for d in study.directions] != directions:
        raise StudyMismatch(
            f"study {sla.name!r} in {url} has other objectives; use another study name"
        )
    name_objectives(study, [o.metric for o in sla.objectives])
    stored = StudyRecord.from_attrs(study.user_attrs, sla.name).identity
    if stored is None:
        StudyRecord(identity=identity, objectives=[o.metric for o in sla.objectives]).save(
            study.set_user_attr
        )
    else:
        changed = [k for k in identity if stored.get(k) != identity[k]]
        if changed:
            raise StudyMismatch(
                f"study {sla.name!r} was run with another {', '.join(changed)} "
                f"({', '.join(f'{k}: {stored.get(k)}' for k in changed)}); trials would not be "
                "comparable: give this run another study name (--study NAME) or delete the study"
            )
    return study


def name_objectives(study: optuna.Study, names: list[str]) -> None:
    """Name the study's objective values (optuna-dashboard and ``trials_dataframe`` show these
    names instead of "Objective 0"); written once, and again only if they changed."""
    if study.metric_names != names:
        with warnings.catch_warnings():  # experimental in Optuna 5, and stable since 3.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)


def fail_stale(study: optuna.Study, say: Say) -> list[int]:
    """Fail trials left RUNNING by a crash and queue their configs again (once each).

    With ask/tell there is no heartbeat, so nothing else would ever close them. Only trials
    whose owner (the tuner that asked them) is gone are failed: one still running here, or
    on another host where it can't be seen, is left alone.
    """
    stale = []
    for t in _running(study):
        owner = TrialRecord.from_trial(t).owner
        state = owner_state(owner)
        if state == "gone":
            stale.append(t)
        elif owner is not None:
            alive = "still running" if state == "alive" else "may still run (another host)"
            say(f"trial {t.number} is running in {owner.describe()}, which {alive}: left alone")
    return _requeue(study, stale, say)


def release_own(study: optuna.Study, say: Say) -> list[int]:
    """Fail this process's RUNNING trials and queue their configs again, on an interrupt.

    Left RUNNING, a trial would be failed only by the next run on this host; a run resumed on
    another machine (a host name it can't check) would leave it alone and never measure it.
    """
    me = os.getpid(), socket.gethostname()
    own = [
        t
        for t in _running(study)
        if (o := TrialRecord.from_trial(t).owner) is not None and (o.pid, o.host) == me
    ]
    return _requeue(study, own, say)


def _running(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]


def _requeue(study: optuna.Study, trials: list[FrozenTrial], say: Say) -> list[int]:
    storage = study._storage  # public API has no way to fail another process's trial
    for t in trials:
        TrialRecord(interrupted=True).save(partial(storage.set_trial_user_attr, t._trial_id))
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        if TrialRecord.from_trial(t).baseline:  # re-run first by the next run, unqueued
            say(f"trial {t.number} was interrupted: failed; the baseline runs again")
            continue
        if t.params:
            study.enqueue_trial(t.params, user_attrs=TrialRecord(requeued_from=t.number).attrs())
        say(f"trial {t.number} was interrupted: failed, and its config queued again")
    return [t.number for t in trials]


def _requeued_values(trial: optuna.Trial) -> dict[str, ParamValue] | None:
    """The values ``trial`` was queued with: an interrupted trial's, when it is its re-queued
    copy; a config moved within reach of an out-of-reach proposal (search.nearby)."""
    r = TrialRecord.from_trial(trial)
    if r.requeued_from is None and r.moved_from is None:
        return None
    # Optuna keeps enqueued values in a system attribute that Trial no longer exposes.
    fixed = trial.storage.get_trial_system_attrs(trial._trial_id).get("fixed_params")
    return dict(fixed) if isinstance(fixed, dict) else None


def counted(t: FrozenTrial) -> bool:
    """Trials that spent the budget: a finished launch, or a launch that crashed."""
    if t.state == TrialState.COMPLETE:
        return not TrialRecord.from_trial(t).duplicate
    if t.state == TrialState.PRUNED:  # raced out: launched, and ended at its first level
        return raced_out(t)
    return t.state == TrialState.FAIL and not TrialRecord.from_trial(t).interrupted


def raced_out(t: FrozenTrial) -> bool:
    """A candidate pruned after its launch: it missed the SLA at the incumbent's capacity."""
    if t.state != TrialState.PRUNED:
        return False
    r = TrialRecord.from_trial(t)
    return r.race_level is not None and r.result_file is not None


def race_start(study: optuna.Study, sla: Sla) -> tuple[float, int] | None:
    """Where a candidate races the incumbent: ``(load, incumbent trial)``, the low end of the
    bracket of the feasible launch with the highest capacity so far (since a re-tune began).
    None when the first objective is not capacity, nothing met the SLA yet, or the incumbent's
    capacity is the SLA's own load (where every launch starts anyway)."""
    if not sla.objectives or sla.objectives[0].metric != "capacity":
        return None
    since = fresh_from(study)
    best: tuple[float, float, int] | None = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.number < since or not feasible(t):
            continue
        cap = TrialRecord.from_trial(t).capacity
        if cap is None or cap.low <= 0:
            continue
        if best is None or cap.value > best[0]:
            best = (cap.value, cap.low, t.number)
    if best is None or best[1] <= own_load(sla) * (1 + 1e-9):
        return None
    return best[1], best[2]


def lost_race(result: TrialResult, level: float) -> bool:
    """A raced launch that did not meet the SLA at its first level, ``level``."""
    cap = result.found_capacity()
    return cap is None or cap.low < level * (1 - 1e-9)


def tell_raced_out(
    study: optuna.Study,
    trial: optuna.Trial,
    result: TrialResult,
    rel_file: str,
    race: tuple[float, int],
    resolution: float,
) -> TrialState:
    """Prune a candidate that missed the SLA at the incumbent's capacity: the level as its
    intermediate value (step 0) and, with the reason, as user attributes; no capacity."""
    level, incumbent = race
    unit = "req/s" if result.load_kind == "rate" else "concurrent requests"
    why = f": {result.reason}" if result.reason else ""
    reason = (
        f"raced out: missed the SLA at the incumbent's capacity, {level:.3g} {unit} (trial "
        f"{incumbent}), so it cannot beat it by more than the resolution ({resolution:.0%}); "
        f"no capacity, only this level{why}"
    )
    TrialRecord(
        result_file=rel_file,
        status=result.status,
        reason=reason,
        race_level=level,
        race_incumbent=incumbent,
        gpu_seconds=result.gpu_seconds,
    ).save(trial.set_user_attr)
    if len(study.directions) == 1:
        trial.report(level, 0)
    else:  # Trial.report refuses multi-objective studies; the storage keeps it all the same
        study._storage.set_trial_intermediate_value(trial._trial_id, 0, level)
    study.tell(trial, state=TrialState.PRUNED)
    return TrialState.PRUNED


def fresh_from(study: optuna.Study) -> int:
    """The first trial whose launch may decide: a fresh re-tune's first (``tune
    --extra-trials N --fresh``), for the launches before it may be out of date; 0 when every
    launch counts."""
    return StudyRecord.from_attrs(study.user_attrs, study.study_name).fresh_from or 0


def baseline_done(study: optuna.Study) -> bool:
    """The engine defaults were launched (since a fresh re-tune began: it measures them
    again)."""
    since = fresh_from(study)
    return any(
        t.state in (TrialState.COMPLETE, TrialState.FAIL)
        and t.number >= since
        and (r := TrialRecord.from_trial(t)).baseline
        and not r.interrupted
        for t in study.get_trials(deepcopy=False)
    )


def objective_values(result: TrialResult, sla: Sla) -> list[float] | None:
    values = [result.metric(o.metric) for o in sla.objectives]
    if any(v is None or math.isnan(v) for v in values):
        return None
    return [float(v) for v in values if v is not None]


def tell_result(
    study: optuna.Study, trial: optuna.Trial, result: TrialResult, sla: Sla, rel_file: str
) -> TrialState:
    TrialRecord(
        result_file=rel_file,
        status=result.status,
        max_load=result.max_load,
        capacity=result.found_capacity(),
        metrics={m: result.metric(m) for m in _summary_metrics(sla)},
    ).save(trial.set_user_attr)
    if result.gpu_seconds:
        TrialRecord(gpu_seconds=result.gpu_seconds).save(trial.set_user_attr)
    if result.reason:
        TrialRecord(reason=result.reason).save(trial.set_user_attr)
    if result.status == "failed":
        TrialRecord(cause=result.cause).save(trial.set_user_attr)
        study.tell(trial, state=TrialState.FAIL)
        return TrialState.FAIL
    values = objective_values(result, sla)
    if values is None:
        TrialRecord(reason="no successful request: objectives not measurable").save(
            trial.set_user_attr
        )
        study.tell(trial, state=TrialState.FAIL)
        return TrialState.FAIL
    for key, margin in result.margins().items():
        trial.set_constraint(key, 1.0 if margin is None else margin)
    if not result.feasible and all(m is not None and m <= 0 for m in result.margins().values()):
        # Inside every limit by the point values, but not shown to meet the SLA at its own
        # load (a percentile's interval straddled its limit): not feasible either.
        trial.set_constraint(UNDECIDED, 1.0)
    TrialRecord(constraints=trial.constraints).save(trial.set_user_attr)
    study.tell(trial, values)
    return TrialState.COMPLETE


def _summary_metrics(sla: Sla) -> list[str]:
    names = [
        "capacity",
        "capacity_per_gpu",
        "goodput",
        "request_rate",
        "output_tokens_per_s",
        "p50_ttft_ms",
        "p99_ttft_ms",
        "p99_tpot_ms",
        "p99_itl_ms",
        "p99_e2e_ms",
        "error_rate",
        "peak_memory_gib",
    ]
    names += [c.metric for c in sla.constraints] + [o.metric for o in sla.objectives]
    return list(dict.fromkeys(names))


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and all(c <= 0 for c in t.constraints.values())


def _fmt(v: Any, unit: str = "") -> str:
    return "-" if v is None else f"{v:.2f}{unit}"


@dataclass
class _Pending:
    """A trial asked from the study and handed to the executor."""

    trial: optuna.Trial
    params: dict[str, ParamValue]
    baseline: bool
    trial_dir: Path
    started: float
    race: tuple[float, int] | None = None  # (first level's load, incumbent trial): raced


def _reason_kind(reason: str) -> str:
    """A pruning reason's kind without its values: its text up to the first colon
    ("out of reach", "hopeless"), or its first words."""
    head = reason.split(":", 1)[0].strip()
    return head if len(head) <= 40 else head[:39] + "…"


class StudyRunner:
    """Runs the ask/tell loop of one study until its budget is spent."""

    def __init__(
        self,
        sla: Sla,
        study: optuna.Study,
        study_dir: Path,
        *,
        suggest: Callable[[optuna.Trial], dict[str, ParamValue]],
        fixed: Mapping[str, ParamValue],
        prune: Callable[[dict[str, ParamValue]], str | None],
        run: RunTrial | None = None,
        budget: Budget,
        on_crash: Callable[[dict[str, ParamValue], str], None] = lambda p, c: None,
        say: Say = print,
        executor: Executor | None = None,
        plan: SearchPlan | None = None,
        stopper: StudyStopper | None = None,
        race: bool = False,
    ) -> None:
        self.sla = sla
        # Race candidates against the incumbent (module docstring); a capacity-first SLA only.
        self.race = race
        self.study = study
        self.dir = study_dir
        self.suggest = suggest
        self.fixed = dict(fixed)
        self.prune = prune
        if executor is None:
            if run is None:
                raise ValueError("StudyRunner needs run= or executor=")
            executor = LocalExecutor(run)
        self.executor = executor
        self.budget = budget
        self.on_crash = on_crash
        self.say = say
        self.started = time.monotonic()
        self.launch_times: list[float] = []
        # Warm start and hopeless values (search.priors), stopping rule (search.progress):
        # None keeps the plain loop (grid studies, tests of the bookkeeping).
        self.plan = plan
        self.stopper = stopper
        # Why the suggestions since the last launch were skipped, by kind: the stop message
        # names the rule that fenced the sampler in.
        self.skipped: Counter[str] = Counter()
        # Proposals pruned out of reach since the last launch (MOVE_AFTER).
        self.far = 0

    def spent(self) -> int:
        return sum(counted(t) for t in self.study.get_trials(deepcopy=False))

    def time_left(self) -> bool:
        if self.budget.time_s is None:
            return True
        mean = sum(self.launch_times) / len(self.launch_times) if self.launch_times else 0.0
        return time.monotonic() - self.started + mean <= self.budget.time_s

    def grid_done(self) -> bool:
        """A grid study has nothing left to ask: the baseline and every point settled or in
        flight, and no interrupted config queued again."""
        sampler = self.study.sampler
        if not isinstance(sampler, GridSampler):
            return False
        trials = self.study.get_trials(deepcopy=False)
        baseline = baseline_done(self.study) or any(
            t.state == TrialState.RUNNING and TrialRecord.from_trial(t).baseline for t in trials
        )
        waiting = any(t.state == TrialState.WAITING for t in trials)
        return baseline and not waiting and not sampler.free_points(self.study)

    def _stop_reason(self, skips: int, in_flight: int = 0) -> str | None:
        if self.grid_done():
            return "grid done: every point was measured, pruned or reused"
        if self.plan is not None and (answer := self.plan.infeasible(self.study)) is not None:
            return f"stopped, infeasible: {answer}"
        if (over := self._over_gpu_budget(in_flight)) is not None:
            return over
        if skips >= MAX_CONSECUTIVE_SKIPS:
            kinds = ", ".join(f"{n} {kind}" for kind, n in self.skipped.most_common(3))
            return (
                f"stopping: {skips} suggestions in a row were pruned or repeats "
                f"(the search space is exhausted or too constrained): {kinds}"
            )
        if self.stopper is not None and self._warm() is None:  # the warm start runs whole
            decision = self.stopper.check(self.study)
            if decision.stop:
                return decision.reason
        return None

    def gpu_seconds(self) -> tuple[float, int]:
        """GPU-seconds of the counted launches (since a re-tune began) and how many there
        were that recorded their cost."""
        since = fresh_from(self.study)
        total, timed = 0.0, 0
        for t in self.study.get_trials(deepcopy=False):
            if t.number < since or not counted(t):
                continue
            spent = TrialRecord.from_trial(t).gpu_seconds
            if spent:
                total += sum(spent.values())
                timed += 1
        return total, timed

    def _over_gpu_budget(self, in_flight: int) -> str | None:
        """Why the next launch would pass the GPU-minute budget (the launches in flight and
        it costing what a launch has cost on average), with what the search would do with
        more; None while it fits (or before any launch recorded its cost)."""
        limit = self.budget.gpu_minutes
        if limit is None:
            return None
        spent, timed = self.gpu_seconds()
        if timed == 0:
            return None
        mean = spent / timed
        if spent + mean * (in_flight + 1) <= limit * 60 + 1e-9:
            return None
        nxt = self._warm()
        if nxt is not None:
            more = "launch " + (", ".join(f"{k}={v}" for k, v in nxt.items()) or "the defaults")
        else:
            best = best_so_far(self.study)
            near = f"near trial {best.number}, the best so far" if best is not None else "anywhere"
            more = f"launch the sampler's candidates {near}"
        return (
            f"stopped: GPU-minute budget: {spent / 60:.1f} of {limit:g} GPU-minutes spent, and "
            f"the next launch (about {mean / 60:.1f}) would pass it. With more "
            f"(tune.budget_gpu_minutes) it would {more}"
        )

    def _warm(self) -> dict[str, ParamValue] | None:
        """The next warm-start candidate's tuned values, once the baseline has started and no
        re-queued config waits (an asked trial takes the oldest waiting one)."""
        if self.plan is None:
            return None
        trials = self.study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return None
        started = baseline_done(self.study) or any(
            t.state == TrialState.RUNNING and TrialRecord.from_trial(t).baseline for t in trials
        )
        return self.plan.next_warm(self.study, self.fixed) if started else None

    def loop(self) -> None:
        """Keep the executor busy (up to its capacity) until the budget is spent.

        With more than one trial in flight, Optuna's sampler sees the running ones (TPE's
        constant liar keeps it from suggesting the same region twice).
        """
        skips = 0
        in_flight: dict[Hashable, _Pending] = {}
        stop: str | None = None
        while True:
            while (
                stop is None
                and len(in_flight) < self.executor.capacity()
                and self.spent() + len(in_flight) < self.budget.trials
                and self.time_left()
            ):
                stop = self._stop_reason(skips, len(in_flight))
                if stop is not None:
                    break
                pending = self.prepare()
                if pending is None:
                    skips += 1
                    continue
                skips = 0
                self.skipped.clear()
                in_flight[self._submit(pending)] = pending
            if not in_flight:
                break
            for handle, result in self.executor.wait_any():
                self.finish(in_flight.pop(handle), result)
        if stop is not None:
            self.say(stop)

    def step(self) -> bool:
        """Ask one trial and settle it. Returns whether an engine was launched."""
        pending = self.prepare()
        if pending is None:
            return False
        handle = self._submit(pending)
        for h, result in self.executor.wait_any():
            assert h == handle
            self.finish(pending, result)
        return True

    def _submit(self, pending: _Pending) -> Hashable:
        if pending.race is None:
            return self.executor.submit(pending.params, pending.trial_dir)
        return self.executor.submit(pending.params, pending.trial_dir, start_load=pending.race[0])

    def _raced_before(self, key: str, level: float) -> FrozenTrial | None:
        """A launch of the same config that lost a race at ``level`` or below: it would lose
        again (the incumbent's capacity only grows)."""
        since = fresh_from(self.study)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)):
            r = TrialRecord.from_trial(t)
            if (
                t.number >= since
                and raced_out(t)
                and r.config_key == key
                and r.race_level is not None
                and r.race_level <= level * (1 + 1e-9)
            ):
                return t
        return None

    def _move_into_reach(self, trial: optuna.Trial, suggested: Mapping[str, ParamValue]) -> str:
        """Queue the nearest feasible config moved toward a proposal out of reach, once the
        sampler proposed ``MOVE_AFTER`` of them since the last launch, to be asked next; what
        to add to the proposal's reason ("" when there is no move)."""
        assert self.plan is not None
        self.far += 1
        if self.far < MOVE_AFTER:
            return ""
        moved = self.plan.move_into_reach(self.study, suggested, random.Random(trial.number))
        if moved is None:
            return ""
        self.far = 0
        near, values = moved
        attrs = TrialRecord(role="candidate", moved_from=trial.number).attrs()
        self.study.enqueue_trial(values, user_attrs=attrs)
        shown = ", ".join(f"{k}={v}" for k, v in values.items()) or "engine defaults"
        return f"; queued instead: trial {near}'s config moved toward it ({shown})"

    def prepare(self) -> _Pending | None:
        """Ask one trial; settle it at once (reused, pruned) or return it to launch."""
        warm = self._warm()
        if warm is not None:  # asked next; its values come back as the trial's suggestions
            self.study.enqueue_trial(warm)
        trial = self.study.ask()
        baseline = not baseline_done(self.study) and not self._baseline_running(trial)
        TrialRecord(role="baseline" if baseline else "candidate", owner=current_owner()).save(
            trial.set_user_attr
        )
        suggested: dict[str, ParamValue] = {}
        sampled = False  # the sampler chose it (not the warm start, not a re-queued config)
        if not baseline:
            if warm is not None and self.plan is not None:
                suggested = dict(self.plan.suggest_warm(trial, warm))
            elif self.plan is not None and (again := _requeued_values(trial)) is not None:
                # An interrupted config runs again as it was: a warm-start trial's untouched
                # parameters stay with the engine instead of being sampled now.
                suggested = dict(self.plan.suggest_warm(trial, again))
            else:
                suggested = self.suggest(trial)
                sampled = True
        if baseline:  # the engine's defaults, but for what the SLA gives the baseline
            suggested = dict(self.sla.search.baseline)
        params = {**self.fixed, **suggested}
        key = config_key(params)
        TrialRecord(config_key=key, params_full=params).save(trial.set_user_attr)
        earlier = self._earlier(key, trial.number)
        if earlier is not None:
            self._reuse(trial, earlier)
            self.skipped["repeats of a measured config"] += 1
            return None
        near = (
            None
            if baseline or self.plan is None
            else self.plan.near_duplicate(self.study, suggested)
        )
        if near is not None:
            stood = next(t for t in self.study.get_trials(deepcopy=False) if t.number == near.trial)
            why = f"near-duplicate: {near.describe()}; not launched, its result stands for it"
            TrialRecord(reason=why).save(trial.set_user_attr)
            self._reuse(trial, stood, quiet=True)
            self.say(f"trial {trial.number}: {why}")
            self.skipped["near-duplicates of a measured config"] += 1
            return None
        if not baseline:
            reason = self.prune(params)
            if not reason and self.plan is not None:
                reason = self.plan.hopeless(self.study, suggested)
            if not reason and self.plan is not None and sampled:
                reason = self.plan.out_of_reach(self.study, suggested)
                if reason:
                    reason += self._move_into_reach(trial, suggested)
            race = race_start(self.study, self.sla) if self.race else None
            if not reason and race is not None and (lost := self._raced_before(key, race[0])):
                reason = (
                    f"raced out before: trial {lost.number} missed the SLA at "
                    f"{TrialRecord.from_trial(lost).race_level:.3g}, at most the incumbent's "
                    f"capacity now ({race[0]:.3g}, trial {race[1]})"
                )
            if reason:
                TrialRecord(reason=reason).save(trial.set_user_attr)
                self.study.tell(trial, state=TrialState.PRUNED)
                self.say(f"trial {trial.number}: pruned before launch: {reason}")
                self.skipped[f"pruned ({_reason_kind(reason)})"] += 1
                return None
        self.far = 0
        n_done = self.spent() + 1
        role = "baseline (engine defaults)" if baseline else "candidate"
        if baseline and self.sla.search.baseline:
            given = ", ".join(f"{k}={v}" for k, v in self.sla.search.baseline.items())
            role = f"baseline (engine defaults, {given})"
        if warm is not None:
            role += ", warm start"
        race = None if baseline or not self.race else race_start(self.study, self.sla)
        if race is not None:
            role += f", raced at {race[0]:.3g} (trial {race[1]}'s capacity)"
            TrialRecord(race_level=race[0], race_incumbent=race[1]).save(trial.set_user_attr)
        tuned = {k: v for k, v in params.items() if k not in self.fixed} or "engine defaults"
        where = "" if self.executor.name == "local" else f" [{self.executor.name}]"
        self.say(f"trial {trial.number} ({n_done}/{self.budget.trials}, {role}){where}: {tuned}")
        trial_dir = self.dir / f"trial-{trial.number:03d}"
        return _Pending(trial, params, baseline, trial_dir, time.monotonic(), race)

    def _baseline_running(self, trial: optuna.Trial) -> bool:
        return any(
            t.state == TrialState.RUNNING
            and t.number != trial.number
            and TrialRecord.from_trial(t).baseline
            for t in self.study.get_trials(deepcopy=False)
        )

    def _earlier(self, key: str, number: int) -> FrozenTrial | None:
        """A launch of the same config to reuse (not one from before a fresh re-tune)."""
        since = fresh_from(self.study)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.number == number or t.number < since:
                continue
            if TrialRecord.from_trial(t).config_key == key:
                return t
        return None

    def _reuse(self, trial: optuna.Trial, earlier: FrozenTrial, quiet: bool = False) -> None:
        TrialRecord(duplicate_of=earlier.number).save(trial.set_user_attr)
        # The earlier trial's result: the attributes it has, not the record's defaults.
        result = TrialRecord.from_trial(earlier).model_dump(include=_REUSED, exclude_unset=True)
        TrialRecord.model_validate(result).save(trial.set_user_attr)
        for key, value in earlier.constraints.items():
            trial.set_constraint(key, value)
        TrialRecord(constraints=earlier.constraints).save(trial.set_user_attr)
        self.study.tell(trial, earlier.values)
        if not quiet:
            self.say(f"trial {trial.number}: same config as trial {earlier.number}; result reused")

    def finish(self, pending: _Pending, result: TrialResult) -> None:
        """Tell the study what a launch measured."""
        self.launch_times.append(time.monotonic() - pending.started)
        rel = str((pending.trial_dir / "trial.json").relative_to(self.dir))
        race = pending.race
        if race is not None and result.status != "failed" and lost_race(result, race[0]):
            tell_raced_out(
                self.study, pending.trial, result, rel, race, self.sla.tune.capacity_resolution
            )
            self.say(
                f"  -> raced out: missed the SLA at {race[0]:.3g}, trial {race[1]}'s capacity: "
                f"pruned after {len(result.levels)} level(s) ({result.duration_s:.0f} s)"
            )
            return
        state = tell_result(self.study, pending.trial, result, self.sla, rel)
        if pending.baseline and self.plan is not None:
            self.plan.observe_baseline(result)
            for line in self.plan.lever_lines(self.study):
                self.say(line)
        if result.status == "failed":
            self.on_crash(pending.params, result.cause or "other")
            self.say(
                f"  trial {pending.trial.number}: launch failed ({result.cause}): {result.reason}"
            )
        else:
            self._report(pending.trial.number, result, state)

    def _report(self, number: int, result: TrialResult, state: TrialState) -> None:
        verdict = "meets the SLA" if result.feasible else f"infeasible: {result.reason}"
        cap = result.found_capacity()
        held = "-" if cap is None else cap.describe() if cap.low > 0 else f"0 {cap.unit}"
        # The latencies at the percentiles the SLA limits (a p90 SLA reads its p90 TTFT and
        # TPOT), else the p99 TTFT.
        limited = [
            c.metric
            for c in self.sla.constraints
            if c.metric.endswith("_ms")
            and c.metric.split("_")[-2] in ("ttft", "tpot", "itl", "e2e")
        ] or ["p99_ttft_ms"]
        latencies = ", ".join(
            f"{q} {kind.upper()} {_fmt(result.metric(m), ' ms')}"
            for m in dict.fromkeys(limited)
            for q, kind in [m.removesuffix("_ms").split("_", 1)]
        )
        self.say(
            f"  -> {verdict}; capacity {held}, goodput at capacity "
            f"{_fmt(result.metric('goodput'), ' req/s')}, {latencies} "
            f"({result.duration_s:.0f} s)"
        )
        best = best_so_far(self.study)
        left = self.budget.trials - self.spent()
        eta = left * (sum(self.launch_times) / len(self.launch_times))
        if best is not None:
            r = TrialRecord.from_trial(best)
            held = r.capacity.describe() if r.capacity else _fmt(r.max_load)
            self.say(
                f"  best so far: trial {best.number}, capacity {held}, goodput "
                f"{_fmt(r.metrics.get('goodput'), ' req/s')}; "
                f"{left} launch{'' if left == 1 else 'es'} left, ETA {eta / 60:.0f} min"
            )


def best_so_far(study: optuna.Study) -> FrozenTrial | None:
    """The feasible trial with the best first objective (a progress hint, not the promotion)."""
    cands = [t for t in study.get_trials(deepcopy=False) if feasible(t) and t.values]
    if not cands:
        return None
    sign = 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0
    return max(cands, key=lambda t: sign * t.values[0])
