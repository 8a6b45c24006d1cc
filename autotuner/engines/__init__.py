"""Inference engines the tuner can launch: the adapter Protocol, the registry of adapters by
kind, engine environments (interpreters), and one subpackage per engine (vLLM now)."""

from __future__ import annotations

from autotuner.engines.base import (
    Endpoint,
    EngineAdapter,
    EngineLaunchError,
    EngineProcess,
    LaunchCause,
    LaunchSpec,
)

__all__ = [
    "Endpoint",
    "EngineAdapter",
    "EngineLaunchError",
    "EngineProcess",
    "LaunchCause",
    "LaunchSpec",
]
