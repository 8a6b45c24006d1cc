"""What the daemon does when a job ends: record promotions and verdicts, raise alerts,
queue what follows (a re-tune after a failed re-check or an engine change)."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from autotuner.daemon import jobs
from autotuner.daemon.config import next_run
from autotuner.daemon.store import Job
from autotuner.records.base import RecordError
from autotuner.records.bench import BenchResult
from autotuner.records.compare import EngineComparison
from autotuner.records.outcome import JobOutcome
from autotuner.records.promotion import Promotion
from autotuner.sla.spec import SlaError, parse_sla

if TYPE_CHECKING:
    from autotuner.daemon.service import Daemon


def tune_done(d: Daemon, job: Job, code: int) -> dict[str, Any]:
    row = d.store.get_sla(job.sla)
    summary = jobs.study_summary(d.layout, job.sla, job.engine)
    found = promo = jobs.promotion_from(d.layout, job.sla, job.engine, time.time())
    if row is None:
        return {"promotion": None if promo is None else promo.to_json()}
    fields: dict[str, Any] = {"summary": summary}
    current = row.promotion
    # Exit 0 means a config confirmed to meet the SLA was promoted; a bundle left by an earlier
    # tune (this one found nothing to promote) does not count.
    met = code == 0 and promo is not None and promo.meets_sla
    if promo is not None and _same_bundle(promo, current):
        promo = None  # nothing new was promoted: the promotion in force keeps its time
    if promo is not None:
        if current is None or current.engine == job.engine:
            fields.update(promotion=promo, engine=job.engine)
        elif promo.meets_sla or not current.meets_sla:
            # A re-tune on a new engine takes over; the old promotion stays as fallback.
            fields.update(promotion=promo, fallback=current, engine=job.engine)
        else:
            d.alert(
                "retune_not_promoted",
                job.sla,
                "warning",
                f"{job.sla}: the re-tune on {job.engine} found nothing that meets the SLA; "
                f"the promotion on {current.engine} stays in force",
                {"engine": job.engine, "old_engine": current.engine},
            )
    if not met:
        d.alert(
            "sla_infeasible",
            job.sla,
            "warning",
            f"{job.sla}: no configuration confirmed to meet the SLA on {job.engine}"
            + ("" if promo is not None else "; nothing new promoted"),
            {"engine": job.engine, "goodput": None if promo is None else promo.goodput},
        )
    summary["sla_met"] = _sla_met(met, fields.get("promotion"), current, row.summary, job.engine)
    d.store.update_sla(job.sla, **fields)
    if row.next_check is None:
        try:
            first = next_run(row.schedule, time.time())
        except ValueError:  # a schedule that never fires: the schedule tick reports it
            first = None
        if first is not None:
            d.store.update_sla(job.sla, next_check=first)
    return {"promotion": None if found is None else found.to_json(), "summary": summary}


def _same_bundle(promo: Promotion, current: Promotion | None) -> bool:
    """Whether ``promo`` is the bundle already in force (same engine, same manifest)."""
    return (
        current is not None
        and promo.manifest_created is not None
        and current.engine == promo.engine
        and current.manifest_created == promo.manifest_created
    )


def _sla_met(
    met: bool,
    new: Promotion | None,
    current: Promotion | None,
    summary: dict[str, Any] | None,
    engine: str,
) -> bool:
    """Whether the promotion in force after a tune meets the SLA (``autotuner_sla_feasible``).

    A new promotion, or a tune on the engine in force that found nothing, decides it; when a
    tune on another engine found nothing, the promotion in force stays as it was judged.
    """
    if new is not None or current is None or current.engine == engine:
        return met
    before = (summary or {}).get("sla_met")
    return current.meets_sla if before is None else bool(before)


def recheck_done(d: Daemon, job: Job, code: int) -> dict[str, Any]:
    """A re-check's verdict: exit 0 met the SLA, exit 1 measured a miss (sla_violation and a
    re-tune). Anything else is no verdict on the SLA: the engine failed (exit 3: it did not
    start, e.g. a host short of memory for a moment, or crashed while measured), so nothing
    was measured; it raises no sla_violation and queues no re-tune, and the promotion in force
    stands (the job kind retries such an exit before it fails the job: kinds.Recheck)."""
    if code not in (0, 1):
        return _recheck_failed(d, job, code)
    row = d.store.get_sla(job.sla)
    bench = BenchResult.read_or_none(d.layout.run_dir(job.sla, job.id) / "result.json")
    goodput = bench.metrics.get("goodput") if bench else None
    out: dict[str, Any] = {"meets_sla": code == 0, "goodput": goodput, "exit_code": code}
    if row is None or row.promotion is None:
        return out
    p = row.promotion
    engine = p.engine
    if code != 0:
        d.alert(
            "sla_violation",
            job.sla,
            "critical",
            f"{job.sla}: the promoted config ({p.label}) no longer meets the SLA on "
            f"{engine}: it missed the SLA; re-tuning",
            {"engine": engine, "goodput": goodput},
        )
        if not d.store.pending(job.sla, "tune"):
            d.enqueue_tune(job.sla, row.engine, extra=retune_trials(d, job.sla))
        return out
    expected = p.goodput
    if isinstance(goodput, int | float) and expected is not None and expected > 0:
        drop = 1.0 - goodput / expected
        threshold = d.config.regression.min_effect
        out.update(expected=expected, change=-drop, threshold=threshold)
        if drop > threshold:
            d.alert(
                "throughput_regression",
                job.sla,
                "warning",
                f"{job.sla}: goodput of the promoted config fell {drop:.0%} (from "
                f"{expected:.2f} to {goodput:.2f}) on {engine}, beyond the noise "
                f"({threshold:.0%})",
                {"engine": engine, "expected": expected, "measured": goodput},
            )
    return out


def _recheck_failed(d: Daemon, job: Job, code: int) -> dict[str, Any]:
    """A re-check that measured nothing (the engine failed): an error outcome, never a
    verdict on the SLA (recheck_done)."""
    said = None
    with contextlib.suppress(OSError, RecordError):
        outcome = JobOutcome.read_or_none(d.layout.outcome(job.sla, job.id))
        said = outcome.message if outcome is not None else None
    why = f"exit {code}" + (f": {said}" if said else "")
    d.alert(
        "job_failed",
        job.sla,
        "warning",
        f"{job.sla}: the re-check of the promoted config measured nothing ({why}); no verdict "
        "on the SLA: the promotion stays in force and no re-tune is queued",
        {"job": job.id, "exit_code": code},
    )
    return {"meets_sla": None, "goodput": None, "exit_code": code, "error": why}


def regression_done(d: Daemon, job: Job, code: int) -> dict[str, Any]:
    path = d.layout.run_dir(job.sla, job.id) / "result.json"
    result = EngineComparison.read_or_none(path) or EngineComparison()
    verdict = result.verdict
    old, new = str(job.args["old"]), str(job.args["new"])
    details = {
        "verdict": verdict,
        "reason": result.reason,
        "changes": [c.model_dump(mode="json", exclude_unset=True) for c in result.changes],
        "old_engine": old,
        "new_engine": new,
        "old_version": result.old.version if result.old else None,
        "new_version": result.new.version if result.new else None,
        "load": result.load,
        "counts": result.counts,
    }
    d.store.add_verdict(job.sla, old, new, verdict, details)
    if verdict == "regression":
        numbers = "; ".join(
            f"{c.metric} {c.change:+.1%} (99% CI {c.ci_low:+.1%}..{c.ci_high:+.1%})"
            for c in result.changes
            if c.change is not None and c.direction == "worse"
        )
        d.alert(
            "engine_regression",
            job.sla,
            "critical",
            f"{job.sla}: {new} ({details['new_version']}) is slower than {old} "
            f"({details['old_version']}) for the promoted config: "
            f"{numbers or result.reason}",
            details,
        )
    if d.config.regression.retune and not d.store.pending(job.sla, "tune"):
        d.enqueue_tune(job.sla, new, priority=-1, extra=0)
    return details


def retune_trials(d: Daemon, sla: str) -> int:
    if d.config.retune_trials:
        return d.config.retune_trials
    row = d.store.get_sla(sla)
    if row is None:
        return 0
    with contextlib.suppress(SlaError):
        return parse_sla(row.yaml, sla).tune.trials
    return 0
