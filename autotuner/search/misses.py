"""What the search learns from its own misses: the configs a missed launch rules out.

A launch that missed a constraint at the SLA's own load (the first level) rules out every
config that differs from it only by moving parameters the way the space file's ``monotone:``
entries say never helps that constraint ("more slots never lower TPOT at a fixed load"). A
candidate like that is pruned before launch, with the miss it follows from as its reason.

Kept conservative, since pruning the best config costs more than one wasted launch:

* Every other tuned parameter must have the same effective value (an unset one takes the
  engine's default where it is known; an unknown default matches only an unknown one). A
  parameter without a direction for the constraint makes the two incomparable.
* Only a miss the measurement decided counts: the level's verdict for that constraint is
  ``misses`` where the trial file records one (its percentile's confidence interval is clear
  of the limit), else the margin is > 0; a constraint that was not measurable teaches nothing.
* A latency miss counts only when the launch met its other latency limits. A launch that
  missed several may have been overloaded (requests queueing), and then its latencies were
  not measured at the SLA's load, which is where the directions hold.
* Launch failures are :class:`~autotuner.search.rules.CrashMemory`'s business.

Misses are read from the study storage (and the trials' ``trial.json`` where present) at
each check, so a resumed study prunes from the misses of earlier runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotuner.core.types import ParamValue as AnyValue
from autotuner.core.types import same_value
from autotuner.records.trial import TrialRecord
from autotuner.search.trial import TrialResult
from autotuner.space import Monotone, ParamValue, SearchSpace

__all__ = ["EngineDefaults", "Miss", "MissBook", "follows_from", "taught"]

# The values the engine picks for the options it decides itself, given a launch's params.
EngineDefaults = Callable[[Mapping[str, AnyValue]], Mapping[str, AnyValue]]

UNDECIDED = "sla_undecided_at_own_load"  # study.UNDECIDED (not a constraint of the SLA)
_LATENCY = re.compile(r"^(?:mean|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2e)_ms$")


@dataclass(frozen=True)
class Miss:
    """A launch that missed ``missed`` at the SLA's own load, with its effective values."""

    trial: int
    baseline: bool
    values: dict[str, ParamValue]
    missed: tuple[str, ...]


def taught(
    margins: Mapping[str, float | None],
    verdicts: Mapping[str, str] | None = None,
    metric_of: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """The constraints (keys) a launch's first level teaches from (see the module docstring):
    missed (by the verdict where given, else the margin), and for a latency, the other
    latency limits met. ``metric_of``: each constraint key's metric (default: the key)."""

    def latency(key: str) -> bool:
        return _LATENCY.match((metric_of or {}).get(key, key)) is not None

    def missed(key: str) -> bool:
        m = margins.get(key)
        if m is None:
            return False
        if verdicts and key in verdicts:
            return verdicts[key] == "misses"
        return m > 0

    keys = [k for k in margins if k != UNDECIDED]
    out = []
    for k in keys:
        if not missed(k):
            continue
        if latency(k):
            others = [o for o in keys if o != k and latency(o)]
            if any(margins.get(o) is None or margins[o] > 0 for o in others):  # type: ignore[operator]
                continue
        out.append(k)
    return tuple(out)


def _covers(rule: Monotone, key: str, metric: str) -> bool:
    m = _LATENCY.match(metric)
    return bool({key, metric} & set(rule.limits)) or (m is not None and m[1] in rule.limits)


def _number(v: ParamValue) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _show(v: ParamValue) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def follows_from(
    space: SearchSpace,
    values: Mapping[str, ParamValue],
    miss: Miss,
    metric_of: Mapping[str, str] | None = None,
) -> str | None:
    """Why the config with effective ``values`` is hopeless after ``miss``, or None.
    ``metric_of``: each constraint key's metric (default: the key)."""
    for constraint in miss.missed:
        metric = (metric_of or {}).get(constraint, constraint)
        moved: list[tuple[str, ParamValue, ParamValue, Monotone]] = []
        for p in space.params:
            mine, theirs = values.get(p.name), miss.values.get(p.name)
            if same_value(mine, theirs):
                continue
            rule = next((r for r in p.monotone if _covers(r, constraint, metric)), None)
            a, b = _number(mine), _number(theirs)
            if rule is None or a is None or b is None:
                break
            if not (a > b if rule.worse == "higher" else a < b):
                break
            moved.append((p.name, mine, theirs, rule))
        else:
            if moved:
                where = f"trial {miss.trial}" + (" (the engine defaults)" if miss.baseline else "")
                how = " and ".join(
                    f"{name} {_show(a)} {'>=' if r.worse == 'higher' else '<='} {_show(b)}"
                    for name, a, b, r in moved
                )
                why = "; ".join(r.why for *_, r in moved)
                return (
                    f"hopeless: {how}, which missed {constraint} at the SLA's load in "
                    f"{where}: {why}"
                )
    return None


@dataclass
class MissBook:
    """The study's misses, read from its storage; what a candidate follows from.

    ``metric_of``: the SLA's constraint keys and their metrics. ``engine_defaults``: the
    values the engine picks for options left to it (None: unknown, so a miss teaches nothing
    about them). ``study_dir``: where trial files are, for the levels' verdicts.
    """

    space: SearchSpace
    metric_of: Mapping[str, str] = field(default_factory=dict)
    study_dir: Path | None = None
    engine_defaults: EngineDefaults | None = None
    _taught: dict[int, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def effective(self, params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """Every tuned parameter's value in a launch of ``params``: given, fixed, declared
        default, else the engine's own where known (None: unknown)."""
        given = {**self.space.fixed, **params}
        engine = dict(self.engine_defaults(given)) if self.engine_defaults else {}
        out: dict[str, ParamValue] = {}
        for p in self.space.params:
            v = self.space.value_of(p.name, params)
            if v is None and not isinstance(known := engine.get(p.name), dict):
                v = known
            out[p.name] = v
        return out

    def misses(self, study: optuna.Study) -> list[Miss]:
        out = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            r = TrialRecord.from_trial(t)
            if r.duplicate:  # the earlier trial of the same config teaches
                continue
            missed = self._missed(t, r)
            if missed:
                values = self.effective(r.params_or(t.params))
                out.append(Miss(t.number, r.baseline, values, missed))
        return out

    def _missed(self, t: FrozenTrial, r: TrialRecord) -> tuple[str, ...]:
        if t.number not in self._taught:
            margins: dict[str, float | None] = {
                k: (None if r.metrics.get(self.metric_of.get(k, k)) is None else v)
                for k, v in r.constraints.items()
            }
            verdicts: dict[str, str] | None = None
            if r.result_file and self.study_dir is not None:
                path = self.study_dir / r.result_file
                if path.exists():
                    result = TrialResult.read(path)
                    if result.levels:
                        margins = dict(result.levels[0].margins)
                        verdicts = dict(result.levels[0].verdicts) or None
            self._taught[t.number] = taught(margins, verdicts, self.metric_of)
        return self._taught[t.number]

    def reason(self, study: optuna.Study, suggested: Mapping[str, ParamValue]) -> str | None:
        """Why a candidate (its suggested values) follows from a miss of ``study``, or None."""
        values = self.effective(suggested)
        for miss in self.misses(study):
            why = follows_from(self.space, values, miss, self.metric_of)
            if why is not None:
                return why
        return None
