"""Priors and hopeless values: where a study looks first, and what it never launches.

The search-space file gives each parameter a ``prior`` (where to look first) and
``hopeless_when`` conditions (values not worth a launch for some SLAs, each with its ``why``);
:mod:`autotuner.space` resolves them into :class:`~autotuner.space.Prior` and
:class:`~autotuner.space.Hopeless`. This module evaluates them, knowing nothing of any
engine: what a condition means is the file's business, how it is decided is this module's.

* :class:`Situation`: what conditions are decided against -- the target device, the SLA's
  objectives and limits, and what the baseline (engine defaults) measured.
* :func:`measured_from`: the quantities a baseline launch measured. ``concurrency`` is Little's
  law: the requests in flight at once at the SLA's own load, ``served rate x (mean E2E - mean
  TTFT)``. The served rate (not the offered one) and the time after the first token (not the
  whole E2E, whose TTFT part includes waiting for a slot) keep it a lower bound on the slots
  the load needs, also when the defaults were overloaded. A closed-loop load *is* a
  concurrency.
* :func:`capacity_measured`: what the incumbent (the best config so far) measured at its
  capacity, the load that matters (issue 28): ``capacity_concurrency``, Little's law at its
  highest level that met the SLA, and the limit that bounded its capacity (the first miss
  above it, :func:`binding_limit`). A prior's ``by_limit`` rules let that limit choose the
  direction the warm start moves a knob; the search-space file states each with its reason.
  The warm start of issue 28 sized ``max_num_seqs`` from ``concurrency`` at the SLA's own
  rate (62 and 41 slots) while the defaults' capacity, 17.8 req/s on an H200, had more than
  twice as many requests in flight.
* :func:`hopeless_reason`: why a candidate's suggested values are hopeless, or None.
* :class:`SearchPlan`: what the study loop asks: the next warm-start candidate (the most
  influential knobs one at a time around their priors, from the best config so far; then the
  sampler takes over), the hopeless check, and the baseline's measurements (kept when the
  baseline finishes, read back from its ``trial.json`` on resume).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from autotuner.core.show import show_value
from autotuner.core.types import ParamValue as Value
from autotuner.core.types import same_value
from autotuner.measure.levels import LOAD_INDEPENDENT
from autotuner.records.trial import TrialRecord
from autotuner.search.duplicates import DUPLICATE_STEPS, NearDuplicate, near_duplicate
from autotuner.search.lever_plan import Gap, baseline_gap, infeasible_answer, long_prompts, pulled
from autotuner.search.levers import LeverTable, Ranked, rank
from autotuner.search.misses import EngineDefaults, MissBook
from autotuner.search.nearby import NEAR_STEPS, into_reach, nearest_feasible
from autotuner.search.progress import (
    StudyStopper,
    best_launch,
    incumbent,
    is_candidate_from_sampler,
)
from autotuner.search.stopping import StoppingRule
from autotuner.search.study import config_key, counted
from autotuner.search.trial import Level, TrialResult
from autotuner.space import Hopeless, ParamSpec, ParamValue, SearchSpace

if TYPE_CHECKING:
    from autotuner.sla.spec import Sla

__all__ = [
    "THROUGHPUT_METRICS",
    "SearchPlan",
    "Situation",
    "binding_limit",
    "capacity_measured",
    "hopeless_reason",
    "measured_from",
    "memory_fix",
    "sampler_startup",
    "snap",
    "strategy_for",
    "warm_candidates",
]

# A first objective that maximises one of these is a throughput (capacity) objective.
THROUGHPUT_METRICS = frozenset(
    {
        "goodput",
        "request_rate",
        "output_tokens_per_s",
        "total_tokens_per_s",
        "capacity",
        "capacity_per_gpu",
    }
)
_LATENCY_RE = re.compile(r"^(?:mean|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2e)_ms$")


@dataclass(frozen=True)
class Situation:
    """What hopeless conditions and priors are decided against."""

    device: str
    objectives: tuple[tuple[str, str], ...] = ()  # (metric, "maximize" | "minimize")
    limited: frozenset[str] = frozenset()  # constrained metrics and their latency kinds
    measured: Mapping[str, float] = field(default_factory=dict)
    bound: str | None = None  # what bounded the incumbent's capacity (space.BINDING), if known

    @classmethod
    def of(
        cls,
        sla: Sla,
        device: str,
        measured: Mapping[str, float] | None = None,
        bound: str | None = None,
    ) -> Situation:
        limited: set[str] = set()
        for c in sla.constraints:
            limited.add(c.metric)
            if (m := _LATENCY_RE.match(c.metric)) is not None:
                limited.add(m[1])
        return cls(
            device=device,
            objectives=tuple((o.metric, o.direction) for o in sla.objectives),
            limited=frozenset(limited),
            measured=dict(measured or {}),
            bound=bound,
        )

    @property
    def objective_kind(self) -> str | None:
        """``throughput`` (first objective maximises a rate), ``latency`` (it minimises a
        latency), else None."""
        if not self.objectives:
            return None
        metric, direction = self.objectives[0]
        if direction == "maximize" and metric in THROUGHPUT_METRICS:
            return "throughput"
        if direction == "minimize" and _LATENCY_RE.match(metric):
            return "latency"
        return None


def measured_from(result: TrialResult) -> dict[str, float]:
    """What a baseline launch measured for priors and conditions (see the module docstring);
    empty when it measured nothing usable (failed, no requests, no latencies)."""
    if not result.levels:
        return {}
    level = result.levels[0]
    if result.load_kind == "concurrency":
        return {"concurrency": float(level.load)}
    rate = level.metrics.get("request_rate")
    e2e = level.metrics.get("mean_e2e_ms")
    ttft = level.metrics.get("mean_ttft_ms")
    if rate is None or e2e is None or ttft is None:
        return {}
    busy_s = (e2e - ttft) / 1000
    if not (math.isfinite(rate) and math.isfinite(busy_s)) or rate <= 0 or busy_s <= 0:
        return {}
    return {"concurrency": rate * busy_s}


def _in_flight(metrics: Mapping[str, float | None], served: float | None) -> float | None:
    """Little's law on one level: served rate x mean time after the first token."""
    rate = served if served is not None else metrics.get("request_rate")
    e2e, ttft = metrics.get("mean_e2e_ms"), metrics.get("mean_ttft_ms")
    if rate is None or e2e is None or ttft is None:
        return None
    busy_s = (e2e - ttft) / 1000
    if not (math.isfinite(rate) and math.isfinite(busy_s)) or rate <= 0 or busy_s <= 0:
        return None
    return rate * busy_s


