"""The study as one self-contained HTML page (``autotuner report STUDY --html FILE``, and
``report.html`` in the promoted bundle).

The page is read from the study's records only: its Optuna storage (trial records), each
launch's ``trial.json`` and level files, the confirmation plan and the manifest of the bundle
(``promoted/optimization_manifest.json``, or ``no_promotion.json``). It says what is missing
instead of inventing it: a study with no promotion, one where every launch failed and one
still running each get a page that says so.

Works offline: inline CSS, inline SVG (the Pareto chart and the latency breakdown drawn by
:mod:`autotuner.bundle.report`, a capacity-search picture per launch by
:mod:`autotuner.bundle.capacity_chart`) and a few lines of plain JavaScript that sort the
launch table. Rendered by Jinja2 with autoescape on: every string that came from a user, a
file or an engine is escaped, and control characters are shown as ``\\xNN``.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2
import optuna
from markupsafe import Markup
from optuna.trial import FrozenTrial, TrialState

from autotuner.bundle import report
from autotuner.bundle.capacity_chart import VERDICT_COLORS, LevelPoint, capacity_svg
from autotuner.core.errors import AutotunerError
from autotuner.measure.levels import percentile_of
from autotuner.measure.loadgen import LoadResult
from autotuner.measure.quantile import quantile_interval
from autotuner.records.base import RecordError
from autotuner.records.confirm import ConfirmPlanFile
from autotuner.records.manifest import DecisionRecord, Manifest, NoDecision, ReplicateRecord
from autotuner.records.owner import StudyLockFile
from autotuner.records.trial import CapacityRecord, StudyRecord, TrialFile, TrialRecord
from autotuner.search.lock import LOCK_NAME, owner_state
from autotuner.search.pareto import pareto_front
from autotuner.search.study import feasible, raced_out
from autotuner.sla.spec import Constraint, Sla

_TEMPLATES = Path(__file__).resolve().parent / "templates"
_UNDECIDED = "replicate, no decision yet"
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# How a status reads where its key alone would say too little: a pruned trial never
# launched; a raced one launched, missed the SLA at the incumbent's capacity and was pruned.
_STATUS_TEXT = {"pruned": "pruned before launch", "raced": "pruned (raced out)"}


def clean(value: object) -> str:
    """``value`` as text with control characters shown as ``\\xNN`` (tab and newline kept)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _clean_params(params: Mapping[str, Any]) -> dict[str, object]:
    return {clean(k): clean(v) if isinstance(v, str) else v for k, v in params.items()}


