"""Turns a measured run into the numbers an SLA talks about.

Every metric has one name, shared by SLA constraints, objectives, tables and manifests:
``p<q>_<ttft|tpot|itl|e2e>_ms``, ``mean_<...>_ms``, ``request_rate``, ``output_tokens_per_s``,
``total_tokens_per_s``, ``goodput``, ``error_rate``, ``peak_memory_gib``.

A constraint's margin is relative and signed like Optuna's constraints: ``<= 0`` means met.
Goodput is the rate of requests that succeeded *and* met every per-request latency SLO
(TTFT, TPOT, E2E, and the request's own p99 inter-token gap for ITL). Rates count over the
measured window (:func:`served_rate`), not over the run's drain tail.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from autotuner.measure.loadgen import LoadResult, RequestRecord
from autotuner.sla.spec import Constraint, Sla

_LATENCY = re.compile(r"^(p(?P<q>\d+(?:\.\d+)?)|mean)_(?P<m>ttft|tpot|itl|e2e)_ms$")
TABLE_PERCENTILES = (50.0, 90.0, 99.0)
# Metrics of a launch, not of one load run: ``capacity`` comes from the launch's load levels
# (autotuner.search.trial), so one run's evaluation leaves it None.
LAUNCH_METRICS = frozenset({"capacity", "capacity_per_gpu"})


@dataclass(frozen=True)
class Verdict:
    """One SLA constraint checked against one run."""

    key: str
    metric: str
    bound: str  # "max" or "min"
    limit: float
    value: float | None
    margin: float  # relative; <= 0 met; inf when the metric could not be measured

    @property
    def met(self) -> bool:
        return self.margin <= 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["margin"] = None if math.isinf(self.margin) else self.margin
        d["met"] = self.met
        return d


@dataclass(frozen=True)
class Evaluation:
    metrics: dict[str, float | None]
    verdicts: tuple[Verdict, ...]
    objectives: dict[str, float | None]

    @property
    def feasible(self) -> bool:
        return all(v.met for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible,
            "metrics": self.metrics,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "objectives": self.objectives,
        }


def request_meets(record: RequestRecord, slos: dict[str, float]) -> bool:
    """Whether one request met every per-request latency SLO (milliseconds)."""
    if not record.ok:
        return False
    checks = {
        "ttft": record.ttft_s,
        "tpot": record.tpot_s,
        "e2e": record.e2e_s,
        "itl": float(np.percentile(record.itl_s, 99)) if record.itl_s else None,
    }
    for metric, limit in slos.items():
        value = checks.get(metric)
        if value is not None and value * 1000.0 > limit:
            return False
    return True


def metric_value(result: LoadResult, name: str, slos: dict[str, float]) -> float | None:
    """The value of metric ``name`` in ``result``; ``None`` when it cannot be measured."""
    match = _LATENCY.match(name)
    if match:
        values = result.latencies_ms(match["m"])
        if not values.size:
            return None
        if match["q"] is None:
            return float(values.mean())
        return float(np.percentile(values, float(match["q"])))
    ok = result.ok
    total = len(result.records)
    if name == "error_rate":
        return len(result.failed) / total if total else None
    if name == "peak_memory_gib":
        peak = result.monitor.get("peak_memory_bytes")
        return float(peak) / 2**30 if peak else None
    rate = served_rate(result)
    if rate is None:
        return None
    per_request = rate / total  # each request's share of the served rate
    if name == "request_rate":
        return len(ok) * per_request
    if name == "output_tokens_per_s":
        return sum(r.output_tokens for r in ok) * per_request
    if name == "total_tokens_per_s":
        return sum(r.output_tokens + (r.prompt_tokens or 0) for r in ok) * per_request
    if name == "goodput":
        return sum(request_meets(r, slos) for r in result.records) * per_request
    raise KeyError(f"unknown metric {name!r}")


def served_rate(result: LoadResult) -> float | None:
    """Requests served per second over the measured window: ``(n - 1)`` completions over the
    span from the first request's end to the last one's. Neither the first requests' latency
    nor the last ones' drain (seconds of decoding after the last arrival) is in the
    denominator, so a sustained level's rate agrees with its offered rate, and a saturated
    engine's with its service rate. Requests without a known end (failed before answering)
    count at the window's rate. The rate is at most the one the requests were sent at (their
    first to last send). Fewer than three ends: the whole run's length.

    A pooled level's runs each count from their own start, so their windows overlap: each
    run's window is measured on its own, and the level's rate is all their requests over all
    their windows' seconds."""
    windows = [w for part in result.parts() if (w := _window(part)) is not None]
    seconds = sum(s for _, s in windows)
    return sum(n for n, _ in windows) / seconds if seconds > 0 else None


def _window(run: LoadResult) -> tuple[int, float] | None:
    """One run's requests and the seconds of its measured window (see :func:`served_rate`)."""
    total = len(run.records)
    if not total:
        return None
    ends = sorted(r.sent_s + r.e2e_s for r in run.records if r.e2e_s is not None)
    if len(ends) >= 3 and ends[-1] > ends[0]:
        served = (len(ends) - 1) / (ends[-1] - ends[0]) * total / len(ends)
        # Never faster than the requests arrived: with few requests the span of the ends
        # alone can read well above the offered rate by chance.
        sent = sorted(r.sent_s for r in run.records)
        if total >= 3 and sent[-1] > sent[0]:
            served = min(served, (total - 1) / (sent[-1] - sent[0]))
        return total, total / served
    return (total, run.duration_s) if run.duration_s > 0 else None


def table_metrics(result: LoadResult, slos: dict[str, float]) -> dict[str, float | None]:
    """The standard set of metrics every report shows."""
    names = [
        f"{kind}_{m}_ms"
        for m in ("ttft", "tpot", "itl", "e2e")
        for kind in ["mean", *(f"p{q:g}" for q in TABLE_PERCENTILES)]
    ]
    names += [
        "request_rate",
        "output_tokens_per_s",
        "total_tokens_per_s",
        "goodput",
        "error_rate",
        "peak_memory_gib",
    ]
    return {n: metric_value(result, n, slos) for n in names}


def evaluate(result: LoadResult, sla: Sla) -> Evaluation:
    """Check every constraint of ``sla`` and compute its objectives on ``result``."""
    slos = sla.latency_slos()
    metrics = table_metrics(result, slos)
    verdicts = []
    for c in sla.constraints:
        value = metrics[c.metric] if c.metric in metrics else metric_value(result, c.metric, slos)
        metrics.setdefault(c.metric, value)
        verdicts.append(Verdict(c.key, c.metric, c.bound, c.limit, value, _margin(c, value)))
    objectives: dict[str, float | None] = {}
    for o in sla.objectives:
        if o.metric in LAUNCH_METRICS:  # a property of a whole launch, not of one run
            objectives[o.metric] = None
            continue
        if o.metric not in metrics:
            metrics[o.metric] = metric_value(result, o.metric, slos)
        objectives[o.metric] = metrics[o.metric]
    return Evaluation(metrics, tuple(verdicts), objectives)


def _margin(c: Constraint, value: float | None) -> float:
    if value is None:
        return math.inf
    if c.bound == "max":
        return (value - c.limit) / c.limit if c.limit else value - c.limit
    return (c.limit - value) / c.limit if c.limit else c.limit - value