def binding_limit(result: TrialResult, sla: Sla) -> str | None:
    """What bounded a launch's capacity (a name of :data:`autotuner.space.BINDING`): at the
    lowest level above the capacity that missed the SLA (the bracket's high edge), the missed
    constraint with the largest margin, as its latency kind (``tpot``), ``memory`` or
    ``errors``; ``served_rate`` when only the engine's falling behind made it miss. For a
    launch that met the SLA nowhere (capacity 0) that level is its first, the SLA's own load:
    the limit it missed there. None when nothing above the capacity missed (an open bracket),
    the launch failed, or the miss names no such limit."""
    cap = result.found_capacity()
    if cap is None or cap.high is None:
        return None
    above = [
        lv
        for lv in result.levels
        if math.isclose(lv.load, cap.high, rel_tol=1e-9) and lv.verdict != "meets"
    ]
    if not above:
        return None
    level = above[-1]
    metric_of = {c.key: c.metric for c in sla.constraints}
    missed = [k for k, v in level.verdicts.items() if v == "misses"] or [
        k for k, v in level.verdicts.items() if v == "undecided"
    ]
    if missed:
        worst = max(missed, key=lambda k: level.margins.get(k) or 0.0)
        metric = metric_of.get(worst, worst)
        if (m := _LATENCY_RE.match(metric)) is not None:
            return m[1]
        if metric == "peak_memory_gib":
            return "memory"
        if "error" in metric:
            return "errors"
    if level.sustained is False:
        return "served_rate"
    return None


