"""How one config lays the model out over the target's devices: tensor x pipeline parallel
ranks per engine, times data parallelism.

Data parallelism runs one of two ways (``search.data_parallel`` in the SLA):

- ``engine``: the engine's own ``--data-parallel-size``: one server, one endpoint, the engine
  spreads requests over its DP ranks;
- ``replicas``: N separate engine servers, each on its own slice of the devices (GPUs
  ``[i*tp*pp, (i+1)*tp*pp)``; on a CPU target, its own cores), and the load generator spreads
  requests over their endpoints in turn.

``auto`` takes the engine's flag where the engine version has it, else replicas. The study
decides once (:func:`resolve_mode`) and every launch of the study uses that way, so that the
data-parallel size a trial records always means the same thing.

A config's ``params`` are keyed by the engine's own option names; which of them are the
tensor, pipeline and data parallel sizes is the adapter's
:class:`~autotuner.engines.base.OptionRoles`, passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from autotuner.core.types import ParamValue
from autotuner.engines.base import OptionRoles

Mode = Literal["engine", "replicas"]
Choice = Literal["auto", "engine", "replicas"]

# Capacity divided by the devices the layout takes (an objective an SLA may choose).
CAPACITY_PER_GPU = "capacity_per_gpu"


def _size(params: Mapping[str, ParamValue], key: str | None) -> int:
    value = None if key is None else params.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def resolve_mode(choice: Choice, engine_has_dp_flag: bool) -> Mode:
    """The way a study runs data parallelism (module docstring)."""
    if choice == "auto":
        return "engine" if engine_has_dp_flag else "replicas"
    return choice


@dataclass(frozen=True)
class Layout:
    """Tensor x pipeline ranks per engine, ``dp`` copies of it, run as ``mode``."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    mode: Mode = "engine"
    # The option the engine spells the data-parallel size with (left out of each server's
    # options when the tuner runs the copies itself).
    dp_option: str | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(
        cls, params: Mapping[str, ParamValue], roles: OptionRoles, mode: Mode = "engine"
    ) -> Layout:
        """The layout of ``params`` (an engine without an option for a role: size 1)."""
        return cls(
            _size(params, roles.tensor_parallel),
            _size(params, roles.pipeline_parallel),
            _size(params, roles.data_parallel),
            mode,
            roles.data_parallel,
        )

    @property
    def ranks(self) -> int:
        """Devices one engine (one DP rank) spans."""
        return self.tp * self.pp

    @property
    def devices(self) -> int:
        """Devices the whole layout takes: every rank of every DP copy."""
        return self.ranks * self.dp

    @property
    def replicas(self) -> int:
        """Engine servers the tuner starts for it."""
        return self.dp if self.mode == "replicas" else 1

    def engine_params(self, params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """The options each engine server gets: without the data-parallel size when the
        tuner runs the copies itself."""
        out = dict(params)
        if self.mode == "replicas" and self.dp_option is not None:
            out.pop(self.dp_option, None)
        return out

    def slices(self, devices: Sequence[str]) -> list[list[str]]:
        """Each server's devices: disjoint consecutive slices of ``devices``. Raises
        ValueError when there are too few."""
        per = self.devices if self.replicas == 1 else self.ranks
        if len(devices) < per * self.replicas:
            raise ValueError(
                f"{self.describe()} needs {self.devices} devices, the target has {len(devices)}"
            )
        return [list(devices[i * per : (i + 1) * per]) for i in range(self.replicas)]

    def describe(self, unit: str = "GPU") -> str:
        """``TP=2 x DP=2 (4 GPUs, 2 replicas)``; ``unit`` names the devices (on a CPU target:
        engine ranks)."""
        parts = [f"TP={self.tp}"]
        if self.pp > 1:
            parts.append(f"PP={self.pp}")
        parts.append(f"DP={self.dp}")
        how = f", {self.dp} replicas" if self.replicas > 1 else ""
        return f"{' x '.join(parts)} ({self.devices} {unit}{'s' if self.devices > 1 else ''}{how})"


def devices_used(params: Mapping[str, ParamValue], roles: OptionRoles) -> int:
    """Devices a config takes (tensor x pipeline x data parallel): what capacity per GPU
    divides by. On a CPU target this counts engine ranks."""
    return Layout.of(params, roles).devices
