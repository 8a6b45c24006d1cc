"""A resolved search space: its tuned parameters, fixed options and dropped ones; suggestion
into an Optuna trial, its distributions, its hash and its description."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING

from autotuner.core.show import show_value
from autotuner.space.conditions import Condition
from autotuner.space.strategy import Hopeless, Monotone, Prior
from autotuner.space.values import Device, ParamType, ParamValue

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class ParamSpec:
    """One tuned parameter in its effective form.

    ``choices`` set: a categorical search over them (ints, bools and strings alike); otherwise
    an int/float range ``[low, high]`` with optional ``log`` or ``step``. ``type`` is the
    value type declared in the file; ``default`` is the engine's (None: engine decides).
    """

    name: str
    type: ParamType
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: tuple[ParamValue, ...] | None = None
    default: ParamValue = None
    when: tuple[Condition, ...] = ()
    why: str = field(default="", compare=False)
    # Where to look first and what never to launch: search strategy, not the space itself
    # (left out of ``hash``, so a study keeps its identity when they change).
    prior: Prior | None = field(default=None, compare=False)
    hopeless: tuple[Hopeless, ...] = field(default=(), compare=False)
    monotone: tuple[Monotone, ...] = field(default=(), compare=False)

    def domain(self) -> str:
        if self.choices is not None:
            return "{" + ", ".join(show_value(c) for c in self.choices) + "}"
        extra = " log" if self.log else (f" step {show_value(self.step)}" if self.step else "")
        return f"[{show_value(self.low)}, {show_value(self.high)}]{extra}"


@dataclass(frozen=True)
class Dropped:
    """An option (``value`` unset) or one of its choices left out of the search, and why."""

    param: str
    reason: str
    value: ParamValue = None
    is_choice: bool = False


@dataclass(frozen=True, eq=False)
class SearchSpace:
    """A resolved search space; see the module docstring for the contract."""

    engine: str
    version: str
    device: Device
    params: list[ParamSpec]
    fixed: dict[str, ParamValue]
    dropped: list[Dropped] = field(default_factory=list)
    defaults: dict[str, ParamValue] = field(default_factory=dict)
    fixed_by: dict[str, str] = field(default_factory=dict)  # param -> "engine.params" | ...
    source: str = ""

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def value_of(self, name: str, suggested: Mapping[str, ParamValue]) -> ParamValue:
        """The effective value of ``name``: suggested, else fixed, else the declared default."""
        if name in suggested:
            return suggested[name]
        if name in self.fixed:
            return self.fixed[name]
        return self.defaults.get(name)

    def is_active(self, p: ParamSpec, suggested: Mapping[str, ParamValue]) -> bool:
        return all(c.holds(self.value_of(c.param, suggested)) for c in p.when)

    def suggest(
        self, trial: optuna.trial.BaseTrial, only: Collection[str] | None = None
    ) -> dict[str, ParamValue]:
        """Ask ``trial`` for every active tuned parameter (or only those in ``only``: the
        others are left to the engine); returns only the suggested ones."""
        values: dict[str, ParamValue] = {}
        for p in self.params:
            if (only is not None and p.name not in only) or not self.is_active(p, values):
                continue
            if p.choices is not None:
                values[p.name] = trial.suggest_categorical(p.name, list(p.choices))
            elif p.type == "int":
                assert p.low is not None and p.high is not None
                values[p.name] = trial.suggest_int(
                    p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log
                )
            else:
                assert p.low is not None and p.high is not None
                x = trial.suggest_float(p.name, float(p.low), float(p.high), step=p.step, log=p.log)
                # A stepped float comes back as 0.8500000000000001: pass the flag 0.85.
                values[p.name] = round(x, _decimals(p.step)) if p.step else x
        return values

    def candidate(self, suggested: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """What the engine gets: the fixed options, then the suggested ones."""
        return {**self.fixed, **suggested}

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """Optuna distributions of all tuned parameters (conditional ones included)."""
        from optuna.distributions import (
            BaseDistribution,
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        out: dict[str, BaseDistribution] = {}
        for p in self.params:
            if p.choices is not None:
                out[p.name] = CategoricalDistribution(list(p.choices))
            elif p.type == "int":
                assert p.low is not None and p.high is not None
                out[p.name] = IntDistribution(
                    int(p.low), int(p.high), log=p.log, step=int(p.step or 1)
                )
            else:
                assert p.low is not None and p.high is not None
                out[p.name] = FloatDistribution(float(p.low), float(p.high), log=p.log, step=p.step)
        return out

    def baseline(self) -> dict[str, ParamValue]:
        """The engine's defaults for this context: the fixed options and nothing tuned."""
        return dict(self.fixed)

    def hash(self) -> str:
        """sha256 of the effective space (tuned domains, conditions, fixed options).

        Notes and the engine version string are left out: the same space resolved for
        another patch release hashes the same, a changed range or pin does not.
        """
        payload = {
            "engine": self.engine,
            "device": self.device,
            "params": [
                {k: v for k, v in asdict(p).items() if k not in _NOT_HASHED} for p in self.params
            ],
            "fixed": self.fixed,
        }
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=repr)
        return hashlib.sha256(text.encode()).hexdigest()

    def describe(self) -> list[str]:
        """Human-readable lines: what is tuned, pinned and dropped, and why."""
        lines = [
            f"{self.engine} {self.version} on {self.device}: {len(self.params)} tuned, "
            f"{len(self.fixed)} fixed (space {self.hash()[:12]})"
        ]
        for p in self.params:
            cond = f" when {' and '.join(str(c) for c in p.when)}" if p.when else ""
            lines.append(f"  tune  {p.name}: {p.type} {p.domain()}{cond}")
        for name, value in self.fixed.items():
            by = self.fixed_by.get(name, "")
            lines.append(f"  fixed {name} = {show_value(value)}" + (f" ({by})" if by else ""))
        # Choices dropped for the same reason share a line: "tensor_parallel_size=2, 4, 8: ...".
        grouped: dict[tuple[str, str, bool], list[ParamValue]] = {}
        for d in self.dropped:
            grouped.setdefault((d.param, d.reason, d.is_choice), []).append(d.value)
        for (param, reason, is_choice), values in grouped.items():
            what = f"{param}={', '.join(show_value(v) for v in values)}" if is_choice else param
            lines.append(f"  drop  {what}: {reason}")
        return lines


# Search strategy, not the space itself (see ParamSpec).
_NOT_HASHED = frozenset({"why", "prior", "hopeless", "monotone"})


def _decimals(step: float) -> int:
    exponent = Decimal(str(step)).normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0