def _missed_with_load(level: Level, sla: Sla) -> bool:
    """Whether a level missed a limit the load moves (a latency, errors, the served rate), not
    only ones it does not (:data:`~autotuner.measure.levels.LOAD_INDEPENDENT`). Records
    without per-constraint verdicts are read by their margins (> 0, or not measurable)."""
    if level.sustained is False:
        return True
    metric_of = {c.key: c.metric for c in sla.constraints}
    if level.verdicts:
        missed = [k for k, v in level.verdicts.items() if v != "meets"]
    else:
        missed = [k for k, m in level.margins.items() if m is None or m > 0]
    return any(metric_of.get(k, k) not in LOAD_INDEPENDENT for k in missed)


def capacity_measured(result: TrialResult, sla: Sla) -> tuple[dict[str, float], str | None]:
    """What a launch measured at the load that matters: ``capacity_concurrency`` (the requests
    in flight at its highest level that met the SLA; empty when not measurable) and the limit
    that bounded it (:func:`binding_limit`). A launch that met the SLA nowhere has its capacity
    below the SLA's own load, so the load that matters is that one, its first and lowest
    level: the requests in flight there (the served rate's, a lower bound when it fell
    behind) and the limit it missed there. Unless it missed only limits the load does not
    move (peak memory: the engine reserves its KV pool at start): then its capacity is
    unknown, not below that load, and its requests in flight size nothing (on the H200 grid
    the defaults missed 130 GiB by 0.45 GiB with 34 requests in flight at 15 req/s, where the
    configs that fit served 28). Empty for a launch that measured no level."""
    bound = binding_limit(result, sla)
    if not result.levels:
        return {}, bound
    if result.best is not None:
        level = result.levels[result.best]
    else:
        level = min(result.levels, key=lambda lv: lv.load)
        if not _missed_with_load(level, sla):
            return {}, bound
    if result.load_kind == "concurrency":  # a closed-loop load is a concurrency
        return {"capacity_concurrency": float(level.load)}, bound
    flight = _in_flight(level.metrics, level.served_rate)
    return ({} if flight is None else {"capacity_concurrency": flight}), bound


# --------------------------------------------------------------------------- hopeless


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _bound(rule: Hopeless, s: Situation) -> tuple[float, str] | None:
    """``rule.below`` as a number and how to say it; None when not measured (yet)."""
    if isinstance(rule.below, str):
        m = s.measured.get(rule.below)
        if m is None:
            return None
        factor = f"{rule.times:g} x " if rule.times != 1 else ""
        return rule.times * m, f"below {factor}the measured {rule.below} {m:.1f}"
    if rule.below is None:
        return None
    return float(rule.below), f"below {rule.below:g}"


def applies(
    rule: Hopeless, value: ParamValue, value_of: Callable[[str], ParamValue], s: Situation
) -> str | None:
    """How ``rule`` holds for ``value`` (a short phrase), or None when it does not."""
    if rule.device is not None and rule.device != s.device:
        return None
    if rule.objective is not None and s.objective_kind != rule.objective:
        return None
    if any(metric == m for metric, _ in s.objectives for m in rule.unless_objective):
        return None
    if rule.limited and not set(rule.limited) & s.limited:
        return None
    if not all(c.holds(value_of(c.param)) for c in rule.with_):
        return None
    parts: list[str] = []
    if rule.values is not None and not any(same_value(value, v) for v in rule.values):
        return None
    if rule.below is not None:
        x, bound = _number(value), _bound(rule, s)
        if x is None or bound is None or not x < bound[0]:
            return None
        parts.append(bound[1])
    return ", ".join(parts + _conditions(rule))


def _conditions(rule: Hopeless) -> list[str]:
    """The rule's conditions besides the value itself, in words."""
    parts: list[str] = []
    if rule.device is not None:
        parts.append(f"on {rule.device}")
    if rule.objective is not None:
        parts.append(f"for a {rule.objective} objective")
    if rule.unless_objective:
        parts.append(f"unless {' or '.join(rule.unless_objective)} is an objective")
    if rule.with_:
        parts.append("with " + " and ".join(str(c) for c in rule.with_))
    if rule.limited:
        parts.append(f"under a {'/'.join(rule.limited)} limit")
    return parts


