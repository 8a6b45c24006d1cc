"""A condition on another parameter's value (``when:`` and ``hopeless_when: with:``)."""

from __future__ import annotations

from dataclasses import dataclass

from autotuner.core.show import show_value
from autotuner.space.values import ParamValue, _member


@dataclass(frozen=True)
class Condition:
    """Active when ``param``'s value is in ``values`` (not in them when ``negate``)."""

    param: str
    values: tuple[ParamValue, ...]
    negate: bool = False

    def holds(self, value: ParamValue) -> bool:
        return _member(value, self.values) != self.negate

    def __str__(self) -> str:
        shown = ", ".join(show_value(v) for v in self.values)
        return f"{self.param} {'not in' if self.negate else 'in'} [{shown}]"
