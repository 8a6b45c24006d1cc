"""Metric names: the single source of truth for the names constraints and objectives may use
(``SCALAR_METRICS``, ``PERCENTILE_METRIC_RE``, ``is_known_metric``), shared by the evaluator and
the reports."""

from __future__ import annotations

import re
from decimal import Decimal

LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")

SCALAR_METRICS: frozenset[str] = frozenset(
    {
        "capacity",  # the highest arrival rate (or concurrency) that meets the SLA
        "capacity_per_gpu",  # capacity / GPUs of the layout (tensor x pipeline x data parallel)
        "goodput",
        "request_rate",
        "output_tokens_per_s",
        "total_tokens_per_s",
        "error_rate",
        "peak_memory_gib",
        *(f"mean_{m}_ms" for m in LATENCY_METRICS),
    }
)

# p<q>_<latency>_ms with q written as digits, optionally with a fraction: p50, p99, p99.9.
PERCENTILE_METRIC_RE = re.compile(r"^p(?P<q>\d+(?:\.\d+)?)_(?P<base>ttft|tpot|itl|e2e)_ms\Z")

# Shapes that look like a percentile key, to give a precise message when a part is wrong.
PERCENTILE_SHAPE_RE = re.compile(r"^p(?P<q>\d+(?:\.\d+)?)_(?P<base>[a-z0-9]+)_ms\Z")

COMMON_PERCENTILES = ("50", "90", "95", "99", "99.9")

# The finest percentile is p99.999: a finer one (p99.99999999999) needs more requests per level
# than any load level sends, and more than the confidence bounds can be computed for.
MAX_PERCENTILE_DECIMALS = 3


def canonical_q(q: str) -> str:
    """``"99.0"`` -> ``"99"``, ``"099"`` -> ``"99"``; the spelling used in metric names."""
    text = format(Decimal(q), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def percentile_problem(q: str) -> str | None:
    """Why the ``q`` of ``p<q>_..._ms`` is no percentile a run can measure (None: it is one):
    outside (0, 100], or more than ``MAX_PERCENTILE_DECIMALS`` decimals."""
    if not 0 < Decimal(q) <= 100:
        return f"percentile must be in (0, 100], got {canonical_q(q)}"
    decimals = len(canonical_q(q).partition(".")[2])
    if decimals > MAX_PERCENTILE_DECIMALS:
        return (
            f"percentile {canonical_q(q)} has {decimals} decimals; at most "
            f"{MAX_PERCENTILE_DECIMALS} (p50 to p99.999): a finer one needs more requests per "
            "load level than a run can send"
        )
    return None


def parse_percentile_metric(name: str) -> tuple[float, str] | None:
    """``"p99.9_ttft_ms"`` -> ``(99.9, "ttft")``; None unless a valid percentile metric
    (``percentile_problem``: 0 < q <= 100, at most three decimals)."""
    m = PERCENTILE_METRIC_RE.match(name)
    if m is None or percentile_problem(m["q"]) is not None:
        return None
    q = float(m["q"])
    if not 0 < q <= 100:
        return None
    return q, m["base"]


def canonical_metric(name: str) -> str | None:
    """The canonical spelling of a known metric (``p99.0_ttft_ms`` -> ``p99_ttft_ms``)."""
    if name in SCALAR_METRICS:
        return name
    m = PERCENTILE_METRIC_RE.match(name)
    if m is None or parse_percentile_metric(name) is None:
        return None
    return f"p{canonical_q(m['q'])}_{m['base']}_ms"


def is_known_metric(name: str) -> bool:
    """True for scalar metrics and for ``p<q>_<ttft|tpot|itl|e2e>_ms`` with 0 < q <= 100 and
    at most three decimals."""
    return canonical_metric(name) is not None


def metric_vocabulary() -> list[str]:
    pct = [f"p{q}_{m}_ms" for q in COMMON_PERCENTILES for m in LATENCY_METRICS]
    return sorted(SCALAR_METRICS) + pct
