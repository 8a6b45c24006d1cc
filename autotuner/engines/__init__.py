"""Inference engines the tuner can launch (vLLM now; TensorRT-LLM later)."""

from __future__ import annotations

from autotuner.engines.base import Endpoint, EngineBackend, EngineLaunchError, LaunchCause

__all__ = ["Endpoint", "EngineBackend", "EngineLaunchError", "LaunchCause"]
