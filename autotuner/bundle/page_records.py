"""The study page's reading of the study (:mod:`autotuner.bundle.page`): its records, each
launch's ``trial.json`` and level files, the confirmation plan and the bundle's manifest,
turned into rows of the launch table. What can't be read is reported, never invented.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotuner.bundle.capacity_chart import LevelPoint
from autotuner.bundle.page_model import UNDECIDED, Launch, clean, clean_params
from autotuner.core.errors import AutotunerError
from autotuner.measure.levels import percentile_of
from autotuner.measure.loadgen import LoadResult
from autotuner.measure.quantile import quantile_interval
from autotuner.records.base import RecordError
from autotuner.records.confirm import ConfirmPlanFile
from autotuner.records.manifest import Manifest, ReplicateRecord
from autotuner.records.trial import CapacityRecord, TrialFile, TrialRecord
from autotuner.search.study import feasible, raced_out
from autotuner.sla.spec import Constraint, Sla


def trial_file(study_dir: Path, rel: str | None) -> TrialFile | None:
    if not rel:
        return None
    try:
        return TrialFile.read_or_none(study_dir / rel)
    except (RecordError, OSError):
        return None


def read_sla(study_dir: Path) -> Sla | None:
    try:
        from autotuner.sla.spec import load_sla

        return load_sla(study_dir / "sla.yaml")
    except (AutotunerError, OSError, ValueError):
        return None


def constraints_of(sla: Sla | None, manifest: Manifest | None) -> list[Constraint]:
    if sla is not None:
        return list(sla.constraints)
    limits = manifest.sla.constraints if manifest and manifest.sla else {}
    out = []
    for key, limit in limits.items():
        try:
            out.append(Constraint.model_validate({"key": key, "limit": limit}))
        except ValueError:
            continue
    return out


def _interval(
    run_dir: Path, result_file: str, c: Constraint, confidence: float
) -> tuple[float | None, float | None]:
    """The percentile's one-sided confidence bounds from the level's kept requests (None,
    None: not a percentile limit, or the level file is not there)."""
    pct = percentile_of(c)
    path = run_dir / result_file
    if pct is None or not path.is_file():
        return None, None
    try:
        result = LoadResult.from_dict(json.loads(path.read_text()))
        iv = quantile_interval(result.latencies_ms(pct[1]).tolist(), pct[0], confidence)
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    return iv.lower, iv.upper


def _levels(
    tf: TrialFile, run_dir: Path, constraints: Sequence[Constraint], confidence: float
) -> list[LevelPoint]:
    by_key = {c.key: c for c in constraints}
    out = []
    for i, lv in enumerate(tf.levels, 1):
        key = _deciding(lv.margins, by_key)
        c = by_key.get(key) if key else None
        value = lv.metrics.get(c.metric) if c else None
        lower = upper = None
        note = []
        if c is not None and lv.runs == 1:
            lower, upper = _interval(run_dir, lv.result_file, c, confidence)
        elif lv.runs > 1:
            note.append(f"{lv.runs} runs pooled")
        if lv.requests:
            note.append(f"{lv.requests} requests")
        if lv.sustained is False:
            note.append("the engine did not keep up with the offered load")
        verdict = "behind" if lv.generator_behind else (lv.verdict or _old_verdict(lv.feasible))
        if lv.generator_behind:
            note.append("the load generator fell behind its schedule")
        out.append(
            LevelPoint(
                index=i,
                load=lv.load,
                verdict=verdict,
                deciding=clean(key) if key else None,
                value=value,
                limit=c.limit if c else None,
                lower=lower,
                upper=upper,
                note=", ".join(note),
            )
        )
    return out


def _deciding(margins: Mapping[str, float | None], by_key: Mapping[str, Constraint]) -> str | None:
    """The constraint that decides a level: the one furthest past its limit when one is
    violated, else the percentile limit closest to it (a met limit of 0, or one on a quantity
    the load does not move, says nothing about the distance to the edge)."""
    known = {k: m for k, m in margins.items() if m is not None and k in by_key}
    if not known:
        return None
    violated = {k: m for k, m in known.items() if m > 0}
    pct = {k: m for k, m in known.items() if percentile_of(by_key[k]) is not None}
    pool = violated or pct or known
    return max(pool, key=lambda k: pool[k])


def _old_verdict(ok: bool) -> str:
    return "meets" if ok else "misses"


def _status(t: FrozenTrial, r: TrialRecord) -> str:
    if r.duplicate:
        return "duplicate"
    if t.state == TrialState.COMPLETE:
        return "met" if feasible(t) else "missed"
    if t.state == TrialState.PRUNED:
        return "raced" if raced_out(t) else "pruned"
    if t.state == TrialState.FAIL:
        return "interrupted" if r.interrupted else "failed"
    return t.state.name.lower()  # running / waiting


def _gpus(tf: TrialFile | None) -> int | None:
    gpus = tf.extra.get("engine_gpus") if tf else None
    return len(gpus) if isinstance(gpus, dict) and gpus else None


def search_launches(
    study: optuna.Study,
    study_dir: Path,
    constraints: Sequence[Constraint],
    confidence: float,
    basis: Mapping[int, str],
) -> list[Launch]:
    trials = [(t, TrialRecord.from_trial(t)) for t in study.get_trials(deepcopy=False)]
    fixed = next((set(r.params_or({})) for _, r in trials if r.baseline), set())
    base = next((r.params_or({}) for _, r in trials if r.baseline), {})
    out = []
    for t, r in trials:
        params = r.params_or(t.params)
        config = {k: v for k, v in params.items() if k not in fixed or base.get(k) != v}
        tf = trial_file(study_dir, r.result_file)
        run_dir = (study_dir / r.result_file).parent if r.result_file else study_dir
        status = _status(t, r)
        reason = r.reason or ""
        if status == "failed" and r.cause:
            reason = f"{r.cause}: {reason}" if reason else r.cause
        if status == "interrupted" and not reason:
            reason = "its tune stopped before this launch finished: no result recorded"
        if r.duplicate:
            reason = f"same config as trial {r.duplicate_of}: its result reused, no launch"
        if t.state == TrialState.WAITING and (queued := r.queued_note()):
            reason = queued
        cap = r.capacity or (tf.capacity if tf else None)
        tail = tf.extra.get("log_tail") if tf else None
        out.append(
            Launch(
                key=f"trial-{t.number}",
                number=t.number,
                role=r.role or "-",
                config=clean_params(config),
                params=clean_params(params),
                status=status,
                reason=clean(reason),
                capacity=cap,
                duration_s=tf.duration_s if tf and tf.duration_s else None,
                startup_s=tf.startup_s if tf else None,
                gpus=_gpus(tf),
                levels=_levels(tf, run_dir, constraints, confidence) if tf else [],
                log_tail=clean(tail) if isinstance(tail, str) and status == "failed" else "",
                basis=basis.get(t.number, "single run") if tf and tf.levels else "",
                race_level=r.race_level if status == "raced" else None,
                race_incumbent=r.race_incumbent if status == "raced" else None,
            )
        )
    return out


def replicate_launches(
    study_dir: Path,
    reps: Sequence[ReplicateRecord],
    base: Mapping[str, Any],
    constraints: Sequence[Constraint],
    confidence: float,
) -> list[Launch]:
    out = []
    for rep in reps:
        tf = trial_file(study_dir, f"{rep.run_dir}/trial.json")
        params = dict(tf.params) if tf else {}
        cap = tf.capacity if tf and tf.capacity else None
        if cap is None and rep.capacity is not None:
            cap = CapacityRecord(
                value=rep.capacity,
                low=rep.low or 0.0,
                high=rep.high,
                unit="req/s",
                stopped_by=rep.stopped_by or "?",
            )
        config = {k: v for k, v in params.items() if base.get(k) != v}
        out.append(
            Launch(
                key=f"{clean(rep.config)}-r{rep.replicate}",
                number=None,
                role=f"replicate of {clean(rep.config)}",
                config=clean_params(config),
                params=clean_params(params),
                status="met" if rep.feasible else "missed",
                reason=clean(tf.reason or "") if tf else "",
                capacity=cap,
                duration_s=tf.duration_s if tf and tf.duration_s else None,
                startup_s=tf.startup_s if tf else None,
                gpus=_gpus(tf),
                levels=_levels(tf, study_dir / rep.run_dir, constraints, confidence) if tf else [],
                basis="confirmation replicate",
            )
        )
    return out


def _confirm_dirs(study_dir: Path) -> list[Path]:
    d = study_dir / "confirm"
    return sorted(p for p in d.iterdir() if (p / "trial.json").is_file()) if d.is_dir() else []


def unrecorded_replicates(
    study_dir: Path, base: Mapping[str, Any], constraints: Sequence[Constraint], confidence: float
) -> list[Launch]:
    """Confirmation launches that finished but that no manifest records yet (a confirmation
    in progress or interrupted)."""
    out = []
    for d in _confirm_dirs(study_dir):
        tf = trial_file(study_dir, f"confirm/{d.name}/trial.json")
        if tf is None:
            continue
        config = {k: v for k, v in tf.params.items() if base.get(k) != v}
        name, _, rep = d.name.rpartition("-r")
        out.append(
            Launch(
                key=clean(d.name),
                number=None,
                role=f"replicate of {clean(name)}" + ("" if rep.isdigit() else " (?)"),
                config=clean_params(config),
                params=clean_params(tf.params),
                status="met" if tf.feasible else ("failed" if tf.status == "failed" else "missed"),
                reason=clean(tf.reason or ""),
                capacity=tf.capacity,
                duration_s=tf.duration_s or None,
                startup_s=tf.startup_s,
                gpus=_gpus(tf),
                levels=_levels(tf, d, constraints, confidence),
                basis=UNDECIDED,
            )
        )
    return out


def read_manifest(bundle: Path | None, study_dir: Path) -> tuple[Manifest | None, str | None]:
    """The bundle's manifest, or ``no_promotion.json``; and what went wrong reading it."""
    for path in (
        *(() if bundle is None else (bundle / "optimization_manifest.json",)),
        study_dir / "no_promotion.json",
    ):
        if path.is_file():
            try:
                return Manifest.read(path), None
            except (RecordError, OSError) as exc:
                return None, f"{path.name} could not be read: {exc}"
    return None, None


def read_plan(study_dir: Path) -> ConfirmPlanFile | None:
    try:
        return ConfirmPlanFile.read_or_none(study_dir / "confirm" / "plan.json")
    except (RecordError, OSError):
        return None
