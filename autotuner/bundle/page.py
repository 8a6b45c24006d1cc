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

Built here from its parts: the study read into launch rows (page_records), its sentences
(page_words) and charts (page_charts), into the :class:`Page` the template shows
(page_model).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import jinja2
import optuna
from markupsafe import Markup

from autotuner.bundle.page_charts import bundle_latency_figure, latency_figure, pareto_figure
from autotuner.bundle.page_model import UNDECIDED, Launch, Page, clean
from autotuner.bundle.page_records import (
    constraints_of,
    read_manifest,
    read_plan,
    read_sla,
    replicate_launches,
    search_launches,
    unrecorded_replicates,
)
from autotuner.bundle.page_words import (
    confirmation_of,
    fmt_pct,
    headline,
    identity_text,
    promoted_summary,
    rests_on,
    state_of,
    tuner_of,
)
from autotuner.records.manifest import DecisionRecord, Manifest
from autotuner.records.trial import StudyRecord, TrialRecord

_TEMPLATES = Path(__file__).resolve().parent / "templates"


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
    manifest, unreadable = read_manifest(bundle, study_dir)
    sla = read_sla(study_dir)
    constraints = constraints_of(sla, manifest)
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
    launches = search_launches(study, study_dir, constraints, confidence, confirmed_trials)
    base = next((x.params for x in launches if x.role == "baseline"), {})
    conf = manifest.measurements.confirmation if manifest and manifest.measurements else None
    if conf and conf.replicates:
        launches += replicate_launches(study_dir, conf.replicates, base, constraints, confidence)
    else:
        launches += unrecorded_replicates(study_dir, base, constraints, confidence)
    plan = read_plan(study_dir)
    tuner = tuner_of(study_dir)
    state = state_of(launches, manifest, study, tuner)
    held = [x for x in launches if x.number is not None and x.capacity and x.capacity.low > 0]
    best = max(held, key=lambda x: x.capacity.value if x.capacity else 0.0, default=None)
    promoted = promoted_summary(manifest, base) if manifest is not None else None
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
    pending = [x for x in launches if x.basis == UNDECIDED]
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
        headline=clean(headline(state, manifest, launches, best, tuner)),
        rests_on=rests_on(
            manifest,
            launches,
            plan,
            str((record.identity or {}).get("target", "")).startswith("cpu"),
        ),
        decision_reason=clean(d.reason) if d is not None else None,
        identity={clean(k): clean(identity_text(k, v)) for k, v in (record.identity or {}).items()},
        objectives=[
            f"{dr.name.lower()} {clean(m)}"
            for dr, m in zip(study.directions, record.objectives, strict=False)
        ],
        constraints=[(clean(c.key), c.limit) for c in constraints],
        promoted=promoted,
        launches=launches,
        confirmation=confirmation_of(manifest, plan),
        pareto=pareto_figure(study, record.objectives, manifest, name),
        latency=bundle_latency_figure(bundle, promoted is not None)
        or latency_figure(study, study_dir, shown, name, promoted is not None, constraints),
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
    env.filters["pct"] = fmt_pct
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
