"""The study page's charts (:mod:`autotuner.bundle.page`): the Pareto chart of the search and
the latency breakdown of the promoted config (drawn by :mod:`autotuner.bundle.report`),
inline SVG.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import optuna
from markupsafe import Markup
from optuna.trial import TrialState

from autotuner.bundle import report
from autotuner.bundle.figures import CONFIRMED_METRICS, Figures
from autotuner.bundle.latency_chart import launch_profile
from autotuner.bundle.page_model import clean, clean_params
from autotuner.bundle.page_records import trial_file
from autotuner.records.manifest import Manifest
from autotuner.records.trial import TrialRecord
from autotuner.search.launched import candidates
from autotuner.search.pareto import pareto_front
from autotuner.sla.spec import Constraint


def pareto_figure(
    study: optuna.Study, objectives: Sequence[str], manifest: Manifest | None, name: str
) -> Markup | None:
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
            params=clean_params(c.params),
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


def bundle_latency_figure(bundle: Path, promoted: bool) -> Markup | None:
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


def latency_figure(
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
            prof = launch_profile(
                trial_file(study_dir, r.result_file), clean(f"{what} (trial {t.number})")
            )
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
