"""What a promotion needs to know of its study, gathered once by the caller (the pipeline)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna

from autotuner.core.hardware import HardwareProfile
from autotuner.engines.base import EngineAdapter
from autotuner.sla.spec import Sla
from autotuner.space import SearchSpace


@dataclass(frozen=True)
class Context:
    """Everything provenance needs, gathered once by the caller."""

    sla: Sla
    study: optuna.Study
    study_dir: Path
    space: SearchSpace
    hardware: HardwareProfile
    model_dir: Path
    engine_version: str
    engine_python: Path
    storage: str
    engine: EngineAdapter  # the adapter of the engine kind the study tuned
