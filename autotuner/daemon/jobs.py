"""What each job kind runs (an argv, never a shell line) and what its files say afterwards.

Layout under the state directory, per SLA ``S`` and engine environment ``E``:

    slas/S/source.yaml        the SLA as submitted
    slas/S/E.yaml             the SLA pinned to engine E (what jobs run)
    studies/S/E/S/            the Optuna study of S on E and its promoted bundle
    runs/S/job-N/             re-check and regression runs; every job's outcome.json
    logs/job-N.log            each job's output
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotuner.core import confined
from autotuner.core.paths import atomic_write_text, models_dir
from autotuner.daemon.store import SlaRow
from autotuner.engines import envs
from autotuner.records.base import RecordError
from autotuner.records.manifest import Manifest
from autotuner.records.promotion import Promotion
from autotuner.records.trial import TrialRecord
from autotuner.sla.spec import Sla, parse_sla, to_yaml


@dataclass(frozen=True)
class Layout:
    root: Path

    def sla_dir(self, sla: str) -> Path:
        return self.root / "slas" / sla

    def sla_file(self, sla: str, engine: str) -> Path:
        return self.sla_dir(sla) / f"{engine}.yaml"

    def trials_dir(self, sla: str, engine: str) -> Path:
        return self.root / "studies" / sla / engine

    def study_dir(self, sla: str, engine: str) -> Path:
        return self.trials_dir(sla, engine) / sla

    def bundle(self, sla: str, engine: str) -> Path:
        return self.study_dir(sla, engine) / "promoted"

    def run_dir(self, sla: str, job_id: int) -> Path:
        return self.root / "runs" / sla / f"job-{job_id}"

    def log(self, job_id: int) -> Path:
        return self.root / "logs" / f"job-{job_id}.log"

    def outcome(self, sla: str, job_id: int) -> Path:
        """The job's outcome file (``--outcome``): how its command ended."""
        return self.run_dir(sla, job_id) / "outcome.json"


def pinned_yaml(sla: Sla, engine: str) -> str:
    """The SLA with its engine set to the registered environment ``engine`` and every path
    absolute, so the job can run from any directory."""
    model = sla.model
    if model.path is not None:
        model = model.model_copy(update={"path": str(sla.resolve_path(model.path))})
    workload = sla.workload
    if workload.dataset is not None:
        workload = workload.model_copy(update={"dataset": str(sla.resolve_path(workload.dataset))})
    if workload.trace is not None:
        workload = workload.model_copy(update={"trace": str(sla.resolve_path(workload.trace))})
    eng = sla.engine.model_copy(update={"name": engine, "python": None})
    return to_yaml(sla.model_copy(update={"model": model, "workload": workload, "engine": eng}))


def pin(layout: Layout, row: SlaRow, engine: str) -> None:
    """Write the SLA pinned to ``engine`` unless it exists. It is made from the pinned file
    of the engine the SLA runs on, whose paths are absolute already (a spool file's
    relative paths were resolved against the spool when it was submitted)."""
    target = layout.sla_file(row.name, engine)
    if target.is_file():
        return
    current = layout.sla_file(row.name, row.engine)
    text = current.read_text() if current.is_file() else row.yaml
    atomic_write_text(target, pinned_yaml(parse_sla(text, row.name), engine))


def _me() -> list[str]:
    return [sys.executable, "-m", "autotuner"]


def job_env(base: Mapping[str, str], roots: Sequence[Path]) -> dict[str, str]:
    """A job's environment: the daemon's, with the model and data files its SLA names
    confined to ``roots`` when they are opened (autotuner.core.confined), engines picked by
    name only, and output unbuffered for its log."""
    env = dict(base)
    env.pop(envs.ENV_PYTHON_VAR, None)  # jobs pick engines by name, never by override
    env["PYTHONUNBUFFERED"] = "1"
    # The tuner's own generated models (`model: {synth: ...}`) are read from its home, which
    # no SLA names: nothing from outside is written there.
    env[confined.ROOTS_VAR] = confined.env_value([*roots, models_dir()])
    return env


def outcome_argv(layout: Layout, sla: str, job_id: int) -> list[str]:
    """What every job's command line ends with: where it writes how it ended."""
    return ["--outcome", str(layout.outcome(sla, job_id))]


