"""Metric names in the bundle's words: labels, units, which direction is better, values and
changes formatted with their unit. Units and directions are read off the name (``_ms`` ms,
``goodput``/``request_rate`` req/s, ``*tokens_per_s`` tok/s, ``_gib`` GiB); metric names are
those of :mod:`autotuner.measure.evaluate`.
"""

from __future__ import annotations

import math
import re
from typing import Literal

Better = Literal["max", "min"]


# p99_ttft_ms, mean_tpot_ms: a latency percentile (or mean) of TTFT, TPOT, ITL or E2E
LATENCY_METRIC = re.compile(r"^(?P<kind>p\d+(?:\.\d+)?|mean)_(?P<m>ttft|tpot|itl|e2e)_ms$")
_NAMES = {
    "capacity": "capacity",
    "capacity_per_gpu": "capacity per GPU",
    "goodput": "goodput",
    "request_rate": "request rate",
    "output_tokens_per_s": "output tokens",
    "total_tokens_per_s": "total tokens",
    "peak_memory_gib": "peak memory",
    "error_rate": "error rate",
    "trial": "trial",
}


def metric_unit(name: str) -> str:
    """The unit of metric ``name`` read off its name ("" when it has none)."""
    if name.endswith("_ms"):
        return "ms"
    if name.endswith("_gib"):
        return "GiB"
    if name.endswith("tokens_per_s"):
        return "tok/s"
    if name == "capacity_per_gpu":
        return "req/s/GPU"
    if name in ("capacity", "goodput", "request_rate") or name.endswith("_req_per_s"):
        return "req/s"
    return ""


def metric_name(name: str) -> str:
    """``p99_ttft_ms`` -> ``p99 TTFT``; ``peak_memory_gib`` -> ``peak memory``."""
    match = LATENCY_METRIC.match(name)
    if match:
        return f"{match['kind']} {match['m'].upper()}"
    if name in _NAMES:
        return _NAMES[name]
    return re.sub(r"_(ms|gib|per_s)$", "", name).replace("_", " ")


def metric_label(name: str) -> str:
    """An axis label: ``p99 TTFT (ms)``, ``goodput (req/s)``."""
    unit = metric_unit(name)
    return f"{metric_name(name)} ({unit})" if unit else metric_name(name)


def metric_better(name: str) -> Better | None:
    """Whether more (``max``) or less (``min``) of ``name`` is better; ``None`` if unknown."""
    if name.endswith(("_ms", "_gib")) or name == "error_rate":
        return "min"
    if metric_unit(name) in ("req/s", "tok/s"):
        return "max"
    return None


def format_value(name: str, value: float | None) -> str:
    """``value`` of metric ``name`` with its unit, for tables and labels."""
    if value is None or not math.isfinite(value):
        return "n/a"
    unit = metric_unit(name)
    if name == "error_rate":
        return f"{value:.2%}"
    if unit == "ms":
        return f"{value:,.1f} ms" if abs(value) >= 1 else f"{value:.3f} ms"
    if unit == "tok/s":
        return f"{value:,.0f} tok/s"
    if unit in ("req/s", "GiB"):
        return f"{value:,.2f} {unit}"
    return f"{value:.4g}"


def format_change(name: str, change: float | None) -> str:
    """A relative change (``-0.12``) as ``-12.0 % (worse)`` given the metric's direction."""
    if change is None or not math.isfinite(change):
        return "n/a"
    text = f"{change * 100:+.1f} %"
    better = metric_better(name)
    if better is None or abs(change) < 0.0005:
        return text
    good = (change > 0) == (better == "max")
    return f"{text} ({'better' if good else 'worse'})"


def finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
