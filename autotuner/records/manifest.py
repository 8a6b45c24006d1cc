"""``optimization_manifest.json``: the promoted config, what it was measured at, why it won,
and where it came from. ``no_promotion.json`` has the same shape with ``promoted`` null.

Written by promotion; read by `autotuner report`, `autotuner compare-engines` (the config and
load to compare) and the daemon (the promotion it records). Sections have defaults where
those readers can do without them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autotuner.core.types import ParamValue
from autotuner.records.base import Record

SCHEMA = "autotuner/optimization_manifest/1"  # the name the manifest carried before records


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PromotedConfig(_Part):
    label: str | None = None  # "baseline" or "trial-<n>"
    trial: int | None = None
    is_baseline: bool = False
    # Every engine param, fixed ones included
    params: dict[str, ParamValue] = Field(default_factory=dict)
    tuned_params: dict[str, ParamValue] = Field(default_factory=dict)  # the ones the search chose
    engine_argv: list[str] | None = None  # how the trial launched it
    serve_argv: list[str] = Field(default_factory=list)  # how to serve it (`vllm serve ...`)
    meets_sla: bool = False  # confirmed to meet the SLA (a kept baseline may not)


class ConfigStats(_Part):
    """One config's confirmation replicates, as the decision saw them."""

    replicates: int
    slack_mean: float | None
    slack_range: float | None
    goodput_mean: float
    goodput_min: float
    goodput_max: float
    goodput_spread: float  # relative range of the replicates
    feasible_all: bool
    feasible_count: int


class DecisionRecord(_Part):
    promoted: str
    promoted_is_baseline: bool
    effect: float | None  # relative goodput win over the baseline
    threshold: float
    noise: float
    reason: str
    per_config: dict[str, ConfigStats]


class NoDecision(_Part):
    """Why nothing was promoted."""

    reason: str


class LevelSummary(_Part):
    load: float
    feasible: bool
    goodput: float | None


class SearchMeasurement(_Part):
    trial: int | None = None
    at_sla_load: dict[str, float | None] | None = None
    max_load_meeting_sla: float | None = None
    levels: list[LevelSummary] = Field(default_factory=list)


class Spread(_Part):
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    replicates: int = 0


class ReplicateRecord(_Part):
    config: str  # "baseline" or "trial-<n>"
    replicate: int
    goodput: float | None
    feasible: bool
    metrics: dict[str, float | None]
    run_dir: str  # relative to the study directory
    slack: float | None = None


class Confirmation(_Part):
    load: float | None = None
    load_unit: str | None = None
    # Config label -> metric -> spread
    spread: dict[str, dict[str, Spread]] = Field(default_factory=dict)
    replicates: list[ReplicateRecord] = Field(default_factory=list)


class Measurements(_Part):
    search: SearchMeasurement | None = None
    confirmation: Confirmation | None = None


class Verdicts(_Part):
    at_sla_load: dict[str, float | None]  # constraint key -> relative margin (<= 0 met)
    note: str


class SlaSummary(_Part):
    constraints: dict[str, float]
    objectives: list[dict[str, str]]  # [{"maximize": "goodput"}, ...]
    file: str  # the SLA as YAML


class ModelSource(_Part):
    dir: str
    synth: str | None
    config_sha256: str


class SpaceSource(_Part):
    hash: str
    source: str
    description: list[str]


class StudySource(_Part):
    name: str
    storage: str
    trials: list[int]
    sampler: str


class Provenance(_Part):
    tuner_version: str | None = None
    engine_version: str | None = None
    engine_python: str | None = None
    hardware: list[dict[str, str]] = Field(default_factory=list)  # the rows of hardware_profile.csv
    model: ModelSource | None = None
    search_space: SpaceSource | None = None
    study: StudySource | None = None


class Decisions(_Part):
    """What happened to the trials that were not promoted, by kind (free-form entries)."""

    pruned: list[dict[str, Any]] = Field(default_factory=list)
    failed: list[dict[str, Any]] = Field(default_factory=list)
    duplicates: list[dict[str, Any]] = Field(default_factory=list)
    interrupted: list[dict[str, Any]] = Field(default_factory=list)
    infeasible: list[dict[str, Any]] = Field(default_factory=list)


class Manifest(Record):
    KIND = "optimization manifest"

    schema_: str = Field(default=SCHEMA, alias="schema")
    created: str | None = None  # ISO 8601 UTC
    study: str | None = None
    promoted: PromotedConfig | None = None
    decision: DecisionRecord | NoDecision | None = Field(default=None, union_mode="left_to_right")
    measurements: Measurements | None = None
    verdicts: Verdicts | None = None
    sla: SlaSummary | None = None
    pareto_front: list[int] = Field(default_factory=list)  # trial numbers, ranked
    provenance: Provenance | None = None
    decisions: Decisions | None = None

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    def to_data(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