def tune_argv(
    layout: Layout,
    sla: str,
    engine: str,
    extra_trials: int,
    executor: str = "local",
    ray_address: str | None = None,
) -> list[str]:
    argv = [
        *_me(),
        "tune",
        str(layout.sla_file(sla, engine)),
        "--trials-dir",
        str(layout.trials_dir(sla, engine)),
    ]
    if extra_trials > 0:
        # A re-tune (after a failed re-check, or asked for): it decides on what it measures
        # now, never on the study's earlier launches (stale numbers never clear an alert).
        argv += ["--extra-trials", str(extra_trials), "--fresh"]
    if executor == "ray":
        argv += ["--executor", "ray"]
        if ray_address:
            argv += ["--address", ray_address]
    return argv


def recheck_argv(
    layout: Layout, sla: str, engine: str, job_id: int, params: Mapping[str, Any]
) -> list[str]:
    run_dir = layout.run_dir(sla, job_id)
    argv = [*_me(), "bench", str(layout.sla_file(sla, engine))]
    for key, value in params.items():
        argv += ["--set", f"{key}={_cli_value(value)}"]
    return [*argv, "--output", str(run_dir / "result.json"), "--trials-dir", str(run_dir)]


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def regression_argv(
    layout: Layout,
    sla: str,
    old: str,
    new: str,
    job_id: int,
    replicates: int,
    min_effect: float,
) -> list[str]:
    return [
        *_me(),
        "compare-engines",
        str(layout.sla_file(sla, old)),
        "--bundle",
        str(layout.bundle(sla, old)),
        "--old",
        old,
        "--new",
        new,
        "--replicates",
        str(replicates),
        "--min-effect",
        str(min_effect),
        "--work-dir",
        str(layout.run_dir(sla, job_id)),
    ]


def promotion_from(layout: Layout, sla: str, engine: str, now: float) -> Promotion | None:
    """The promotion a finished tune left in its bundle, as the daemon records it."""
    bundle = layout.bundle(sla, engine)
    manifest = Manifest.read_or_none(bundle / "optimization_manifest.json")
    if manifest is None:
        return None
    return Promotion.from_manifest(manifest, engine=engine, bundle=str(bundle), time=now)


def study_summary(layout: Layout, sla: str, engine: str) -> dict[str, Any]:
    """Trials by state and the best of the study's feasible trials (read-only; empty if none
    yet): ``best_goodput`` is the highest goodput measured (req/s meeting every SLO),
    ``best_max_load`` the highest offered load sustained within the SLA (req/s, or concurrent
    requests for a concurrency SLA)."""
    empty: dict[str, Any] = {
        "engine": engine,
        "trials": {},
        "best_goodput": None,
        "best_max_load": None,
    }
    db = layout.study_dir(sla, engine) / "study.db"
    if not db.is_file():
        return empty
    import optuna

    from autotuner.search.storage import check_sqlite
    from autotuner.search.study import feasible

    try:  # a file that is not the study's own is never opened by Optuna (it adds its tables)
        check_sqlite(f"sqlite:///{db}")
        study = optuna.load_study(study_name=sla, storage=f"sqlite:///{db}")
    except Exception as exc:  # a missing or foreign study must not break the status page
        return {**empty, "error": str(exc)}
    trials: dict[str, int] = {}
    goodputs: list[float] = []
    loads: list[float] = []
    running = []
    for t in study.get_trials(deepcopy=False):
        trials[t.state.name] = trials.get(t.state.name, 0) + 1
        if t.state.name == "RUNNING":
            running.append({"number": t.number, "params": t.params})
        if t.state.name == "COMPLETE" and feasible(t):
            try:
                record = TrialRecord.from_trial(t)
            except RecordError as exc:  # e.g. a study of a newer autotuner: say so, go on
                return {**empty, "error": str(exc)}
            if (g := record.metrics.get("goodput")) is not None:
                goodputs.append(float(g))
            if record.max_load is not None:
                loads.append(float(record.max_load))
    return {
        "engine": engine,
        "trials": trials,
        "best_goodput": max(goodputs, default=None),
        "best_max_load": max(loads, default=None),
        "running": running,
    }