@dataclass(frozen=True)
class Launch:
    """One engine launch (a search trial or a confirmation replicate), or a trial that never
    launched (pruned, a duplicate, waiting): a row of the launch table."""

    key: str  # "trial-3", "baseline-r0": the row's anchor
    number: int | None  # trial number (None: a confirmation replicate)
    role: str  # baseline / candidate / replicate of <config>
    config: dict[str, object]  # params that differ from the baseline's
    params: dict[str, object]  # every param
    # met / missed / raced / pruned / failed / interrupted / duplicate / running / waiting
    status: str
    reason: str
    capacity: CapacityRecord | None
    duration_s: float | None
    gpus: int | None  # GPUs the launch held (None: not recorded, e.g. a CPU target)
    levels: list[LevelPoint] = field(default_factory=list)
    log_tail: str = ""
    basis: str = "single run"
    startup_s: float | None = None  # the engine's start, part of duration_s
    # A candidate raced out: the one level it ran (the incumbent's capacity) and the incumbent
    race_level: float | None = None
    race_incumbent: int | None = None

    @property
    def gpu_s(self) -> float | None:
        if self.duration_s is None or not self.gpus:
            return None
        return self.duration_s * self.gpus

    @property
    def status_text(self) -> str:
        return _STATUS_TEXT.get(self.status, self.status)

    @property
    def unit(self) -> str:
        return self.capacity.unit if self.capacity else "req/s"

    @property
    def capacity_text(self) -> str:
        c = self.capacity
        if self.status == "raced":  # it missed the one level it ran: nothing is known below it
            return "none"
        if c is None:
            return "-"
        return f"{c.value:.3g}" if c.low > 0 else "0"

    @property
    def capacity_sort(self) -> float:
        """The capacity column's sort key (-1: no capacity known)."""
        if self.status == "raced" or self.capacity is None:
            return -1.0
        return self.capacity.value

    @property
    def bracket_text(self) -> str:
        c = self.capacity
        if self.status == "raced":  # the one level it ran (the reason names the incumbent)
            return "-" if self.race_level is None else f"missed {self.race_level:.3g} {self.unit}"
        if c is None or (c.stopped_by == "legacy" and c.low <= 0):
            return "-"
        if c.low <= 0:  # nothing met: why the search stopped (the reason column says more)
            return c.stopped_by.replace("_", " ")
        high = "open" if c.high is None else f"{c.high:.3g}"
        return f"[{c.low:.3g}, {high}] {c.unit}"

    def chart(self) -> Markup:
        c = self.capacity
        title = f"{self.key}: capacity search"
        race = None
        if self.status == "raced" and self.race_level is not None:
            title = f"{self.key}: raced out at {self.race_level:.3g} {self.unit}, one level"
            who = "the incumbent" if self.race_incumbent is None else f"trial {self.race_incumbent}"
            race = (self.race_level, f"{who}'s capacity")
        # The SVG is built from escaped parts (autotuner.bundle.svg): safe to insert as is.
        return Markup(
            capacity_svg(
                self.levels,
                unit=self.unit,
                low=c.low if c else None,
                high=c.high if c else None,
                value=c.value if c else None,
                title=title,
                race=race,
            )
        )


@dataclass(frozen=True)
class Replicates:
    """The confirmation: replicate pairs and the comparison's interval."""

    configs: list[str]  # the config labels compared, the candidate(s) first
    rows: list[dict[str, ReplicateRecord | None]]  # per replicate: label -> record
    comparisons: dict[str, dict[str, Any]]
    planned: int | None  # replicates per config the plan asked for
    finished: bool | None  # the plan's own word (None: no plan file)
    unit: str


@dataclass(frozen=True)
class Page:
    """Everything the template shows."""

    name: str
    state: str  # promoted / not_promoted / failed / running / no_launch
    headline: str
    rests_on: list[str]
    decision_reason: str | None
    identity: dict[str, str]
    objectives: list[str]
    constraints: list[tuple[str, float]]
    promoted: dict[str, Any] | None  # label, params against the baseline, serve command
    launches: list[Launch]
    confirmation: Replicates | None
    pareto: Markup | None
    latency: Markup | None
    missing: list[str]
    notes: list[str]
    # The hardware it was measured on: (field, value per device) from the manifest
    hardware: list[tuple[str, list[str]]] = field(default_factory=list)
    files: list[tuple[str, str]] = field(default_factory=list)  # bundle text files shown whole
    colors: dict[str, str] = field(default_factory=lambda: dict(VERDICT_COLORS))


# ---------------------------------------------------------------------------------------------
# Reading the study


def _trial_file(study_dir: Path, rel: str | None) -> TrialFile | None:
    if not rel:
        return None
    try:
        return TrialFile.read_or_none(study_dir / rel)
    except (RecordError, OSError):
        return None


def _sla(study_dir: Path) -> Sla | None:
    try:
        from autotuner.sla.spec import load_sla

        return load_sla(study_dir / "sla.yaml")
    except (AutotunerError, OSError, ValueError):
        return None


def _constraints(sla: Sla | None, manifest: Manifest | None) -> list[Constraint]:
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