def hopeless_reason(
    space: SearchSpace, suggested: Mapping[str, ParamValue], s: Situation
) -> str | None:
    """Why a candidate is hopeless (``hopeless: name=value (how): why``), or None.

    Only suggested values are judged: what the SLA pins is its own decision.
    """
    reasons: list[str] = []
    for p in space.params:
        if p.name not in suggested:
            continue
        value = suggested[p.name]
        for rule in p.hopeless:
            how = applies(rule, value, lambda n: space.value_of(n, suggested), s)
            if how is not None:
                reasons.append(f"hopeless: {p.name}={show_value(value)} ({how}): {rule.why}")
                break
    return "; ".join(reasons) if reasons else None


# --------------------------------------------------------------------------- warm start


def snap(p: ParamSpec, value: float | ParamValue, at_least: float | None = None) -> ParamValue:
    """``value`` moved into ``p``'s domain: the nearest choice (on a log scale for positive
    numbers), or clipped to the range and its step; None when it has no place there.

    ``at_least``: a floor for the choices (the smallest multiple of a measured quantity a
    prior sizes from, :func:`_prior_values`): only choices at or above it are candidates (the
    largest choice when none is). On a coarse list the nearest choice can lie below the value
    by up to half a step on the log scale, which eats the headroom the factor was for: 1.25 x
    30 requests in flight is 38, nearest 32 of [32, 64, ...], a cap that bursts fill at once."""
    if p.choices is not None:
        if any(same_value(value, c) for c in p.choices):
            return value
        target = _number(value)
        numeric = [(c, n) for c in p.choices if (n := _number(c)) is not None]
        if target is None or not numeric:
            return None
        if at_least is not None:
            above = [(c, n) for c, n in numeric if n >= at_least * (1 - 1e-9)]
            numeric = above or [max(numeric, key=lambda cn: cn[1])]
        t = target
        log = t > 0 and all(n > 0 for _, n in numeric)

        def distance(n: float) -> float:
            return abs(math.log(n / t)) if log else abs(n - t)

        return min(numeric, key=lambda cn: (distance(cn[1]), cn[1]))[0]
    number = _number(value)
    if number is None or p.low is None or p.high is None:
        return None
    x = min(max(number, float(p.low)), float(p.high))
    if p.step:
        x = float(p.low) + round((x - float(p.low)) / float(p.step)) * float(p.step)
        x = min(x, float(p.high))
    if p.type == "int":
        return round(x)
    return round(x, 6)


def _rank(p: ParamSpec) -> int:
    return p.prior.rank if p.prior is not None else 0


def _prior_values(p: ParamSpec, s: Situation) -> list[ParamValue]:
    prior = p.prior
    if prior is None:
        return []
    raw: list[Any] = list(prior.first)
    times = prior.times
    # The limit that bounded the incumbent's capacity chooses the direction (space file).
    rule = next((b for b in prior.by_limit if s.bound is not None and s.bound in b.limits), None)
    if rule is not None and rule.first:
        raw, times = list(rule.first), ()
    elif rule is not None:
        times = rule.times
    measured = s.measured.get(prior.near) if prior.near and times else None
    floor = None
    if measured is not None:
        raw = [measured * t for t in times]
        # Sized from a measurement: snapping keeps at least the smallest factor's headroom.
        floor = measured * min(times)
    out: list[ParamValue] = []
    for v in raw:
        snapped = snap(p, v, at_least=floor)
        if snapped is not None and not any(same_value(snapped, o) for o in out):
            out.append(snapped)
    return out


