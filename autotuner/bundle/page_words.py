"""The study page's sentences (:mod:`autotuner.bundle.page`): its state and headline, what
the decision rests on, the promoted config against the baseline, the confirmation's
comparisons.
"""

from __future__ import annotations

import math
import os
import shlex
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner.bundle.page_model import Launch, Replicates, clean
from autotuner.records.base import RecordError
from autotuner.records.confirm import ConfirmPlanFile
from autotuner.records.manifest import DecisionRecord, Manifest, NoDecision
from autotuner.records.owner import StudyLockFile
from autotuner.search.lock import LOCK_NAME, owner_state


def fmt_pct(v: float | None) -> str:
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


def tuner_of(study_dir: Path) -> str | None:
    """Who tunes the study now, from its lock file (None: no tuner alive on this host, or
    this process: tune writing the page into its bundle)."""
    try:
        lock = StudyLockFile.read_or_none(study_dir / LOCK_NAME)
    except (RecordError, OSError):
        return None
    if lock is None or (lock.owner.pid == os.getpid() and lock.owner.host == socket.gethostname()):
        return None
    return clean(lock.owner.describe()) if owner_state(lock.owner) == "alive" else None


def state_of(
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
            span = f" [{fmt_pct(cmp['low'])}, {fmt_pct(cmp['high'])}]"
        conf = f" at {cmp['confidence'] * 100:.0f} %" if cmp["confidence"] else ""
        out += (
            f" {clean(label)} against it: {fmt_pct(cmp['effect'])}{span}{conf} from "
            f"{cmp['pairs']} pair{'' if cmp['pairs'] == 1 else 's'} ({cmp['verdict']})."
        )
    return out


def headline(
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
                span = f" [{fmt_pct(d.effect_low)}, {fmt_pct(d.effect_high)}]"
            conf = f" at {d.confidence * 100:.0f} % confidence" if d.confidence else ""
            sentence = (
                f"Serve trial {p.trial}: it holds {fmt_pct(d.effect)}{span} more "
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


def identity_text(key: str, value: object) -> str:
    """An identity value as a reader says it: the target's key ``cpu:`` / ``gpu:0,1`` (kind
    and devices, as studies are matched by) reads ``cpu`` / ``gpu 0,1``."""
    text = str(value)
    if key == "target":
        kind, _, devices = text.partition(":")
        return f"{kind} {devices}".strip()
    return text


def rests_on(
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


def promoted_summary(manifest: Manifest, base: Mapping[str, Any]) -> dict[str, Any] | None:
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


def confirmation_of(manifest: Manifest | None, plan: ConfirmPlanFile | None) -> Replicates | None:
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
