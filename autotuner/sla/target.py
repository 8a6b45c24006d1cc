"""The SLA's ``target:`` section: the CPU, or the GPUs a trial leases."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from autotuner.core.yamlpos import KeyPath
from autotuner.sla.base import Strict, fail, fail_all, show, suggest

_GPU_KEYS = ("gpu", "gpus")
MAX_GPUS = 64  # a GPU count beyond any one host


class Target(Strict):
    """Where the engine runs. YAML: ``cpu``, ``{gpu: 0}``, ``{gpu: "GPU-..."}``, ``{gpu: [0, 1]}``;
    ``gpus`` is the same key (``{gpus: [0, 1]}``) and also takes a count (``{gpus: 4}``: GPUs
    0 to 3). Every device of the target is leased as a whole, for each trial.

    ``devices`` are GPU indices or UUIDs as strings (empty for CPU).
    """

    kind: Literal["cpu", "gpu"] = "cpu"
    devices: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if data == "cpu":
            return {"kind": "cpu", "devices": []}
        if not isinstance(data, dict):
            if isinstance(data, Target):
                return data
            raise fail(f"must be 'cpu' or a mapping like {{gpu: 0}}, got {show(data)}")
        if not data or "kind" in data:  # Target() itself, or the model_dump() form
            return data
        problems: list[tuple[str, KeyPath]] = [
            (f"unknown key{suggest(str(k), list(_GPU_KEYS))}", (str(k),))
            for k in data
            if k not in _GPU_KEYS
        ]
        keys = [k for k in _GPU_KEYS if k in data]
        if len(keys) != 1:
            problems.append(("must be 'cpu' or a mapping like {gpu: 0} or {gpus: [0, 1]}", ()))
            raise fail_all(problems)
        (key,) = keys
        raw = data[key]
        items: list[tuple[Any, KeyPath]]
        if key == "gpus" and isinstance(raw, int) and not isinstance(raw, bool):
            # A count: the first N GPUs of the host, leased together.
            if not 1 <= raw <= MAX_GPUS:
                problems.append((f"a GPU count must be 1 to {MAX_GPUS}, got {raw}", (key,)))
                raise fail_all(problems)
            raw = list(range(raw))
        if isinstance(raw, list):
            items = [(v, (key, i)) for i, v in enumerate(raw)]
            if not raw:
                problems.append(("list of GPUs must not be empty", (key,)))
        else:
            items = [(raw, (key,))]
        devices: list[str] = []
        for value, at in items:
            dev = _device(value)
            if dev is None:
                problems.append((f"must be a GPU index (0, 1, ...) or UUID, got {show(value)}", at))
            elif dev in devices:
                problems.append((f"GPU {dev} is listed twice", at))
            else:
                devices.append(dev)
        if problems:
            raise fail_all(problems)
        return {"kind": "gpu", "devices": devices}

    @model_validator(mode="after")
    def _consistent(self) -> Target:
        if self.kind == "cpu" and self.devices:
            raise fail("a cpu target has no devices", "devices")
        if self.kind == "gpu" and not self.devices:
            raise fail("list of GPUs must not be empty", "devices")
        if len(set(self.devices)) != len(self.devices):
            raise fail("a GPU is listed twice", "devices")
        return self

    def to_yaml_value(self) -> Any:
        """The short form users write (``cpu`` / ``{gpu: 0}`` / ``{gpu: [0, 1]}``)."""
        if self.kind == "cpu":
            return "cpu"
        devs: list[int | str] = [int(d) if d.isdigit() else d for d in self.devices]
        return {"gpu": devs[0] if len(devs) == 1 else devs}


def _device(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value) if value >= 0 else None
    if isinstance(value, str) and value.strip() and not any(c.isspace() or c == "," for c in value):
        return value
    return None
