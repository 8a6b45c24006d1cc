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

from autotuner.search import placement
from autotuner.search.study import ROLE, feasible


def _status(t: FrozenTrial) -> str:
    if "duplicate_of" in t.user_attrs:
        return f"same as {t.user_attrs['duplicate_of']}"
    if t.state == TrialState.COMPLETE:
        return "meets SLA" if feasible(t) else "misses SLA"
    if t.state == TrialState.PRUNED:
        return "pruned"
    if t.state == TrialState.FAIL:
        if t.user_attrs.get("interrupted"):
            return "interrupted"
        return f"failed ({t.user_attrs.get('cause', '?')})"
    return t.state.name.lower()


def _num(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def render(study: optuna.Study, study_dir: Path) -> str:
    lines = [f"study {study.study_name} ({study_dir})"]
    ident = study.user_attrs.get("identity", {})
    if ident:
        lines.append(
            f"engine {ident.get('engine')}, target {ident.get('target')}, "
            f"space {ident.get('space')}"
        )
    objs = study.user_attrs.get("objectives", [])
    pairs = zip(study.directions, objs, strict=False)
    lines.append("objectives: " + ", ".join(f"{d.name.lower()} {m}" for d, m in pairs))
    lines.append("")
    lines.append(
        f"{'#':>3}  {'role':<9} {'status':<18} {'goodput':>8} {'max load':>8} "
        f"{'p99 TTFT':>9} {'p99 TPOT':>9}  params / reason"
    )
    fixed = set()
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(ROLE) == "baseline":
            fixed = set(t.user_attrs.get("params_full", {}))
    for t in study.get_trials(deepcopy=False):
        m = t.user_attrs.get("metrics", {})
        params = {
            k: v for k, v in t.user_attrs.get("params_full", t.params).items() if k not in fixed
        }
        note = json.dumps(params) if params else "engine defaults"
        if t.user_attrs.get("reason") and not feasible(t):
            note += f" -- {t.user_attrs['reason']}"
        lines.append(
            f"{t.number:>3}  {t.user_attrs.get(ROLE, '-'):<9} {_status(t):<18} "
            f"{_num(m.get('goodput')):>8} {_num(t.user_attrs.get('max_load')):>8} "
            f"{_num(m.get('p99_ttft_ms'), 0):>9} {_num(m.get('p99_tpot_ms'), 1):>9}  {note}"
        )
    promotion = study.user_attrs.get("promotion")
    lines.append("")
    manifest = study_dir / "promoted" / "optimization_manifest.json"
    if promotion:
        lines.append(
            f"promoted: {promotion['promoted']} (trial {promotion['trial']}) at {promotion['time']}"
        )
        lines.append(f"why: {promotion['reason']}")
        if manifest.exists():
            data = json.loads(manifest.read_text())
            lines.append(f"pareto front (ranked): {data.get('pareto_front')}")
            lines.append(f"tuned params: {json.dumps(data['promoted']['tuned_params'])}")
            lines.append(f"bundle: {manifest.parent}")
    else:
        lines.append("no promotion yet")
    placements = placement.load(study_dir)
    if any(p.node for p in placements):  # ran on Ray: where each launch went
        lines += ["", placement.render(placements)]
    return "\n".join(lines)