def _search_launches(
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
        tf = _trial_file(study_dir, r.result_file)
        run_dir = (study_dir / r.result_file).parent if r.result_file else study_dir
        status = _status(t, r)
        reason = r.reason or ""
        if status == "failed" and r.cause:
            reason = f"{r.cause}: {reason}" if reason else r.cause
        if status == "interrupted" and not reason:
            reason = "its tune stopped before this launch finished: no result recorded"
        if r.duplicate:
            reason = f"same config as trial {r.duplicate_of}: its result reused, no launch"
        if t.state == TrialState.WAITING and r.requeued_from is not None:
            reason = f"trial {r.requeued_from}'s config, queued again"
        cap = r.capacity or (tf.capacity if tf else None)
        tail = tf.extra.get("log_tail") if tf else None
        out.append(
            Launch(
                key=f"trial-{t.number}",
                number=t.number,
                role=r.role or "-",
                config=_clean_params(config),
                params=_clean_params(params),
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


def _replicate_launches(
    study_dir: Path,
    reps: Sequence[ReplicateRecord],
    base: Mapping[str, Any],
    constraints: Sequence[Constraint],
    confidence: float,
) -> list[Launch]:
    out = []
    for rep in reps:
        tf = _trial_file(study_dir, f"{rep.run_dir}/trial.json")
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
                config=_clean_params(config),
                params=_clean_params(params),
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


def _unrecorded_replicates(
    study_dir: Path, base: Mapping[str, Any], constraints: Sequence[Constraint], confidence: float
) -> list[Launch]:
    """Confirmation launches that finished but that no manifest records yet (a confirmation
    in progress or interrupted)."""
    out = []
    for d in _confirm_dirs(study_dir):
        tf = _trial_file(study_dir, f"confirm/{d.name}/trial.json")
        if tf is None:
            continue
        config = {k: v for k, v in tf.params.items() if base.get(k) != v}
        name, _, rep = d.name.rpartition("-r")
        out.append(
            Launch(
                key=clean(d.name),
                number=None,
                role=f"replicate of {clean(name)}" + ("" if rep.isdigit() else " (?)"),
                config=_clean_params(config),
                params=_clean_params(tf.params),
                status="met" if tf.feasible else ("failed" if tf.status == "failed" else "missed"),
                reason=clean(tf.reason or ""),
                capacity=tf.capacity,
                duration_s=tf.duration_s or None,
                startup_s=tf.startup_s,
                gpus=_gpus(tf),
                levels=_levels(tf, d, constraints, confidence),
                basis=_UNDECIDED,
            )
        )
    return out


def _manifest(bundle: Path | None, study_dir: Path) -> tuple[Manifest | None, str | None]:
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


def _plan(study_dir: Path) -> ConfirmPlanFile | None:
    try:
        return ConfirmPlanFile.read_or_none(study_dir / "confirm" / "plan.json")
    except (RecordError, OSError):
        return None


# ---------------------------------------------------------------------------------------------
# Charts


def _pareto(
    study: optuna.Study, objectives: Sequence[str], manifest: Manifest | None, name: str
) -> Markup | None:
    from autotuner.bundle.promote import CONFIRMED_METRICS, Figures, candidates

    if not objectives or len(study.directions) != len(objectives):
        return None
    cands = candidates(study)
    if not cands:
        return None
    directions: list[Literal["maximize", "minimize"]] = [
        "maximize" if d == optuna.study.StudyDirection.MAXIMIZE else "minimize"
        for d in study.directions
    ]
    front = {c.trial for c in pareto_front(cands, directions)}
    figures = Figures.of(manifest) if manifest is not None else None
    promoted = manifest.promoted.trial if manifest and manifest.promoted else None
    points = [
        report.Point(
            trial=c.trial,
            values={
                m: (figures.metrics(c).get(m, v) if figures and m in CONFIRMED_METRICS else v)
                for m, v in zip(objectives, c.values, strict=True)
            },
            feasible=c.feasible,
            on_front=c.trial in front,
            promoted=c.trial == promoted,
            baseline=c.baseline,
            params=_clean_params(c.params),
            basis=figures.point_basis(c) if figures else "single run",
        )
        for c in cands
    ]
    better = {"maximize": "max", "minimize": "min"}
    y = objectives[1] if len(objectives) > 1 else None
    doc = report.pareto_svg(
        points,
        objectives[0],
        y,
        x_better="max" if better[directions[0]] == "max" else "min",
        y_better="max" if len(directions) > 1 and directions[1] == "maximize" else "min",
        title=f"{name}: trials",
        notes=[clean(n) for n in manifest.pareto_notes] if manifest is not None else (),
    )
    return Markup(_inline(doc))


def _inline(doc: str) -> str:
    """An SVG document without its XML declaration, to sit inside HTML."""
    return doc.split("\n", 1)[1] if doc.startswith("<?xml") else doc


def _profile(tf: TrialFile | None, title: str) -> report.LatencyProfile | None:
    """A launch's latencies at the SLA's own load (its first level), as the bundle draws them."""
    if tf is None or not tf.levels:
        return None
    m = tf.levels[0].metrics
    pct = {
        metric: {q: m.get(f"{q}_{metric}_ms") for q in ("p50", "p90", "p99")}
        for metric in ("ttft", "tpot", "e2e")
    }
    eng = tf.levels[0].engine
    phases = {
        k: float(eng[f"mean_{k}_ms"])
        for k in ("queue", "prefill", "decode")
        if isinstance(eng.get(f"mean_{k}_ms"), int | float)
    }
    cache = {
        k: float(eng[k])
        for k in ("prompt_cached_share", "prefix_cache_hit_rate")
        if isinstance(eng.get(k), int | float)
    }
    return report.LatencyProfile(clean(title), pct, phases, cache)


def _bundle_latency(bundle: Path, promoted: bool) -> Markup | None:
    """The bundle's own latency breakdown when it has a kernel panel (profiled configs: the
    profiles are not kept in the study), as an image: an SVG shown through ``<img>`` runs no
    script, whatever the file holds."""
    svg_file = bundle / "latency_breakdown.svg"
    if not promoted or not (bundle / "kernel_breakdown.csv").is_file():
        return None
    try:
        data = base64.b64encode(svg_file.read_bytes()).decode("ascii")
    except OSError:
        return None
    return Markup(
        '<img class="bundle-svg" alt="latency breakdown with the kernel-class panel" '
        f'src="data:image/svg+xml;base64,{data}">'
    )


def _latency(
    study: optuna.Study,
    study_dir: Path,
    shown: int | None,
    name: str,
    promoted: bool,
    constraints: Sequence[Constraint] = (),
) -> Markup | None:
    """The latency breakdown of ``shown`` (the promoted trial, or the best launch) and the
    baseline, at the SLA's own load."""
    profiles = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        r = TrialRecord.from_trial(t)
        if t.number == shown or r.baseline:
            what = "baseline" if r.baseline else "promoted" if promoted else "best single run"
            if r.baseline and t.number == shown:
                what = "promoted = baseline" if promoted else "baseline, the best single run"
            prof = _profile(_trial_file(study_dir, r.result_file), f"{what} (trial {t.number})")
            if prof is not None:
                profiles.append(prof)
    if not profiles:
        return None
    doc = report.latency_breakdown_svg(
        profiles,
        title=f"{name}: latency at the SLA's load",
        limits=report.sla_limits([(c.metric, c.limit) for c in constraints if c.bound == "max"]),
    )
    return Markup(_inline(doc))


# ---------------------------------------------------------------------------------------------
# Words


def _fmt_pct(v: float | None) -> str:
    return "?" if v is None or not math.isfinite(v) else f"{v * 100:+.1f} %"


def _finite(v: object) -> float | None:
    """``v`` when it is a finite number (a manifest's free-form entry may hold anything)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _comparison(cmp: Mapping[str, Any]) -> dict[str, Any]:
    """One candidate's comparison with the baseline, its numbers checked, its words cleaned."""
    out: dict[str, Any] = {
        k: _finite(cmp.get(k)) for k in ("effect", "low", "high", "confidence", "min_effect")
    }
    pairs = cmp.get("pairs")
    out["pairs"] = pairs if isinstance(pairs, int) and not isinstance(pairs, bool) else "?"
    out["verdict"] = clean(cmp.get("verdict") or "?").replace("_", " ")
    return out


def _tuner(study_dir: Path) -> str | None:
    """Who tunes the study now, from its lock file (None: no tuner alive on this host, or
    this process: tune writing the page into its bundle)."""
    try:
        lock = StudyLockFile.read_or_none(study_dir / LOCK_NAME)
    except (RecordError, OSError):
        return None
    if lock is None or (lock.owner.pid == os.getpid() and lock.owner.host == socket.gethostname()):
        return None
    return clean(lock.owner.describe()) if owner_state(lock.owner) == "alive" else None


def _state(
    launches: Sequence[Launch], manifest: Manifest | None, study: optuna.Study, tuner: str | None
) -> str:
    if manifest is not None and manifest.promoted is not None:
        return "promoted"
    running = any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in study.trials)
    if running or tuner is not None:
        return "running"
    launched = [x for x in launches if x.status not in ("pruned", "duplicate")]
    if not launched:
        return "no_launch"
    if all(x.status in ("failed", "interrupted") for x in launched):
        return "failed"
    return "not_promoted"


def _kept_against(d: DecisionRecord) -> str:
    """What the kept baseline was compared with: each candidate's effect with its interval."""
    out = ""
    for label, raw in d.comparisons.items():
        cmp = _comparison(raw)
        if cmp["effect"] is None:
            continue
        span = ""
        if cmp["low"] is not None and cmp["high"] is not None:
            span = f" [{_fmt_pct(cmp['low'])}, {_fmt_pct(cmp['high'])}]"
        conf = f" at {cmp['confidence'] * 100:.0f} %" if cmp["confidence"] else ""
        out += (
            f" {clean(label)} against it: {_fmt_pct(cmp['effect'])}{span}{conf} from "
            f"{cmp['pairs']} pair{'' if cmp['pairs'] == 1 else 's'} ({cmp['verdict']})."
        )
    return out


def _headline(
    state: str,
    manifest: Manifest | None,
    launches: Sequence[Launch],
    best: Launch | None,
    tuner: str | None = None,
) -> str:
    if state == "promoted" and manifest is not None and manifest.promoted is not None:
        p = manifest.promoted
        who = "the engine defaults (baseline)" if p.is_baseline else f"trial {p.trial}"
        d = manifest.decision
        sentence = f"Serve {who}."
        if isinstance(d, DecisionRecord) and d.effect is not None and not p.is_baseline:
            span = ""
            if d.effect_low is not None and d.effect_high is not None:
                span = f" [{_fmt_pct(d.effect_low)}, {_fmt_pct(d.effect_high)}]"
            conf = f" at {d.confidence * 100:.0f} % confidence" if d.confidence else ""
            sentence = (
                f"Serve trial {p.trial}: it holds {_fmt_pct(d.effect)}{span} more "
                f"{d.basis} than the engine defaults{conf}."
            )
        elif isinstance(d, DecisionRecord) and d.basis == "sla" and p.meets_sla:
            sentence = (
                f"Serve trial {p.trial}: it met the SLA in every measurement, the engine "
                "defaults did not."
            )
        stats = d.per_config.get(p.label or "") if isinstance(d, DecisionRecord) else None
        conf_m = manifest.measurements.confirmation if manifest.measurements else None
        if stats is not None and stats.capacity_mean is not None and stats.replicates:
            unit = conf_m.load_unit if conf_m and conf_m.load_unit else "req/s"
            # A replicate that missed the SLA is a miss, never averaged in as capacity 0.
            held = [c for c in stats.capacities if c is not None and c > 0]
            missed = sum(1 for c in stats.capacities if c is not None and c <= 0)
            mean = sum(held) / len(held) if held else stats.capacity_mean
            over = f"mean of {len(held) or stats.replicates} replicates"
            if missed:
                over = f"mean of the {len(held)} of {len(held) + missed} that met the SLA"
            sentence += f" Confirmed capacity {mean:.3g} {unit} ({over})."
        if p.is_baseline and isinstance(d, DecisionRecord):
            sentence += _kept_against(d)
        if not p.meets_sla:
            sentence += " No confirmed config meets the SLA."
        return sentence
    if state == "running" and tuner is not None:
        return f"This study is being tuned now ({tuner}): no decision has been made yet."
    if state == "running":
        return "This study is still running (or was interrupted): no decision has been made yet."
    if state == "no_launch":
        return "Nothing was measured: no launch of this study has run."
    if state == "failed":
        return (
            f"Nothing was promoted: every one of the {len(launches)} launches failed "
            "(the reasons are in the table)."
        )
    why = ""
    if manifest is not None and isinstance(manifest.decision, NoDecision):
        why = f": {manifest.decision.reason}"
    elif manifest is None:
        why = ": the study stopped before promotion (no bundle, no no_promotion.json)"
    if best is not None and best.capacity is not None and best.capacity.low > 0:
        why += f". The best single run, {best.key}, held {best.capacity.describe()}, not confirmed"
    return f"Nothing was promoted{why}."


def _identity_text(key: str, value: object) -> str:
    """An identity value as a reader says it: the target's key ``cpu:`` / ``gpu:0,1`` (kind
    and devices, as studies are matched by) reads ``cpu`` / ``gpu 0,1``."""
    text = str(value)
    if key == "target":
        kind, _, devices = text.partition(":")
        return f"{kind} {devices}".strip()
    return text


def _rests_on(
    manifest: Manifest | None,
    launches: Sequence[Launch],
    plan: ConfirmPlanFile | None,
    cpu: bool = False,
) -> list[str]:
    out = []
    d = manifest.decision if manifest else None
    if isinstance(d, DecisionRecord):
        pairs = [s.replicates for s in d.per_config.values()]
        if d.confirmed and pairs:
            out.append(
                f"confirmed: {min(pairs)} replicate pair{'s' if min(pairs) != 1 else ''} of "
                f"capacity searches, {len(d.per_config)} configs (the decision rests on them)"
            )
        else:
            out.append(
                "not confirmed: no confirmation launch was spent; every figure is a "
                "single run of the search"
            )
    elif plan is not None and not plan.finished:
        out.append(
            f"a confirmation of {plan.replicates} replicates per config was planned and has "
            "not finished"
        )
    ran = [x for x in launches if x.duration_s]
    gpu_s = [x.gpu_s for x in ran if x.gpu_s is not None]
    wall = sum(x.duration_s or 0.0 for x in ran)
    if ran:
        many = "launch" if len(ran) == 1 else "launches"
        text = f"{len(ran)} {many}, {wall / 60:.1f} min of launch time"
        if gpu_s:
            text += f", {sum(gpu_s) / 60:.1f} GPU-minutes"
            if len(gpu_s) < len(ran):
                text += f" ({len(ran) - len(gpu_s)} launches without a GPU count)"
        else:
            text += " (a CPU target: no GPU time)" if cpu else " (no GPU count recorded)"
        out.append(text)
    return out


def _promoted(manifest: Manifest, base: Mapping[str, Any]) -> dict[str, Any] | None:
    p = manifest.promoted
    if p is None:
        return None
    keys = list(dict.fromkeys([*p.params, *base]))
    rows = [
        (
            clean(k),
            clean(p.params[k]) if k in p.params else "(engine default)",
            clean(base[k]) if k in base else "(engine default)",
            k in p.tuned_params,
        )
        for k in keys
    ]
    return {
        "label": clean(p.label or f"trial-{p.trial}"),
        "trial": p.trial,
        "is_baseline": p.is_baseline,
        "meets_sla": p.meets_sla,
        "rows": rows,
        "command": clean(shlex.join(p.serve_argv)) if p.serve_argv else "",
    }


def _confirmation(manifest: Manifest | None, plan: ConfirmPlanFile | None) -> Replicates | None:
    conf = manifest.measurements.confirmation if manifest and manifest.measurements else None
    reps = list(conf.replicates) if conf else []
    if not reps and plan is None:
        return None
    labels = list(dict.fromkeys(r.config for r in reps)) or list(plan.configs if plan else [])
    labels.sort(key=lambda x: x == "baseline")
    count = max([r.replicate for r in reps], default=-1) + 1
    rows = [
        {
            clean(lab): next((r for r in reps if r.config == lab and r.replicate == i), None)
            for lab in labels
        }
        for i in range(count)
    ]
    d = manifest.decision if manifest else None
    comparisons = dict(d.comparisons) if isinstance(d, DecisionRecord) else {}
    return Replicates(
        configs=[clean(x) for x in labels],
        rows=rows,
        comparisons={clean(k): _comparison(v) for k, v in comparisons.items()},
        planned=plan.replicates if plan else None,
        finished=plan.finished if plan else None,
        unit=clean(conf.load_unit) if conf and conf.load_unit else "req/s",
    )


# ---------------------------------------------------------------------------------------------
# The page


_HARDWARE_FIELDS = (
    "name",
    "memory_total_bytes",
    "compute_capability",
    "driver_version",
    "cuda_driver_version",
    "power_limit_w",
    "cpu_model",
    "cpu_cores",
    "host_memory_total_bytes",
    "hostname",
)
_BUNDLE_TEXT = ("fallback_plan.md", "lossy_tier.md")


def _hardware(manifest: Manifest | None) -> list[tuple[str, list[str]]]:
    """The hardware profile's main fields, one column per device (bytes shown in GiB)."""
    rows = manifest.provenance.hardware if manifest and manifest.provenance else []
    out = []
    for key in _HARDWARE_FIELDS:
        values = [row.get(key, "") for row in rows]
        if all(v.strip().lower() in ("", "n/a") for v in values):
            continue  # not a field of this device (a CPU has no driver version)
        if key.endswith("_bytes"):
            values = [_gib(v) for v in values]
        out.append((clean(key.removesuffix("_bytes")), [clean(v) for v in values]))
    return out


def _gib(text: str) -> str:
    try:
        return f"{int(text) / 2**30:.1f} GiB"
    except ValueError:
        return text


def _bundle_files(bundle: Path) -> list[tuple[str, str]]:
    """The bundle's fallback plan and lossy tier, as their text (shown escaped)."""
    out = []
    for name in _BUNDLE_TEXT:
        path = bundle / name
        try:
            if path.is_file():
                out.append((name, clean(path.read_text(encoding="utf-8", errors="replace"))))
        except OSError:
            continue
    return out


def build(study: optuna.Study, study_dir: Path, bundle: Path | None = None) -> Page:
    """What the page shows. ``bundle``: the promoted bundle's folder (default
    ``<study>/promoted``; ``write_bundle`` passes the one it is writing)."""
    bundle = bundle if bundle is not None else study_dir / "promoted"
    manifest, unreadable = _manifest(bundle, study_dir)
    sla = _sla(study_dir)
    constraints = _constraints(sla, manifest)
    confidence = sla.tune.confidence if sla is not None else 0.95
    record = StudyRecord.from_attrs(study.user_attrs, study.study_name)
    name = clean(study.study_name)
    confirmed_trials: dict[int, str] = {}
    d = manifest.decision if manifest else None
    if isinstance(d, DecisionRecord):
        for lab, st in d.per_config.items():
            number = _trial_of(study, lab)
            if number is not None and st.replicates:
                missed = sum(1 for c in st.capacities if c is not None and c <= 0)
                confirmed_trials[number] = (
                    f"confirmed, missed the SLA in {missed} of {st.replicates} replicates"
                    if missed
                    else f"confirmed, {st.replicates} replicates"
                )
    launches = _search_launches(study, study_dir, constraints, confidence, confirmed_trials)
    base = next((x.params for x in launches if x.role == "baseline"), {})
    conf = manifest.measurements.confirmation if manifest and manifest.measurements else None
    if conf and conf.replicates:
        launches += _replicate_launches(study_dir, conf.replicates, base, constraints, confidence)
    else:
        launches += _unrecorded_replicates(study_dir, base, constraints, confidence)
    plan = _plan(study_dir)
    tuner = _tuner(study_dir)
    state = _state(launches, manifest, study, tuner)
    held = [x for x in launches if x.number is not None and x.capacity and x.capacity.low > 0]
    best = max(held, key=lambda x: x.capacity.value if x.capacity else 0.0, default=None)
    promoted = _promoted(manifest, base) if manifest is not None else None
    shown = manifest.promoted.trial if manifest and manifest.promoted else None
    if shown is None and best is not None:
        shown = best.number
    missing = []
    if unreadable:
        missing.append(unreadable)
    if manifest is None or manifest.promoted is None:
        missing.append("no promoted config: no parameters to compare, no command to serve")
    if sla is None:
        missing.append("sla.yaml could not be read: limits come from the manifest, if any")
    notes = []
    if tuner is not None and state != "running":
        notes.append(
            f"a tuner works on this study now ({tuner}): this page shows what it had recorded"
        )
    if tuner is None and any(x.status == "running" for x in launches):
        notes.append(
            "launches marked running were in progress when this page was written, or their "
            "tuner stopped without ending them (a later tune fails and re-runs them)"
        )
    pending = [x for x in launches if x.basis == _UNDECIDED]
    if pending:
        notes.append(
            f"{len(pending)} confirmation launches finished but no decision records them: the "
            "confirmation was interrupted or is still running; they are in the launch table, "
            "not in a comparison"
        )
    confirm_dir = study_dir / "confirm"
    unfinished = sorted(
        clean(d.name)
        for d in (confirm_dir.iterdir() if confirm_dir.is_dir() else ())
        if d.is_dir() and not (d / "trial.json").is_file()
    )
    if unfinished:
        notes.append(
            "confirmation launches without a result (interrupted, or still running): "
            + ", ".join(unfinished)
        )
    return Page(
        name=name,
        state=state,
        headline=clean(_headline(state, manifest, launches, best, tuner)),
        rests_on=_rests_on(
            manifest,
            launches,
            plan,
            str((record.identity or {}).get("target", "")).startswith("cpu"),
        ),
        decision_reason=clean(d.reason) if d is not None else None,
        identity={
            clean(k): clean(_identity_text(k, v)) for k, v in (record.identity or {}).items()
        },
        objectives=[
            f"{dr.name.lower()} {clean(m)}"
            for dr, m in zip(study.directions, record.objectives, strict=False)
        ],
        constraints=[(clean(c.key), c.limit) for c in constraints],
        promoted=promoted,
        launches=launches,
        confirmation=_confirmation(manifest, plan),
        pareto=_pareto(study, record.objectives, manifest, name),
        latency=_bundle_latency(bundle, promoted is not None)
        or _latency(study, study_dir, shown, name, promoted is not None, constraints),
        missing=missing,
        notes=notes,
        hardware=_hardware(manifest),
        files=_bundle_files(bundle) if manifest is not None and manifest.promoted else [],
    )


def _trial_of(study: optuna.Study, label: str) -> int | None:
    if label == "baseline":
        return next((t.number for t in study.trials if TrialRecord.from_trial(t).baseline), None)
    m = re.fullmatch(r"trial-(\d+)", label)
    return int(m[1]) if m else None


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=lambda v: clean(v) if isinstance(v, str) and not isinstance(v, Markup) else v,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["dur"] = _dur
    env.filters["pct"] = _fmt_pct
    env.filters["params"] = lambda p: ", ".join(f"{k}={v}" for k, v in p.items()) or "-"
    return env


def _num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.{digits}g}"


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


def render(page: Page) -> str:
    """The page as one HTML document."""
    return _environment().get_template("report.html.j2").render(page=page)


def write(study: optuna.Study, study_dir: Path, out: Path, bundle: Path | None = None) -> Path:
    """Build and write the page to ``out``; returns ``out``."""
    out.write_text(render(build(study, study_dir, bundle)), encoding="utf-8")
    return out


__all__ = ["Launch", "Page", "build", "clean", "render", "write"]
