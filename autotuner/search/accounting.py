"""GPU-minutes spent to a decision: devices x wall seconds of every launch, by phase.

Each launch records its own (``gpu_seconds`` in ``trial.json`` and the trial's user
attributes: engine start, the levels' warm-up requests, the measured levels, stopping the
engine; :func:`autotuner.search.trial.gpu_seconds`). A study's account adds the search's
launches that count (since a re-tune began; raced-out candidates included, reused results
not) and the confirmation replicates' launches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import optuna

from autotuner.records.base import RecordError
from autotuner.records.manifest import GpuAccount
from autotuner.records.trial import TrialFile, TrialRecord
from autotuner.search.study import counted, fresh_from

_PHASES = ("engine_start", "warmup", "levels", "stop")


def _add(total: dict[str, float], phases: Mapping[str, float]) -> None:
    for k, v in phases.items():
        total[k] = total.get(k, 0.0) + v


def account(
    study: optuna.Study, study_dir: Path, confirmation_dirs: Iterable[str] = ()
) -> GpuAccount:
    """The GPU-minutes of the study's counted launches and of the confirmation launches in
    ``confirmation_dirs`` (run directories relative to ``study_dir``, each once)."""
    since = fresh_from(study)
    search: dict[str, float] = {}
    confirm: dict[str, float] = {}
    launches = untimed = 0
    for t in study.get_trials(deepcopy=False):
        if t.number < since or not counted(t):
            continue
        launches += 1
        spent = TrialRecord.from_trial(t).gpu_seconds
        untimed += not spent
        _add(search, spent)
    for rel in dict.fromkeys(confirmation_dirs):
        launches += 1
        try:
            spent = TrialFile.read(study_dir / rel / "trial.json").gpu_seconds
        except (OSError, RecordError):
            spent = {}
        untimed += not spent
        _add(confirm, spent)
    by_phase: dict[str, float] = {}
    _add(by_phase, search)
    _add(by_phase, confirm)
    order = [k for k in _PHASES if k in by_phase] + sorted(set(by_phase) - set(_PHASES))
    return GpuAccount(
        search=round(sum(search.values()) / 60, 2),
        confirmation=round(sum(confirm.values()) / 60, 2),
        total=round(sum(by_phase.values()) / 60, 2),
        by_phase={k: round(by_phase[k] / 60, 2) for k in order},
        launches=launches,
        untimed=untimed,
    )
