"""``result.json`` of `autotuner bench` (also its ``--output`` file and its ``--json`` print).

Written by the bench command; read back by the daemon's nightly re-check, which runs `bench`
on the promoted config and compares the goodput with the promised one. Fields have defaults
where a reader can do without them: a re-check only needs ``metrics``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autotuner.core.types import ParamValue
from autotuner.records.base import Record


class VerdictRecord(BaseModel):
    """One SLA constraint checked against the run."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    key: str
    metric: str
    bound: str  # "max" or "min"
    limit: float
    value: float | None
    margin: float | None  # relative; <= 0 met; None when the metric could not be measured
    met: bool


class BenchResult(Record):
    """One config measured end to end: the engine, the load run and the SLA's verdicts."""

    KIND = "bench result"

    kind: Literal["autotuner.bench"] = "autotuner.bench"
    tuner_version: str | None = None
    created: str | None = None  # ISO 8601 UTC
    sla: str | None = None  # the SLA's name
    engine_version: str | None = None
    params: dict[str, ParamValue] = Field(default_factory=dict)
    argv: list[str] = Field(default_factory=list)
    startup_s: float | None = None
    errors: dict[str, int] = Field(default_factory=dict)  # failed requests by error class
    requests: int = 0
    failed: int = 0
    feasible: bool = False
    metrics: dict[str, float | None] = Field(default_factory=dict)
    verdicts: list[VerdictRecord] = Field(default_factory=list)
    objectives: dict[str, float | None] = Field(default_factory=dict)
    engine_log: str | None = None
    # The load run: plan, duration, warm-up failures, monitor summary, and every request's
    # record (left out of the --json print).
    result: dict[str, Any] = Field(default_factory=dict)