def _active(space: SearchSpace, values: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """``values`` without the parameters their own values switch off (file order)."""
    kept: dict[str, ParamValue] = {}
    for p in space.params:
        if p.name in values and space.is_active(p, kept):
            kept[p.name] = values[p.name]
    return kept


def warm_candidates(
    space: SearchSpace, incumbent: Mapping[str, ParamValue], s: Situation
) -> Iterator[tuple[str, ParamValue, dict[str, ParamValue]]]:
    """The warm start around ``incumbent`` (the tuned values of the best config so far):
    ranked parameters in rank order (then file order), each prior value alone on top of the
    incumbent, as ``(name, value, candidate)``. Values equal to the incumbent's, or switched
    off by it, are skipped."""
    ranked = sorted((p for p in space.params if p.prior is not None), key=_rank)
    for p in ranked:
        for v in _prior_values(p, s):
            if p.name in incumbent and same_value(incumbent[p.name], v):
                continue
            cand = _active(space, {**incumbent, p.name: v})
            if p.name in cand:
                yield p.name, v, cand


def _grid_values(p: ParamSpec) -> list[ParamValue]:
    """A parameter's listed values: its choices, or its range walked by its step."""
    if p.choices is not None:
        return list(p.choices)
    if p.step is None or p.low is None or p.high is None or p.step <= 0:
        return []
    n = math.floor((p.high - p.low) / p.step + 1e-9)
    if n > 1000:
        return []
    cast = int if p.type == "int" else float
    return [cast(round(p.low + i * p.step, 10)) for i in range(n + 1)]


def memory_fix(
    space: SearchSpace, over: Callable[[Mapping[str, ParamValue]], str | None]
) -> dict[str, ParamValue]:
    """When the engine defaults break the SLA's memory limit before any load (``over`` says
    why a config would, None when it would not), the one setting nearest its default that
    brings them under it (vLLM: ``gpu_memory_utilization`` 0.92 -> 0.88 on an H200 under a
    130 GiB limit). The warm start then builds on it instead of on the defaults, whose every
    variation the memory rule would prune. Empty when the defaults fit or nothing fixes them."""
    if over({}) is None:
        return {}
    for p in space.params:
        if isinstance(p.default, bool) or not isinstance(p.default, int | float):
            continue
        default = float(p.default)
        passing = [
            v for v in _grid_values(p) if isinstance(v, int | float) and over({p.name: v}) is None
        ]
        if passing:
            best = min(passing, key=lambda v: (abs(float(v) - default), -float(v)))
            return {p.name: best}
    return {}


@dataclass
class SearchPlan:
    """The study loop's view of priors, hopeless values and the warm start.

    ``warm_limit``: the most warm-start launches (the sampler gets the rest of the budget).
    The warm start ends for good once the sampler has been asked for a candidate.
    ``near_steps``: how far from a launch that met the SLA a sampled candidate may lie
    (:mod:`autotuner.search.nearby`; None: anywhere).
    """

    space: SearchSpace
    sla: Sla
    study_dir: Path | None = None
    warm_limit: int = 6
    measured: dict[str, float] | None = None  # None: not looked for yet
    # What the warm start builds on while no config holds the SLA (see memory_fix).
    start_from: dict[str, ParamValue] = field(default_factory=dict)
    # The engine's own values of options it decides (None: unknown), for search.misses.
    engine_defaults: EngineDefaults | None = None
    near_steps: float | None = NEAR_STEPS
    # The engine's lever table (search.levers; None: no lever ranking, no "infeasible
    # losslessly" answer) and how the target is named in that answer.
    levers: LeverTable | None = None
    where: str = ""
    # A candidate this close to a measured config in every knob is not launched
    # (search.duplicates; None: only exact repeats are reused).
    duplicate_steps: float | None = DUPLICATE_STEPS
    _book: MissBook | None = field(default=None, repr=False)
    _capacity: dict[int, tuple[dict[str, float], str | None]] = field(
        default_factory=dict, repr=False
    )

    def describe(self) -> list[str]:
        """What the warm start tries and which values are hopeless, for the tune's log."""
        lines: list[str] = []
        ranked = sorted((p for p in self.space.params if p.prior), key=lambda p: _rank(p))
        for p in ranked:
            assert p.prior is not None
            first = ", ".join(show_value(v) for v in p.prior.first)
            near = ""
            if p.prior.near:
                factors = ", ".join(f"x{t:g}" for t in p.prior.times)
                near = f"measured {p.prior.near} {factors}" + ("; else " if first else "")
            lines.append(f"warm start {p.prior.rank}: {p.name} = {near}{first}")
            for b in p.prior.by_limit:
                to = (
                    ", ".join(show_value(v) for v in b.first)
                    if b.first
                    else f"measured {p.prior.near} " + ", ".join(f"x{t:g}" for t in b.times)
                )
                lines.append(
                    f"  when the incumbent's capacity ended at {'/'.join(b.limits)}: "
                    f"{p.name} = {to}: {b.why}"
                )
        for p in self.space.params:
            for rule in p.hopeless:
                what = (
                    f"= {', '.join(show_value(v) for v in rule.values)}"
                    if rule.values is not None
                    else f"< {'' if rule.times == 1 else f'{rule.times:g} x '}{rule.below}"
                )
                when = ", ".join(_conditions(rule))
                lines.append(f"hopeless {p.name} {what}{f' ({when})' if when else ''}: {rule.why}")
        for p in self.space.params:
            for m in p.monotone:
                lines.append(
                    f"after a miss of {'/'.join(m.limits)}: {p.name} {m.worse} is hopeless: {m.why}"
                )
        return lines

    def situation(self, study: optuna.Study) -> Situation:
        """The baseline's measurements, with the incumbent's at its capacity (the load that
        matters) and the limit that bounded it, once a config met the SLA."""
        if self.measured is None:
            self.measured = self._read_baseline(study)
        measured = dict(self.measured or {})
        extra, bound = self._at_capacity(study)
        return Situation.of(self.sla, self.space.device, {**measured, **extra}, bound)

    def _at_capacity(self, study: optuna.Study) -> tuple[dict[str, float], str | None]:
        """:func:`capacity_measured` of the incumbent (read from its ``trial.json``, kept
        per trial number): the best config so far, or while none met the SLA the launch
        closest to meeting it, which the warm start then varies (at the SLA's own load, with
        the limit it missed there); nothing before a launch was measured."""
        best = incumbent(study)
        if best is None or self.study_dir is None:
            return {}, None
        if best.number not in self._capacity:
            r = TrialRecord.from_trial(best)
            path = self.study_dir / r.result_file if r.result_file else None
            if path is None or not path.exists():
                return {}, None
            self._capacity[best.number] = capacity_measured(TrialResult.read(path), self.sla)
        return self._capacity[best.number]

    def observe_baseline(self, result: TrialResult) -> None:
        """The baseline finished: keep what it measured."""
        self.measured = measured_from(result)

    def _read_baseline(self, study: optuna.Study) -> dict[str, float] | None:
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            r = TrialRecord.from_trial(t)
            if not r.baseline or r.interrupted or not r.result_file or self.study_dir is None:
                continue
            path = self.study_dir / r.result_file
            if path.exists():
                return measured_from(TrialResult.read(path))
        return None  # looked for again next time: the baseline may still be running

    def hopeless(self, study: optuna.Study, suggested: Mapping[str, Value]) -> str | None:
        """Why a candidate is not worth a launch: a hopeless value of the space file, or a
        launch of the study that missed the SLA rules it out (search.misses)."""
        values = _scalars(suggested)
        reason = hopeless_reason(self.space, values, self.situation(study))
        return reason if reason is not None else self.misses().reason(study, values)

    def out_of_reach(self, study: optuna.Study, suggested: Mapping[str, Value]) -> str | None:
        """Why a candidate the sampler proposed is not launched: it lies more than
        ``near_steps`` steps from every launch that met the SLA (search.nearby); None when it
        is near one, or no launch met the SLA yet."""
        if self.near_steps is None:
            return None
        nearest = nearest_feasible(study, self.misses(), _scalars(suggested))
        if nearest is None or nearest.steps <= self.near_steps + 1e-9:
            return None
        return (
            f"out of reach: {nearest.steps:.3g} steps from the nearest config that met the SLA "
            f"(trial {nearest.trial}); the sampler looks within {self.near_steps:g}"
        )

    def move_into_reach(
        self, study: optuna.Study, suggested: Mapping[str, Value], rng: random.Random
    ) -> tuple[int, dict[str, ParamValue]] | None:
        """The nearest launch that met the SLA, and its config moved toward ``suggested`` by
        at most ``near_steps`` (search.nearby.into_reach); None when there is no such launch
        or no move."""
        if self.near_steps is None:
            return None
        values = _scalars(suggested)
        nearest = nearest_feasible(study, self.misses(), values)
        if nearest is None:
            return None
        moved = into_reach(self.misses(), nearest.params, values, self.near_steps, rng)
        return None if moved is None else (nearest.trial, moved)

    def misses(self) -> MissBook:
        if self._book is None:
            metric_of = {c.key: c.metric for c in self.sla.constraints}
            self._book = MissBook(self.space, metric_of, self.study_dir, self.engine_defaults)
        return self._book

    def next_warm(self, study: optuna.Study, fixed: Mapping[str, Value]) -> dict[str, Value] | None:
        """The next warm-start candidate's tuned values, or None when the warm start is over
        (all tried, the limit reached, or the sampler already took over)."""
        trials = study.get_trials(deepcopy=False)
        if any(is_candidate_from_sampler(t) for t in trials):
            return None
        warm_launches = sum(
            1
            for t in trials
            if TrialRecord.from_trial(t).role == "candidate"
            and (counted(t) or t.state == TrialState.RUNNING)
        )
        if warm_launches >= self.warm_limit:
            return None
        tried = {r.config_key for t in trials if (r := TrialRecord.from_trial(t)).config_key}
        # One pass: a value a warm-start trial ran (alone or carried along) is not tried again.
        done = {(k, repr(v)) for t in trials if _enqueued(t) for k, v in t.params.items()}
        best = incumbent(study)
        around = dict(best.params) if best is not None else {}
        if best_launch(study) is None:  # nothing holds the SLA yet: build on the memory fix
            around = {**self.start_from, **around}
            # The levers that can move what bound the defaults, in their rank order, each
            # on top of the launch closest to meeting the SLA (so that those that help add up).
            for lever in self.ranked(study):
                if lever.status not in ("try", "trade") or pulled(study, lever):
                    continue
                for value in self._lever_values(study, lever):
                    cand = _active(self.space, {**around, lever.lever.name: value})
                    if lever.lever.name not in cand or (lever.lever.name, repr(value)) in done:
                        continue
                    if config_key({**fixed, **cand}) not in tried:
                        return dict(cand)
        for name, value, cand in warm_candidates(self.space, around, self.situation(study)):
            if (name, repr(value)) not in done and config_key({**fixed, **cand}) not in tried:
                return dict(cand)
        return None

    # ----------------------------------------------------------------------- levers

    def gap(self, study: optuna.Study) -> Gap | None:
        """What bound the engine defaults at the SLA's own load (search.lever_plan)."""
        return baseline_gap(study, self.sla)

    def ranked(self, study: optuna.Study) -> list[Ranked]:
        """The levers for the limit the defaults missed, best first; empty without a lever
        table, or when the defaults met the SLA (or have not been measured)."""
        gap = self.gap(study)
        if self.levers is None or gap is None:
            return []
        s = self.situation(study)
        priors = {p.name: _prior_values(p, s) for p in self.space.params if p.prior is not None}
        ranked = rank(
            self.levers,
            gap.limit,
            self.space,
            long_prompts=long_prompts(self.sla),
            prior_values=priors,
        )

        def prior_rank(r: Ranked) -> int:
            # Among levers of one status and no measured effect, the space file's prior rank.
            if r.lever.measured is not None and r.lever.measured.change is not None:
                return -1
            names = {p.name: p for p in self.space.params}
            p = names.get(r.lever.name)
            return _rank(p) if p is not None and p.prior is not None else 1000

        order = {"try": 0, "trade": 1, "lossy": 2, "outside": 3, "none": 4}
        return sorted(ranked, key=lambda r: (order[r.status], prior_rank(r)))

    def _lever_values(self, study: optuna.Study, r: Ranked) -> list[ParamValue]:
        """The values a lever is pulled with: the table's, else the prior's now; a trade once
        (its first value): it only moves the limit at another's cost."""
        values = list(r.values)
        if not values:
            p = next((q for q in self.space.params if q.name == r.lever.name), None)
            values = _prior_values(p, self.situation(study)) if p is not None else []
        return values[:1] if r.status == "trade" else values

    def lever_lines(self, study: optuna.Study) -> list[str]:
        """After the baseline: the limit that bound it, the gap, and the levers in order."""
        gap = self.gap(study)
        if self.levers is None or gap is None:
            return []
        lines = [f"the engine defaults missed {gap.describe()} at the SLA's own load"]
        labels = {
            "try": "moves it",
            "lossy": "lossy: needs search.allow_lossy",
            "outside": "outside this search space",
            "none": "cannot move it",
        }
        for i, r in enumerate(self.ranked(study), 1):
            label = labels.get(r.status, f"trades it against {'/'.join(r.lever.costs)}")
            lines.append(
                f"  lever {i}: {r.lever.describe()}: {label} ({r.lever.evidence()}): {r.lever.why}"
            )
        if len(lines) == 1:
            lines.append(f"  the engine's lever table knows no lever for {gap.limit}")
        return lines

    def infeasible(self, study: optuna.Study) -> str | None:
        """ "No lossless setting ... meets ..." once the levers for what bound the defaults are
        spent and nothing met the SLA (search.lever_plan); None otherwise."""
        gap = self.gap(study)
        if self.levers is None or gap is None:
            return None
        where = self.where or f"on this {self.space.device.upper()}"
        return infeasible_answer(
            study,
            self.sla,
            self.ranked(study),
            gap,
            lossy_allowed=self.sla.search.allow_lossy,
            where=where,
        )

    def near_duplicate(
        self, study: optuna.Study, suggested: Mapping[str, Value]
    ) -> NearDuplicate | None:
        """The measured config that stands for ``suggested`` (search.duplicates), if any."""
        if self.duplicate_steps is None:
            return None
        return near_duplicate(study, self.misses(), _scalars(suggested), self.duplicate_steps)

    def suggest_warm(self, trial: optuna.Trial, values: Mapping[str, Value]) -> dict[str, Value]:
        """Suggest exactly ``values`` (enqueued for ``trial``): Optuna records them as the
        trial's params; every other parameter is left to the engine."""
        return dict(self.space.suggest(trial, only=set(values)))


def _enqueued(t: optuna.trial.FrozenTrial) -> bool:
    """A warm-start candidate (enqueued; not re-queued after an interruption, not moved
    within reach of a proposal)."""
    r = TrialRecord.from_trial(t)
    return (
        r.role == "candidate"
        and r.requeued_from is None
        and r.moved_from is None
        and "fixed_params" in t.system_attrs
    )


def _scalars(values: Mapping[str, Value]) -> dict[str, ParamValue]:
    """Tuned values are scalars (structured options are only ever fixed)."""
    return {k: v for k, v in values.items() if not isinstance(v, dict)}


def sampler_startup(sla: Sla) -> int | None:
    """TPE's random trials before it models: with a warm start (any sampler but ``grid``),
    the baseline and the warm start's launches are its first observations, so it models
    from the second finished trial on; None keeps ``make_sampler``'s default."""
    return None if sla.tune.sampler == "grid" else 2


def strategy_for(
    sla: Sla, space: SearchSpace, study_dir: Path, budget_trials: int
) -> tuple[SearchPlan | None, StudyStopper | None]:
    """The warm start, hopeless pruning and stopping rule of ``autotuner tune``.

    A grid study gets none of them: it measures every point it lists, by design. The warm
    start takes at most half the budget; the rule stops at ``tune.patience`` launches without
    a gain of ``tune.capacity_resolution`` (no rule when patience is null).
    """
    if sla.tune.sampler == "grid":
        return None, None
    plan = SearchPlan(space, sla, study_dir, warm_limit=max(1, budget_trials // 2))
    patience = getattr(sla.tune, "patience", 4)
    resolution = float(getattr(sla.tune, "capacity_resolution", 0.03))
    if patience is None:
        return plan, None
    return plan, StudyStopper(StoppingRule(patience=patience, resolution=resolution))
