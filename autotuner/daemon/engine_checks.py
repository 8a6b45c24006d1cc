"""The doctor's checks of each engine environment, as the daemon runs them: when an environment
is first seen (also at the daemon's first scan), when its version or interpreter changes, and
when it can no longer be probed (gone). ``status`` shows the latest report of each.

Reports live in ``<state>/engine-checks/<name>.json`` (:class:`DoctorReport`), so a restarted
daemon shows them without checking again; one whose environment is no longer registered is
deleted. Checking starts interpreters (torch takes seconds to import): call
:func:`check_engines` off the event loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotuner.doctor.run import diagnose, kind_of
from autotuner.engines import envs, registry
from autotuner.engines.envs import validate_name
from autotuner.records.base import RecordError
from autotuner.records.doctor import DoctorReport

logger = logging.getLogger(__name__)

FOLDER = "engine-checks"

Reports = dict[str, DoctorReport]
Check = Callable[[envs.EngineEnv | str, str], DoctorReport]


def _subject(env: envs.EngineEnv | str) -> str:
    if isinstance(env, str):
        return f"engine {env}"
    return f"engine {env.name} ({env.python})"


def _engine(env: envs.EngineEnv | str) -> str | None:
    return None if isinstance(env, str) else f"{env.distribution} {env.version}"


def _run_doctor(env: envs.EngineEnv | str, subject: str) -> DoctorReport:
    kind = kind_of(None, env)  # the environment's engine (an unknown name: the default's)
    adapter = registry.get(kind) if kind is not None else registry.default()
    return diagnose(None, subject=subject, adapter=adapter, engine=env)


def load(root: Path) -> Reports:
    """The reports a previous run of the daemon left (unreadable ones are skipped)."""
    out: Reports = {}
    for f in sorted((root / FOLDER).glob("*.json")):
        try:
            out[f.stem] = DoctorReport.read(f)
        except (OSError, RecordError) as exc:
            logger.warning("engine check %s unreadable (%s); it is checked again", f, exc)
    return out


def check_engines(
    root: Path,
    probed: Sequence[envs.EngineEnv | str],
    reports: Mapping[str, DoctorReport],
    check: Check = _run_doctor,
) -> tuple[Reports, list[DoctorReport]]:
    """Check each of ``probed`` (an entry, or the name of one that failed to probe) whose last
    report is missing or was of another version or interpreter. Returns every report now in
    force and the new ones."""
    now: Reports = {}
    fresh: list[DoctorReport] = []
    folder = root / FOLDER
    for env in probed:
        name = env if isinstance(env, str) else env.name
        try:
            validate_name(name)  # it names a file
        except envs.EngineEnvError:
            continue
        old = reports.get(name)
        subject = _subject(env)
        if old is not None and old.engine == _engine(env) and old.subject == subject:
            now[name] = old
            continue
        try:
            report = check(env, subject)
        except Exception as exc:  # one broken environment must not stop the others' checks
            logger.warning("engine check of %s failed: %r", name, exc)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        report.write(folder / f"{name}.json")
        now[name] = fresh_report = report
        fresh.append(fresh_report)
        level = logging.WARNING if report.exit_code else logging.INFO
        logger.log(level, "engine check of %s: %s", name, summary(report)["verdict"])
    for gone in set(reports) - set(now):
        with contextlib.suppress(FileNotFoundError):
            (folder / f"{gone}.json").unlink()
    return now, fresh


def summary(report: DoctorReport) -> dict[str, Any]:
    """What ``status`` shows of a report: the verdict, when, and the findings that are not ok."""
    problems = [f for f in report.findings if f.status != "ok"]
    verdict = {0: "ok", 1: "warnings", 2: "a launch would fail"}[report.exit_code]
    return {
        "engine": report.engine,
        "checked": report.checked,
        "exit_code": report.exit_code,
        "verdict": verdict,
        "problems": [f.model_dump() for f in problems],
    }
