"""What a study did — trials, Pareto front, promoted config, why — as text (printed by
`autotuner report STUDY`, :mod:`autotuner.cli.report`).

Reads only the study's storage and its directory; starts nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotuner.bundle.cache_report import cache_lines
from autotuner.bundle.conditions import condition_lines
from autotuner.core.errors import AutotunerError
from autotuner.engines.base import OptionRoles
from autotuner.engines.layout import devices_used
from autotuner.records.manifest import DecisionRecord, Manifest, NoDecision
from autotuner.records.trial import StudyRecord, TrialRecord
from autotuner.search import placement
from autotuner.search.accounting import account
from autotuner.search.progress import defaults_line
from autotuner.search.study import feasible, raced_out


def _status(t: FrozenTrial, r: TrialRecord) -> str:
    if r.duplicate:
        return f"same as {r.duplicate_of}"
    if t.state == TrialState.COMPLETE:
        return "meets SLA" if feasible(t) else "misses SLA"
    if t.state == TrialState.PRUNED:
        return "pruned (raced)" if raced_out(t) else "pruned"
    if t.state == TrialState.FAIL:
        if r.interrupted:
            return "interrupted"
        return f"failed ({r.cause if 'cause' in r.model_fields_set else '?'})"
    return t.state.name.lower()


def _num(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def render(study: optuna.Study, study_dir: Path, roles: OptionRoles) -> str:
    """The study as text; ``roles`` are the option roles of the engine it tuned (they name
    the layout's options in each trial's params, for capacity per GPU)."""
    lines = [f"study {study.study_name} ({study_dir})"]
    s = StudyRecord.from_attrs(study.user_attrs, study.study_name)
    ident = s.identity or {}
    if ident:
        lines.append(
            f"engine {ident.get('engine')}, target {target_text(ident.get('target'))}, "
            f"space {ident.get('space')}"
        )
    # A CPU target has no GPUs: its layout's devices are engine ranks.
    unit = "rank" if str(ident.get("target", "")).startswith("cpu") else "GPU"
    ttft, tpot = sla_percentiles(study_dir)
    objs = s.objectives
    pairs = zip(study.directions, objs, strict=False)
    lines.append("objectives: " + ", ".join(f"{d.name.lower()} {m}" for d, m in pairs))
    lines.append("")
    lines.append(
        f"{'#':>3}  {'role':<9} {'status':<18} {'capacity':>8} {'bracket':>13} "
        f"{'per ' + unit:>8} {'goodput':>8} "
        f"{_pct(ttft) + ' TTFT':>9} {_pct(tpot) + ' TPOT':>9}  params / reason"
    )
    trials = [(t, TrialRecord.from_trial(t)) for t in study.get_trials(deepcopy=False)]
    fixed: set[str] = set()
    for _, r in trials:
        if r.baseline:
            fixed = set(r.params_or({}))
    conditions, busy = condition_lines(((t.number, r) for t, r in trials), study_dir)
    for t, r in trials:
        m = r.metrics
        params = {k: v for k, v in r.params_or(t.params).items() if k not in fixed}
        note = json.dumps(params) if params else "engine defaults"
        if t.state == TrialState.RUNNING and not r.baseline and not params:
            note = "config not chosen yet"  # a candidate still being suggested: not the defaults
        if r.interrupted and not r.baseline and not params:
            note = "interrupted before its config was chosen"  # not the defaults either
        if t.state == TrialState.WAITING and (queued := r.queued_note()):
            note = queued
        if r.reason and not feasible(t):
            note += f" -- {r.reason}"
        if t.number in busy:
            note += " [busy host]"
        cap = r.capacity.value if r.capacity else r.max_load
        # Capacity over the GPUs of the config's layout (tensor x pipeline x data parallel).
        per_gpu = None if cap is None else cap / devices_used(r.params_or(t.params), roles)
        lines.append(
            f"{t.number:>3}  {r.role or '-':<9} {_status(t, r):<18} "
            f"{_num(cap):>8} {_bracket(t, r):>13} {_num(per_gpu):>8} {_num(m.get('goodput')):>8} "
            f"{_num(m.get(ttft), 0):>9} {_num(m.get(tpot), 1):>9}  {note}"
        )
    lines.append(
        f"capacity: the highest load meeting the SLA, per {unit} of its layout, goodput at "
        "capacity (single runs of the search); latencies at the SLA's own load, at the "
        "percentiles the SLA limits"
    )
    lines += [
        f"below the SLA's load: trial {t.number} {r.capacity.sustainable.describe()}"
        for t, r in trials
        if r.capacity is not None and r.capacity.sustainable is not None
    ]
    if said := defaults_line(study, _resolution(study_dir)):
        lines.append(f"search: {said}")
    if raced := sum(raced_out(t) for t, _ in trials):
        lines.append(
            f"racing: {raced} candidate(s) missed the SLA at the incumbent's capacity and were "
            "pruned after that level (no capacity, only the level)"
        )
    lines.append(f"cost: {_gpu_line(study, study_dir)}")
    lines += cache_lines(((t.number, r) for t, r in trials), study_dir)
    lines += conditions
    if busy:
        lines.append(
            f"busy host: trial(s) {', '.join(map(str, sorted(busy)))} were measured while other "
            "processes used the cores: their figures follow that load, not only the config"
        )
    promotion = s.promotion
    lines.append("")
    manifest = study_dir / "promoted" / "optimization_manifest.json"
    if promotion:
        lines.append(
            f"promoted: {promotion.promoted} (trial {promotion.trial}) at {promotion.time}"
        )
        lines.append(f"why: {promotion.reason}")
        if manifest.exists():
            data = Manifest.read(manifest)
            tuned = data.promoted.tuned_params if data.promoted else {}
            lines += _confirmation(data)
            if data.lossy_tier is not None:
                lines.append(f"lossy tier: {data.lossy_tier.why}")
            lines.append(f"pareto front (ranked): {data.pareto_front}")
            lines.append(f"tuned params: {json.dumps(tuned)}")
            lines.append(f"bundle: {manifest.parent}")
    else:
        lines.append(_no_promotion(study_dir))
    placements = placement.load(study_dir, roles)
    if any(p.node for p in placements):  # ran on Ray: where each launch went
        lines += ["", placement.render(placements)]
    return "\n".join(lines)


def _no_promotion(study_dir: Path) -> str:
    """Why nothing was promoted (``no_promotion.json``), or that no decision was made yet."""
    path = study_dir / "no_promotion.json"
    if not path.exists():
        return "no promotion yet"
    try:
        decision = Manifest.read(path).decision
    except (OSError, AutotunerError, ValueError):
        return "no promotion yet"
    if isinstance(decision, NoDecision):
        return f"no promotion: {decision.reason}"
    return "no promotion yet"


def target_text(target: object) -> str:
    """A study identity's target as a reader says it: ``cpu`` (not ``cpu:``), ``gpu 0,1``."""
    kind, _, devices = str(target or "-").partition(":")
    return f"{kind} {devices}" if devices else kind


