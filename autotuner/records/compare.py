"""The files of `autotuner compare-engines` (a promoted config on an old and a new engine).

``replicates.jsonl`` holds one :class:`ReplicateLine` per finished launch, so that an
interrupted check resumes; ``result.json`` is the :class:`EngineComparison`, read back by the
daemon, which records the verdict and raises the alert.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autotuner.core.types import ParamValue
from autotuner.records.base import Record

Verdict = Literal["regression", "improvement", "no_change", "not_enough_data"]


class ReplicateLine(Record):
    """One launch of the config on one engine (a line of ``replicates.jsonl``)."""

    KIND = "replicate line"

    engine: str  # "old" or "new"
    replicate: int
    started: bool  # the engine came up and was measured
    metrics: dict[str, float | None]
    feasible: bool = False
    cause: str | None = None  # why it did not start / was not measured
    run_dir: str = ""


class MetricChangeRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    metric: str
    old_mean: float | None = None
    new_mean: float | None = None
    change: float | None = None  # relative, (new - old) / old
    ci_low: float | None = None
    ci_high: float | None = None
    threshold: float | None = None  # the minimum effect the interval had to clear
    direction: str = "unknown"  # better, worse, same, unclear, unknown


class EngineRef(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str | None = None  # registry name
    version: str | None = None


class EngineComparison(Record):
    """``result.json``: the verdict, the per-metric changes and every replicate."""

    KIND = "engine comparison"

    sla: str | None = None
    config: str | None = None  # the promoted config's label
    params: dict[str, ParamValue] = Field(default_factory=dict)
    load: float | None = None
    old: EngineRef | None = None
    new: EngineRef | None = None
    replicates: int | None = None
    min_effect: float | None = None
    verdict: Verdict = "not_enough_data"
    reason: str | None = None
    changes: list[MetricChangeRecord] = Field(default_factory=list)
    counts: dict[str, int] | None = None  # launches tried / measured per engine
    # Every launch, as in replicates.jsonl
    samples: list[ReplicateLine] = Field(default_factory=list)
