"""Which configs a study never launches: those the rules, the memory model or the SLA's
memory limit refuse, and those near a config that crashed (the crash memory)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner.core.hardware import HardwareProfile
from autotuner.core.types import ParamValue
from autotuner.engines.base import EngineAdapter
from autotuner.records.trial import TrialRecord
from autotuner.search import rules
from autotuner.search.layout_plan import memory_limit_reason
from autotuner.sla.spec import Sla
from autotuner.space import SearchSpace


def crash_memory(
    study: optuna.Study, space: SearchSpace, engine: EngineAdapter
) -> rules.CrashMemory:
    """Rebuild what earlier launches taught: configs that crashed, with their cause."""
    defaults = {k: v for k, v in space.defaults.items() if v is not None}
    memory = rules.CrashMemory(defaults={**defaults, **space.fixed}, traits=engine.crash_traits)
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        r = TrialRecord.from_trial(t)
        if r.cause:
            memory.record(r.params_or({}), r.cause, label=f"trial {t.number}")
    return memory


@dataclass(frozen=True)
class Pruning:
    sla: Sla
    adapter: EngineAdapter
    hw: HardwareProfile
    model_cfg: dict[str, Any]
    memory: rules.CrashMemory

    @property
    def memory_limit(self) -> float | None:
        """The SLA's ``peak_memory_gib`` limit, if it sets one."""
        return next((c.limit for c in self.sla.constraints if c.metric == "peak_memory_gib"), None)

    def why(self, params: dict[str, ParamValue]) -> str | None:
        """Why ``params`` is not launched (reasons joined by '; '), or None."""
        reasons = rules.check(
            params,
            model_cfg=self.model_cfg,
            hardware=self.hw,
            context_len=None,
            env=self.sla.engine.env,
            engine=self.adapter,
        )
        over = self.over_memory(params)
        if over:
            reasons.append(over)
        return "; ".join(reasons) if reasons else self.memory.near_crash(params)

    def over_memory(self, params: Mapping[str, ParamValue]) -> str | None:
        """Why ``params`` would break the SLA's memory limit before any load, or None."""
        return memory_limit_reason(params, self.hw, self.memory_limit, self.adapter)

    def crashed(self, params: dict[str, ParamValue], cause: str) -> None:
        self.memory.record(params, cause)