def sla_percentiles(study_dir: Path) -> tuple[str, str]:
    """The TTFT and TPOT metrics the study's SLA limits (``p90_ttft_ms`` for a p90 limit);
    the p99 where it limits neither (or has no readable ``sla.yaml``)."""
    ttft, tpot = "p99_ttft_ms", "p99_tpot_ms"
    try:
        from autotuner.sla.spec import load_sla

        constraints = load_sla(study_dir / "sla.yaml").constraints
    except (AutotunerError, OSError, ValueError):
        return ttft, tpot
    metrics = [c.metric for c in constraints]
    ttft = next((m for m in metrics if m.endswith("_ttft_ms")), ttft)
    tpot = next((m for m in metrics if m.endswith("_tpot_ms")), tpot)
    return ttft, tpot


def _pct(metric: str) -> str:
    """``p90_ttft_ms`` -> ``p90``; ``mean_ttft_ms`` -> ``mean``."""
    return metric.split("_", 1)[0]


def _gpu_line(study: optuna.Study, study_dir: Path) -> str:
    """GPU-minutes to the decision from the manifest; before one, the search's so far."""
    for name in ("promoted/optimization_manifest.json", "no_promotion.json"):
        path = study_dir / name
        if path.exists():
            try:
                spent = Manifest.read(path).gpu_minutes
            except (OSError, AutotunerError, ValueError):
                spent = None
            if spent is not None:
                return spent.describe()
    return account(study, study_dir).describe().replace("to the decision", "so far (search)")


def _resolution(study_dir: Path) -> float:
    """The study's ``tune.capacity_resolution`` from its ``sla.yaml`` (3 % without one)."""
    try:
        from autotuner.sla.spec import load_sla

        return float(getattr(load_sla(study_dir / "sla.yaml").tune, "capacity_resolution", 0.03))
    except (AutotunerError, OSError, ValueError):
        return 0.03


def _bracket(t: FrozenTrial, r: TrialRecord) -> str:
    """The capacity's bracket, ``low-high`` (``>=low`` when nothing above it missed); for a
    candidate raced out, the level it missed (the incumbent's capacity): ``missed 4.2``."""
    if raced_out(t) and r.race_level is not None:
        return f"missed {r.race_level:.3g}"
    cap = r.capacity
    if cap is None or cap.stopped_by == "legacy":
        return "-"
    if cap.low <= 0:
        held = cap.sustainable
        return f"holds {held.value:.3g}" if held and held.value > 0 else cap.stopped_by
    if cap.high is None:
        return f">={cap.low:.3g}"
    return f"{cap.low:.3g}-{cap.high:.3g}"


def _confirmation(m: Manifest) -> list[str]:
    """What confirmation measured (confirmed figures), or that it spent nothing."""
    d = m.decision
    if not isinstance(d, DecisionRecord) or d.basis not in ("capacity", "sla"):
        return []
    if not d.confirmed:
        return ["confirmation: none run (no launch spent); every figure above is a single run"]
    out = []
    conf = m.measurements.confirmation if m.measurements else None
    unit = f" {conf.load_unit}" if conf and conf.load_unit else ""
    for name, st in d.per_config.items():
        caps = ", ".join("-" if c is None else f"{c:.3g}" for c in st.capacities)
        # A replicate that missed the SLA (capacity 0) is a miss, not a capacity to average.
        held = [c for c in st.capacities if c is not None and c > 0]
        missed = sum(1 for c in st.capacities if c is not None and c <= 0)
        mean = f"{sum(held) / len(held):.3g}" if held else "-"
        if not missed:
            said = f"{mean}{unit} (mean of {st.replicates} replicates: {caps})"
        elif not held:
            said = f"none: missed the SLA in all {missed} replicates ({caps})"
        else:
            said = (
                f"{mean}{unit} where it met the SLA (mean of {len(held)} of "
                f"{len(held) + missed} replicates; missed it in {missed}: {caps})"
            )
        out.append(f"confirmed capacity of {name}: {said}")
    if d.effect is not None and d.effect_low is not None and d.effect_high is not None:
        out.append(
            f"effect: {d.effect:+.1%} [{d.effect_low:+.1%}, {d.effect_high:+.1%}] at "
            f"{d.confidence or 0.95:.0%} ({(d.verdict or '?').replace('_', ' ')})"
        )
    return out
