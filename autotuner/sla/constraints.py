"""The SLA's ``constraints:`` (hard limits on metrics) and ``objectives:`` (what to optimise)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, model_validator

from autotuner.sla.base import Strict, fail, show, suggest
from autotuner.sla.metrics import (
    COMMON_PERCENTILES,
    LATENCY_METRICS,
    PERCENTILE_METRIC_RE,
    PERCENTILE_SHAPE_RE,
    canonical_metric,
    canonical_q,
    metric_vocabulary,
    percentile_problem,
)

_FIXED_CONSTRAINTS: dict[str, tuple[str, Literal["max", "min"]]] = {
    "min_request_rate": ("request_rate", "min"),
    "min_output_tokens_per_s": ("output_tokens_per_s", "min"),
    "min_goodput": ("goodput", "min"),
    "max_gpu_memory_gib": ("peak_memory_gib", "max"),
    "max_error_rate": ("error_rate", "max"),
}


def _constraint_target(key: str) -> tuple[str, Literal["max", "min"]]:
    """Metric and bound of a constraint key; raises a validation error for bad keys."""
    if key in _FIXED_CONSTRAINTS:
        return _FIXED_CONSTRAINTS[key]
    shape = PERCENTILE_SHAPE_RE.match(key)
    if shape is not None and shape["base"] in LATENCY_METRICS:
        problem = percentile_problem(shape["q"])
        if problem is not None:
            raise fail(problem)
        return f"p{canonical_q(shape['q'])}_{shape['base']}_ms", "max"
    vocabulary = list(_FIXED_CONSTRAINTS)
    m = re.match(r"^p(\d+(?:\.\d+)?)", key)
    percentiles = (m[1], *COMMON_PERCENTILES) if m else COMMON_PERCENTILES
    vocabulary += [f"p{q}_{base}_ms" for q in percentiles for base in LATENCY_METRICS]
    suggestion = suggest(key, vocabulary)
    if shape is not None and not suggestion:
        raise fail(
            f"unknown key: the latency metric must be one of {', '.join(LATENCY_METRICS)}, "
            f"got {shape['base']!r}"
        )
    raise fail(f"unknown key{suggestion}")


class Constraint(Strict):
    """One hard limit: the trial is infeasible unless ``metric`` is within ``limit``.

    Built from one entry of the YAML ``constraints`` mapping: ``key`` as written there,
    ``metric`` the canonical metric it bounds, ``bound`` whether ``limit`` is a max or a min.
    Only ``key`` and ``limit`` are needed to construct one.
    """

    model_config = ConfigDict(frozen=True)

    key: str
    metric: str
    bound: Literal["max", "min"]
    limit: float

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("key"), str):
            return data  # let the field validation report it
        key: str = data["key"]
        metric, bound = _constraint_target(key)
        for name, derived in (("metric", metric), ("bound", bound)):
            if name in data and data[name] != derived:
                raise fail(f"{name} of {key!r} is {derived!r}, got {show(data[name])}")
        limit = data.get("limit")
        if not isinstance(limit, int | float) or isinstance(limit, bool):
            raise fail(f"must be a number, got {show(limit)}")
        if metric == "error_rate":
            if not 0 <= limit <= 1:
                raise fail(f"must be between 0 and 1, got {show(limit)}")
        elif limit <= 0:
            raise fail(f"must be > 0, got {show(limit)}")
        return {**data, "metric": metric, "bound": bound, "limit": float(limit)}

    @classmethod
    def of(cls, key: str, limit: float) -> Constraint:
        """The constraint written ``key: limit`` in YAML."""
        return cls.model_validate({"key": key, "limit": limit})

    def violation(self, value: float) -> float:
        """How far ``value`` is past the limit; <= 0 means satisfied (Optuna's convention)."""
        return value - self.limit if self.bound == "max" else self.limit - value

    def satisfied(self, value: float) -> bool:
        return self.violation(value) <= 0


class Objective(Strict):
    """One optimisation goal. YAML: ``{maximize: goodput}`` or ``{minimize: p99_ttft_ms}``."""

    model_config = ConfigDict(frozen=True)

    metric: str
    direction: Literal["maximize", "minimize"]

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if isinstance(data, Objective):
            return data
        if not isinstance(data, dict):
            raise fail(f"must be a mapping like {{maximize: goodput}}, got {show(data)}")
        if set(data) == {"metric", "direction"}:  # the model_dump() form
            return {**data, "metric": _checked_metric(data["metric"], "metric")}
        directions = ("maximize", "minimize")
        unknown = [k for k in data if k not in directions]
        if unknown:
            key = str(unknown[0])
            raise fail(f"unknown key{suggest(key, directions)}", key)
        if len(data) != 1:
            raise fail("give exactly one of 'maximize' or 'minimize' per item")
        ((direction, metric),) = data.items()
        return {"metric": _checked_metric(metric, direction), "direction": direction}


def _checked_metric(metric: Any, at: str) -> str:
    if not isinstance(metric, str):
        raise fail(f"must be a metric name, got {show(metric)}", at)
    canonical = canonical_metric(metric)
    shape = PERCENTILE_METRIC_RE.match(metric)
    if canonical is None and shape is not None and (problem := percentile_problem(shape["q"])):
        raise fail(problem, at)
    if canonical is None:
        raise fail(f"unknown metric {metric!r}{suggest(metric, metric_vocabulary())}", at)
    return canonical
