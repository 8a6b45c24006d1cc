"""autotuner: SLA-driven tuning of LLM inference engines (vLLM first)."""

from __future__ import annotations

__version__ = "0.1.0"
