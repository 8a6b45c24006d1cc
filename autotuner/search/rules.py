"""Pruning before launch: an engine's own rules, and a memory of the launches that crashed.

``check(params, model_cfg=, hardware=, context_len=, engine=)`` returns human-readable reasons
(empty: launch it). ``params`` are the engine options the launch would get (snake_case; missing
options take the engine's defaults). The rules themselves are the engine adapter's
(:meth:`~autotuner.engines.base.EngineAdapter.check`): what an option means, and which
combinations an engine refuses, is engine knowledge.

:class:`CrashMemory` remembers configs that crashed at launch; ``near_crash(params)`` names the
crash a new candidate is at least as memory-hungry as (see its docstring), so a config that
ran out of memory is not tried again in its neighbourhood. Which options size memory comes from
the adapter's :class:`~autotuner.engines.base.CrashTraits`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotuner.core.hardware import HardwareProfile
from autotuner.engines.base import CrashTraits, EngineAdapter, LaunchCause
from autotuner.engines.memory import parse_token_count

__all__ = [
    "Crash",
    "CrashMemory",
    "check",
]

Params = Mapping[str, Any]


def check(
    params: Params,
    *,
    model_cfg: Mapping[str, Any],
    hardware: HardwareProfile,
    context_len: int | None,
    env: Mapping[str, str] | None = None,
    engine: EngineAdapter,
) -> list[str]:
    """Reasons ``params`` must not be launched on ``hardware`` (empty: fine).

    ``context_len`` None: the context length ``params`` sets (the engine's context-length
    option), else the model config's. ``env`` is the engine's environment. ``engine``: the
    adapter whose rules apply.
    """
    return engine.check(
        params, model_cfg=model_cfg, hardware=hardware, context_len=context_len, env=env
    )


# --------------------------------------------------------------------------- crash memory


@dataclass(frozen=True)
class Crash:
    """A launch that failed: its options, the classified cause and a short detail."""

    params: dict[str, Any]
    cause: str
    detail: str = ""
    label: str = ""  # e.g. "trial 12"
    traits: CrashTraits | None = None  # the engine's; None: never KV-starved

    @property
    def out_of_memory(self) -> bool:
        return self.cause == LaunchCause.OUT_OF_MEMORY.value

    @property
    def kv_starved(self) -> bool:
        return self.traits is not None and bool(self.traits.kv_starved.search(self.detail))


@dataclass
class CrashMemory:
    """Configs that crashed at launch, and which new candidates look just as doomed.

    A candidate is *near* an out-of-memory crash when every option that is neither a memory
    knob (``traits.memory_params``) nor memory-neutral has the same value (missing options take
    ``defaults``, else stay unknown and must be missing on both sides), and every memory knob
    is at least the crashed value. Exception: when the crash was the KV cache being too small
    for one sequence, raising the options that size the KV cache (vLLM:
    ``gpu_memory_utilization`` / ``kv_cache_memory_bytes``) is what would help, so for those
    (``traits.budget_params``) the candidate is near only at or *below* the crashed value.
    Crashes of other causes are remembered but never block anything. ``traits`` are the
    engine adapter's.
    """

    traits: CrashTraits
    defaults: Mapping[str, Any] = field(default_factory=dict)
    crashes: list[Crash] = field(default_factory=list)

    def record(
        self, params: Mapping[str, Any], cause: LaunchCause | str, detail: str = "", label: str = ""
    ) -> Crash:
        crash = Crash(dict(params), str(getattr(cause, "value", cause)), detail, label, self.traits)
        self.crashes.append(crash)
        return crash

    def _value(self, params: Mapping[str, Any], name: str) -> Any:
        return params.get(name, self.defaults.get(name))

    def _near(self, crash: Crash, params: Mapping[str, Any]) -> list[str] | None:
        """The memory knobs that are >= the crash's, or None when not in its neighbourhood."""
        names = set(crash.params) | set(params)
        shown: list[str] = []
        for name in sorted(names - self.traits.neutral_params):
            mine, theirs = self._value(params, name), self._value(crash.params, name)
            if name not in self.traits.memory_params:
                if type(mine) is not type(theirs) or mine != theirs:
                    return None
                continue
            a, b = _number(mine), _number(theirs)
            if a is None or b is None:
                if mine is None and theirs is None:
                    continue
                return None
            lower_is_worse = crash.kv_starved and name in self.traits.budget_params
            if (a > b) if lower_is_worse else (a < b):
                return None
            shown.append(f"{name} {mine} {'<=' if lower_is_worse else '>='} {theirs}")
        return shown

    def near_crash(self, params: Mapping[str, Any]) -> str | None:
        """Why ``params`` is expected to run out of memory like a recorded crash, or None."""
        for crash in self.crashes:
            if not crash.out_of_memory:
                continue
            shown = self._near(crash, params)
            if shown is not None:
                who = f" ({crash.label})" if crash.label else ""
                knobs = f": {', '.join(shown)}" if shown else " (same config)"
                return f"near a config that ran out of memory at launch{who}{knobs}"
        return None


def _number(v: Any) -> float | None:
    """A memory knob's value as a number (``"8k"`` token counts included); None if not one."""
    if isinstance(v, float):
        return v
    n = parse_token_count(v)
    return None if n is None else float(n)
