"""The SLA's own load: the arrival rate (or concurrency) its workload offers, and its unit."""

from __future__ import annotations

from autotuner.sla.spec import Sla


def sla_load(sla: Sla) -> float:
    """The workload's rate in req/s, or its concurrency for a closed loop (1 when neither)."""
    a = sla.workload.arrival
    value = getattr(a, "rate", None) or getattr(a, "concurrency", None) or 1
    return float(value)


def load_unit(sla: Sla) -> str:
    """What :func:`sla_load` counts."""
    return "req/s" if hasattr(sla.workload.arrival, "rate") else "concurrent requests"
