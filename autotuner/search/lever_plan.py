"""The levers of a study whose engine defaults missed the SLA, and when they are spent.

After the baseline (the engine defaults) missed the SLA at its own load, :func:`baseline_gap`
names the limit that bound it and by how much (the largest margin among the limits it
missed). :mod:`autotuner.search.levers` ranks the engine's levers for that limit; the warm
start pulls them in that order, each on top of the launch closest to meeting the SLA so far,
so that levers that helped add up. Once every lever of the space that can move the limit
(and one trade of it against another limit) was launched and still no launch met the SLA,
:func:`infeasible_answer` says so, with the closest miss and what would close the gap (the
lossy tier, more GPUs, what lies outside the space), instead of spending the rest of the
budget on settings that cannot move what binds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotuner.core.show import show_value
from autotuner.core.types import same_value
from autotuner.records.trial import TrialRecord
from autotuner.search.levers import LONG_PROMPT, Ranked
from autotuner.search.progress import best_launch, incumbent
from autotuner.search.study import UNDECIDED, counted, fresh_from
from autotuner.search.trial import own_load
from autotuner.sla.spec import Sla
from autotuner.space import ParamValue

__all__ = ["Gap", "baseline_gap", "infeasible_answer", "long_prompts", "pulled"]

_LATENCY_RE = re.compile(r"^(?:mean|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2e)_ms$")


@dataclass(frozen=True)
class Gap:
    """The limit a launch missed by most at the SLA's own load: its kind (``tpot``), the
    constraint key and metric, the limit and the measured value, and the relative margin."""

    limit: str
    key: str
    metric: str
    bound: float
    value: float | None
    margin: float

    def describe(self) -> str:
        shown = "not measurable" if self.value is None else _show(self.metric, self.value)
        return (
            f"{_name(self.metric)} {shown} against {_show(self.metric, self.bound)} "
            f"({self.margin:+.0%})"
        )


def _name(metric: str) -> str:
    """``p99_tpot_ms`` -> ``p99 TPOT``; other metrics as they are."""
    m = _LATENCY_RE.match(metric)
    if m is None:
        return metric
    return f"{metric.split('_', 1)[0]} {m[1].upper()}"


def _show(metric: str, value: float) -> str:
    if metric.endswith("_ms"):
        return f"{value / 1000:.3g} s" if value >= 1000 else f"{value:.3g} ms"
    if metric.endswith("_gib"):
        return f"{value:.3g} GiB"
    return f"{value:.3g}"


def _kind(metric: str) -> str | None:
    if (m := _LATENCY_RE.match(metric)) is not None:
        return m[1]
    if metric == "peak_memory_gib":
        return "memory"
    if "error" in metric:
        return "errors"
    return None


def _mean_tokens(count: object) -> float | None:
    if isinstance(count, int) and not isinstance(count, bool):
        return float(count)
    mean = getattr(count, "mean", None)
    if isinstance(mean, int | float):
        return float(mean)
    lo, hi = getattr(count, "min", None), getattr(count, "max", None)
    if isinstance(lo, int) and isinstance(hi, int):
        return (lo + hi) / 2
    return None


def long_prompts(sla: Sla) -> bool | None:
    """Whether the SLA's prompts are long (mean >= :data:`LONG_PROMPT` tokens); None when its
    workload does not say (a dataset or a trace)."""
    mean = _mean_tokens(sla.workload.input_tokens)
    return None if mean is None else mean >= LONG_PROMPT


def gap_of(t: FrozenTrial, sla: Sla) -> Gap | None:
    """The limit ``t`` missed by most at the SLA's own load; None when it met every limit
    there or measured nothing (a failed launch)."""
    if t.state != TrialState.COMPLETE or not t.constraints:
        return None
    metrics = TrialRecord.from_trial(t).metrics
    worst: Gap | None = None
    for c in sla.constraints:
        margin = t.constraints.get(c.key)
        kind = _kind(c.metric)
        if margin is None or margin <= 0 or kind is None:
            continue
        value = metrics.get(c.metric)
        if worst is None or margin > worst.margin:
            shown = value if isinstance(value, int | float) and math.isfinite(value) else None
            worst = Gap(kind, c.key, c.metric, float(c.limit), shown, float(margin))
    return worst


def _baseline(study: optuna.Study) -> FrozenTrial | None:
    since = fresh_from(study)
    for t in study.get_trials(deepcopy=False):
        if t.number >= since and counted(t) and TrialRecord.from_trial(t).baseline:
            return t
    return None


def baseline_gap(study: optuna.Study, sla: Sla) -> Gap | None:
    """What bound the engine defaults at the SLA's own load (None: they met it, failed to
    start, or have not finished)."""
    base = _baseline(study)
    return None if base is None else gap_of(base, sla)


def _tuned(t: FrozenTrial) -> Mapping[str, ParamValue]:
    return TrialRecord.from_trial(t).params_or(t.params)


def pulled(study: optuna.Study, ranked: Ranked) -> bool:
    """Whether a launch of the study (a candidate, not the baseline) pulled the lever: set it
    to one of its values, or, for a lever without values, to anything. A candidate of it
    pruned before launch (a rule refused it) counts too: it cannot be launched."""
    since = fresh_from(study)
    name = ranked.lever.name
    for t in study.get_trials(deepcopy=False):
        r = TrialRecord.from_trial(t)
        if t.number < since or r.baseline or r.role != "candidate":
            continue
        settled = counted(t) or r.duplicate or (t.state == TrialState.PRUNED and not r.race_level)
        if not settled or name not in (given := _tuned(t)):
            continue
        # A trade, or a lever pulled with the prior's values (which follow the incumbent),
        # is pulled by any value; a lever with values of its own by one of them.
        own = ranked.lever.values
        if ranked.status == "trade" or not own or any(same_value(given[name], v) for v in own):
            return True
    return False


def _busy(study: optuna.Study) -> bool:
    return any(
        t.state in (TrialState.RUNNING, TrialState.WAITING)
        for t in study.get_trials(deepcopy=False)
    )


def infeasible_answer(
    study: optuna.Study,
    sla: Sla,
    ranked: Sequence[Ranked],
    gap: Gap,
    *,
    lossy_allowed: bool,
    where: str,
) -> str | None:
    """The answer "no lossless setting of this engine meets ..." once every lever of the
    space that moves ``gap``'s limit was pulled and no launch met the SLA; None before (or
    when one met it, a launch is in flight, the table knows no lever for the limit, or the
    closest miss lies within ``tune.capacity_resolution`` of its limits: noise may have put a
    config that meets the SLA on the wrong side)."""
    if not ranked or best_launch(study) is not None or _busy(study):
        return None
    usable = [r for r in ranked if r.status in ("try", "trade")]
    if any(not pulled(study, r) for r in usable):
        return None
    closest = incumbent(study)
    if closest is not None and closest.constraints:
        # A miss within the measurement's resolution may be a config that meets the SLA,
        # measured on the wrong side of its limit: not an answer; the budget ends the search.
        worst = max(closest.constraints.values())
        if worst <= sla.tune.capacity_resolution:
            return None
    load = own_load(sla)
    unit = "concurrent requests" if sla.workload.arrival.process == "concurrency" else "req/s"
    lossy_rows = [r for r in ranked if r.status == "lossy"]
    setting = "lossless setting" if lossy_rows and not lossy_allowed else "setting"
    head = (
        f"no {setting} of this engine in the search space meets {_name(gap.metric)} "
        f"{_show(gap.metric, gap.bound)} at {load:g} {unit} {where}"
    )
    miss = _closest(closest, sla, gap) if closest is not None else "no launch measured it"
    tried = ", ".join(r.lever.describe() for r in usable) or "none in this space"
    would: list[str] = []
    if lossy_rows:
        shown = "; ".join(f"{r.lever.describe()}: {r.lever.evidence()}" for r in lossy_rows)
        would.append(f"the lossy tier (search.allow_lossy: true; {shown})")
    for r in ranked:
        if r.status == "outside":
            would.append(f"{r.lever.describe()} ({r.lever.evidence()})")
    closes = f". Would close it: {', or '.join(would)}" if would else ""
    return f"{head}: closest {miss}. Levers tried: {tried}{closes}"


def _closest(t: FrozenTrial, sla: Sla, gap: Gap) -> str:
    """The closest miss in words: the bound limit's value, the other latency limits' values
    at the SLA's own load, and the trial and its settings."""
    metrics = TrialRecord.from_trial(t).metrics
    parts: list[str] = []
    value = metrics.get(gap.metric)
    if isinstance(value, int | float) and math.isfinite(value):
        parts.append(_show(gap.metric, float(value)))
    else:
        parts.append(f"{_name(gap.metric)} not measurable")
    others = [
        f"{_name(c.metric)} {_show(c.metric, float(v))}"
        for c in sla.constraints
        if c.metric != gap.metric
        and _kind(c.metric) is not None
        and isinstance(v := metrics.get(c.metric), int | float)
        and math.isfinite(v)
    ]
    if others:
        parts.append(f"with {', '.join(others)}")
    given = _tuned(t)
    settings = ", ".join(f"{k}={show_value(v)}" for k, v in sorted(given.items()))
    undecided = " (undecided at its load)" if t.constraints.get(UNDECIDED, 0) > 0 else ""
    parts.append(f"(trial {t.number}: {settings or 'engine defaults'}){undecided}")
    return " ".join(parts)
