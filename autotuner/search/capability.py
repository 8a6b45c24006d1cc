"""Which settings of a config change outputs (lossy) or need particular hardware, as the
engine's space file declares them (``lossy:`` and ``requires:`` in ``search_spaces/``).

The space filters the search by these; promotion needs them again for the config it
promotes: the lossy tier keeps the best lossless and the best lossy config apart, and the
fallback plan names, per hardware-specific setting, what to run on a device without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autotuner.core.types import ParamValue
from autotuner.space import read_space_file


@dataclass(frozen=True)
class Need:
    """A hardware requirement of some values of one parameter."""

    values: tuple[ParamValue, ...] | None  # None: every value
    compute_capability: str | None  # GPU: at least this
    cpu_flags_any: tuple[str, ...]  # CPU engine: one of these

    def applies(self, value: ParamValue) -> bool:
        return self.values is None or value in self.values

    def describe(self, device: str) -> str | None:
        """What the device must have, in words (None: nothing on this device)."""
        if device == "gpu" and self.compute_capability:
            return f"compute capability >= {self.compute_capability}"
        if device == "cpu" and self.cpu_flags_any:
            return "a CPU with " + " or ".join(self.cpu_flags_any)
        return None


@dataclass(frozen=True)
class SettingTraits:
    """Per parameter: its lossy values, its hardware needs and the engine's default."""

    lossy: Mapping[str, bool | tuple[ParamValue, ...]]
    needs: Mapping[str, tuple[Need, ...]]
    defaults: Mapping[str, ParamValue]

    def is_lossy(self, name: str, value: ParamValue) -> bool:
        rule = self.lossy.get(name, False)
        return rule if isinstance(rule, bool) else value in rule

    def lossy_settings(self, params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """The settings of ``params`` that change outputs."""
        return {k: v for k, v in params.items() if self.is_lossy(k, v)}

    def hardware_needs(self, params: Mapping[str, ParamValue], device: str) -> dict[str, str]:
        """``name`` -> what the device needs for ``params``' value of it (lossy settings
        whose need is not on this device are left out: nothing to fall back from)."""
        out: dict[str, str] = {}
        for name, value in params.items():
            said = [
                text
                for need in self.needs.get(name, ())
                if need.applies(value) and (text := need.describe(device))
            ]
            if said:
                out[name] = "; ".join(dict.fromkeys(said))
        return out


NO_TRAITS = SettingTraits({}, {}, {})


def traits_of(space_file: str | Path) -> SettingTraits:
    """The traits declared in a space file (the ``source`` of a resolved space)."""
    spec = read_space_file(Path(space_file))
    lossy: dict[str, bool | tuple[ParamValue, ...]] = {}
    needs: dict[str, tuple[Need, ...]] = {}
    for d in spec.params:
        lossy[d.name] = d.lossy if isinstance(d.lossy, bool) else tuple(d.lossy)
        found = tuple(
            Need(
                None if r.values is None else tuple(r.values),
                r.compute_capability,
                tuple(r.cpu_flags_any or ()),
            )
            for r in d.requires
            if r.compute_capability or r.cpu_flags_any
        )
        if found:
            needs[d.name] = found
    return SettingTraits(lossy, needs, {d.name: d.default for d in spec.params})
