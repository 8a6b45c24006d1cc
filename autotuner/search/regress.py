"""Did a new engine version make a promoted config worse? (`autotuner compare-engines`)

The promoted config is launched on the old and the new engine in interleaved replicates
(old new, new old, ...), each measured once at the same load (the load the promotion was
confirmed at). For each metric — goodput (higher is better), p99 TTFT and p99 TPOT (lower is
better) — the ratio of the new engine's geometric mean to the old one's gets a 99 %
confidence interval from a pooled t-test on log values, so the noise between replicates of
one engine sets the interval's width. A change counts only when the whole interval lies
beyond the minimum effect: an A/A comparison must (almost) never raise an alarm (simulated:
under 1 % with 5 % run-to-run noise), and with few replicates only large changes count.

Verdicts: ``regression`` (some metric worse, even if another is better, or the config no
longer starts on the new engine), ``improvement`` (some metric better, none worse, none worse
on average), ``no_change``, and ``not_enough_data`` (fewer than two measured replicates on an
engine, or a metric that moved beyond the noise on average while its interval still reaches
the minimum effect).
Replicates are appended to ``replicates.jsonl`` as they finish, so an interrupted check
resumes where it stopped.

A replicate whose engine did not start, or crashed while measured, measured nothing. When the
old engine (the reference) measured nothing in every replicate there is nothing to compare:
that is an engine failure (:class:`~autotuner.core.errors.EngineStartFailed`, exit 3), not a
verdict, and its failed replicates are dropped from the journal so that a retry launches them
again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from autotuner.core.errors import EngineStartFailed
from autotuner.core.paths import atomic_write_text
from autotuner.core.types import ParamValue
from autotuner.engines import envs
from autotuner.engines.base import EngineAdapter
from autotuner.records.compare import EngineComparison, EngineRef, MetricChangeRecord, ReplicateLine
from autotuner.records.manifest import Manifest, PromotedConfig
from autotuner.search.capacity_compare import t_quantile
from autotuner.search.confirm import interleaved_order, spread

Verdict = Literal["regression", "improvement", "no_change", "not_enough_data"]
# unclear: the point estimate moved beyond the noise but the interval still reaches the
# minimum effect (the replicates disagree too much to say)
Direction = Literal["better", "worse", "same", "unclear", "unknown"]
# metric -> +1 when higher is better, -1 when lower is better
METRICS: dict[str, int] = {"goodput": 1, "p99_ttft_ms": -1, "p99_tpot_ms": -1}
Say = Callable[[str], None]


@dataclass(frozen=True)
class MetricChange:
    metric: str
    old_mean: float | None
    new_mean: float | None
    change: float | None  # relative, (new - old) / old
    ci_low: float | None
    ci_high: float | None
    threshold: float  # the minimum effect the interval had to clear
    direction: Direction


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str
    changes: list[MetricChange] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        parts = [
            f"{c.metric} {c.change:+.1%} (99% CI {c.ci_low:+.1%}..{c.ci_high:+.1%})"
            for c in self.changes
            if c.change is not None and c.ci_low is not None and c.ci_high is not None
        ]
        return f"{self.verdict}: {self.reason}" + (f" ({'; '.join(parts)})" if parts else "")


def t995(df: int) -> float:
    """The 99.5 % quantile of Student's t: a two-sided 99 % interval (the one t of the project,
    :func:`autotuner.search.capacity_compare.t_quantile`)."""
    return t_quantile(0.995, df)


def _log_interval(old: Sequence[float], new: Sequence[float]) -> tuple[float, float, float]:
    """Ratio new/old of geometric means and its 99 % interval (pooled t on log values).

    Logs make the test scale-free (a 10 % change means the same at 2 req/s and at 200), and
    the t quantile with 2n - 2 degrees of freedom makes few replicates pay for themselves:
    with two per engine only a large change clears it.
    """
    a, b = np.log(np.asarray(old, dtype=float)), np.log(np.asarray(new, dtype=float))
    df = len(a) + len(b) - 2
    pooled = ((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / df
    se = float(np.sqrt(pooled * (1 / len(a) + 1 / len(b))))
    d = float(b.mean() - a.mean())
    h = t995(df) * se
    return float(np.exp(d) - 1), float(np.exp(d - h) - 1), float(np.exp(d + h) - 1)


def compare_metric(
    metric: str, old: Sequence[float], new: Sequence[float], min_effect: float
) -> MetricChange:
    """Better/worse only when the whole 99 % interval lies beyond ``min_effect``."""
    sign = METRICS[metric]
    if len(old) < 2 or len(new) < 2:
        return MetricChange(metric, None, None, None, None, None, min_effect, "unknown")
    old_mean, new_mean = float(np.mean(old)), float(np.mean(new))
    if min(old) <= 0 or min(new) <= 0:
        # Nothing served within the SLOs in some run (goodput 0): only all-or-nothing counts.
        direction: Direction = "unknown"
        if max(old) <= 0 < min(new):
            direction = "better" if sign > 0 else "worse"
        elif max(new) <= 0 < min(old):
            direction = "worse" if sign > 0 else "better"
        return MetricChange(metric, old_mean, new_mean, None, None, None, min_effect, direction)
    change, low, high = _log_interval(old, new)
    direction = "same"
    if low > min_effect:
        direction = "better" if sign > 0 else "worse"
    elif high < -min_effect:
        direction = "worse" if sign > 0 else "better"
    elif abs(change) > max(min_effect, spread(old) + spread(new)):
        direction = "unclear"
    return MetricChange(metric, old_mean, new_mean, change, low, high, min_effect, direction)


def decide(samples: Sequence[ReplicateLine], min_effect: float) -> Outcome:
    """The verdict from interleaved samples of both engines (see the module docstring)."""
    started = {e: [s for s in samples if s.engine == e and s.started] for e in ("old", "new")}
    tried = {e: [s for s in samples if s.engine == e] for e in ("old", "new")}
    counts = {f"{e}_{k}": len(v[e]) for e in ("old", "new") for k, v in (("tried", tried),)}
    counts.update({f"{e}_measured": len(started[e]) for e in ("old", "new")})
    if len(started["old"]) >= 2 and tried["new"] and not started["new"]:
        causes = sorted({s.cause or "unknown" for s in tried["new"]})
        return Outcome(
            "regression",
            f"the promoted config no longer starts on the new engine ({', '.join(causes)}) "
            f"while it started {len(started['old'])} times on the old one",
            [],
            counts,
        )
    if len(started["old"]) < 2 or len(started["new"]) < 2:
        return Outcome(
            "not_enough_data",
            f"measured {len(started['old'])} replicate(s) on the old engine and "
            f"{len(started['new'])} on the new one; at least 2 each are needed",
            [],
            counts,
        )
    changes = []
    for metric in METRICS:
        old = [v for s in started["old"] if (v := s.metrics.get(metric)) is not None]
        new = [v for s in started["new"] if (v := s.metrics.get(metric)) is not None]
        changes.append(compare_metric(metric, old, new, min_effect))
    worse = [c.metric for c in changes if c.direction == "worse"]
    better = [c.metric for c in changes if c.direction == "better"]
    if worse:
        # Any metric worse is worth an alarm, even when another improved: the operator
        # decides whether the trade suits the SLA; the reason names both.
        also = f" (better in {', '.join(better)})" if better else ""
        return Outcome(
            "regression", f"worse beyond the noise in {', '.join(worse)}{also}", changes, counts
        )
    unclear = [c for c in changes if c.direction == "unclear"]
    # A metric that got worse on average blocks "improvement" even when its interval is too
    # wide to call it a regression: TPOT doubled on average is no improvement.
    doubtful = [c for c in unclear if c.change is not None and c.change * METRICS[c.metric] < 0]
    if better and not doubtful:
        return Outcome(
            "improvement", f"better beyond the noise in {', '.join(better)}", changes, counts
        )
    if unclear:
        moved = ", ".join(f"{c.metric} {c.change:+.0%}" for c in unclear if c.change is not None)
        also = f" (better in {', '.join(better)})" if better else ""
        return Outcome(
            "not_enough_data",
            f"{moved} on average, but the replicates vary too much to be sure{also}: run the "
            "check with more replicates",
            changes,
            counts,
        )
    return Outcome(
        "no_change",
        f"no metric moved by more than the minimum effect {min_effect:.0%} and the noise",
        changes,
        counts,
    )


# --------------------------------------------------------------------------- running it

RunOne = Callable[[str, Path], ReplicateLine]


def run_replicates(
    engines: Sequence[str], replicates: int, work_dir: Path, run_one: RunOne, say: Say
) -> list[ReplicateLine]:
    """Interleaved launches; finished ones are kept in ``replicates.jsonl`` and not re-run."""
    journal = work_dir / "replicates.jsonl"
    done: dict[tuple[str, int], ReplicateLine] = {}
    if journal.is_file():
        for n, line in enumerate(journal.read_text().splitlines(), 1):
            if line.strip():
                s = ReplicateLine.from_json(line, f"{journal} line {n}")
                done[(s.engine, s.replicate)] = s
    plan = interleaved_order(list(engines), replicates)
    for i, (r, engine) in enumerate(plan, 1):
        if (engine, r) in done:
            continue
        say(f"replicate {i}/{len(plan)}: {engine} engine, replicate {r + 1}")
        sample = run_one(engine, work_dir / f"{engine}-r{r}")
        sample = sample.model_copy(update={"engine": engine, "replicate": r})
        with journal.open("a") as f:
            f.write(sample.to_json(indent=None) + "\n")
        done[(engine, r)] = sample
        g = sample.metrics.get("goodput")
        say(
            f"  -> {'not measured: ' + (sample.cause or '?') if not sample.started else ''}"
            f"{'' if g is None else f'goodput {g:.2f}, '}"
            f"p99 TTFT {_fmt(sample.metrics.get('p99_ttft_ms'))} ms, "
            f"p99 TPOT {_fmt(sample.metrics.get('p99_tpot_ms'))} ms"
        )
    return [done[(e, r)] for r, e in plan]


def _check_reference(samples: Sequence[ReplicateLine], old: str, work_dir: Path) -> None:
    """Raise EngineStartFailed when the old engine measured nothing in any replicate (no
    verdict is possible); the failed replicates leave the journal, so a retry runs them."""
    tried = [s for s in samples if s.engine == "old"]
    if not tried or any(s.started for s in tried):
        return
    kept = [s for s in samples if s.started]
    atomic_write_text(
        work_dir / "replicates.jsonl",
        "".join(s.to_json(indent=None) + "\n" for s in kept),
    )
    causes = ", ".join(sorted({s.cause or "unknown" for s in tried}))
    raise EngineStartFailed(
        f"the promoted config did not run on the old engine {old} in any of its {len(tried)} "
        f"replicates ({causes}): there is nothing to compare the new engine with, so no "
        f"verdict; engine logs: {work_dir}/old-r*/engine.log"
    )


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _promoted(bundle: Path) -> tuple[dict[str, ParamValue], float | None, str]:
    manifest = Manifest.read(bundle / "optimization_manifest.json")
    promoted = manifest.promoted or PromotedConfig()
    confirmation = manifest.measurements.confirmation if manifest.measurements else None
    load = confirmation.load if confirmation else None
    return dict(promoted.params), (float(load) if load else None), promoted.label or "?"


def compare_engines(
    sla_path: str,
    bundle: Path,
    old: str,
    new: str,
    *,
    adapter: EngineAdapter,
    replicates: int,
    min_effect: float,
    work_dir: Path,
    say: Say,
) -> dict[str, Any]:
    """Run the check and write ``result.json`` into ``work_dir``. Returns that result.
    ``adapter``: the one of the SLA's engine kind (both environments run that engine)."""
    from autotuner.measure.launch import resolve_model
    from autotuner.search.trial import SearchSettings, run_trial
    from autotuner.sla.load import sla_load
    from autotuner.sla.spec import load_sla

    sla = load_sla(sla_path)
    params, load, label = _promoted(bundle)
    load = load or sla_load(sla)
    pythons = {"old": envs.get(old).python, "new": envs.get(new).python}
    versions = {k: envs.probe_version(p) for k, p in pythons.items()}
    model_dir = resolve_model(sla, say)
    cuda = None if sla.target.kind == "cpu" else list(sla.target.devices)
    say(
        f"comparing {label} of {sla.name} on {old} ({' '.join(versions['old'])}) and {new} "
        f"({' '.join(versions['new'])}) at {load:g}: {replicates} replicate(s) each, interleaved"
    )

    def run_one(engine: str, run_dir: Path) -> ReplicateLine:
        res = run_trial(
            params,
            sla,
            python=pythons[engine],
            model_dir=model_dir,
            run_dir=run_dir,
            cuda_devices=cuda,
            adapter=adapter,
            settings=SearchSettings(max_levels=1, start_load=load),
            say=say,
        )
        # A crash while measured is no measurement either (its level is kept for the record).
        level = res.levels[0] if res.levels and res.status != "failed" else None
        return ReplicateLine(
            engine=engine,
            replicate=0,
            started=level is not None,
            metrics={k: level.metrics.get(k) for k in METRICS} if level else {},
            feasible=bool(level and level.feasible),
            cause=None if level else (res.cause or res.reason),
            run_dir=str(run_dir),
        )

    work_dir.mkdir(parents=True, exist_ok=True)
    samples = run_replicates(["old", "new"], replicates, work_dir, run_one, say)
    _check_reference(samples, old, work_dir)
    outcome = decide(samples, min_effect)
    result = EngineComparison(
        sla=sla.name,
        config=label,
        params=params,
        load=load,
        old=EngineRef(name=old, version=" ".join(versions["old"])),
        new=EngineRef(name=new, version=" ".join(versions["new"])),
        replicates=replicates,
        min_effect=min_effect,
        verdict=outcome.verdict,
        reason=outcome.reason,
        changes=[MetricChangeRecord.model_validate(asdict(c)) for c in outcome.changes],
        counts=outcome.counts,
        samples=list(samples),
    )
    result.write(work_dir / "result.json")
    say(outcome.summary())
    return result.to_data()
