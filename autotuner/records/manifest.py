"""``optimization_manifest.json``: the promoted config, what it was measured at, why it won,
and where it came from. ``no_promotion.json`` has the same shape with ``promoted`` null.

Written by promotion; read by `autotuner report`, `autotuner compare-engines` (the config and
load to compare) and the daemon (the promotion it records). Sections have defaults where
those readers can do without them.

Version 2 (issue 16) decides by capacity: the search's ``capacity`` (value, bracket, unit, why
it stopped), confirmation replicates that are capacity searches, and a decision with the
effect's interval (``basis: capacity``). Version 0/1 manifests read with those fields empty
and ``basis: goodput`` (their decision compared goodput at one common load).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autotuner.core.types import ParamValue
from autotuner.records.base import Record
from autotuner.records.lossy import LossyTier
from autotuner.records.trial import CapacityRecord, Load

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
    feasible_count: int = 0
    # Version 2: capacity replicates (None: a launch that failed)
    capacities: list[float | None] = Field(default_factory=list)
    capacity_mean: float | None = None
    capacity_min: float | None = None
    capacity_max: float | None = None
    goodput_mean: float | None = None  # goodput at capacity (version 1: at the common load)
    # Version 1: goodput at one common load
    slack_mean: float | None = None
    slack_range: float | None = None
    goodput_min: float | None = None
    goodput_max: float | None = None
    goodput_spread: float | None = None  # relative range of the replicates
    feasible_all: bool | None = None
    # Replicates that measured something, and of those the ones that missed the SLA (capacity
    # 0). The capacity and goodput means are over the others (older manifests: over all).
    measured: int | None = None
    missed: int = 0


class DecisionRecord(_Part):
    promoted: str
    promoted_is_baseline: bool
    reason: str
    effect: float | None = None  # relative capacity win over the baseline (v1: goodput)
    confirmed: bool = True  # replicates decided it (False: no launch was spent)
    effect_low: float | None = None  # the effect's confidence interval
    effect_high: float | None = None
    confidence: float | None = None
    min_effect: float | None = None
    verdict: str | None = None  # better / worse / no_difference / not_enough_data
    basis: str = "goodput"  # what was compared: "capacity" (version 2) or "goodput"
    threshold: float | None = None  # version 1: what the goodput win had to exceed
    noise: float | None = None  # version 1: run-to-run spread
    per_config: dict[str, ConfigStats] = Field(default_factory=dict)
    comparisons: dict[str, dict[str, Any]] = Field(default_factory=dict)  # per candidate


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
    capacity: CapacityRecord | None = None  # version 2: the launch's capacity (a single run)
    levels: list[LevelSummary] = Field(default_factory=list)


class Spread(_Part):
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    replicates: int = 0  # the replicates the mean is over: those that met the SLA
    missed: int = 0  # replicates that missed the SLA at its own load (left out of the mean)


class ReplicateRecord(_Part):
    config: str  # "baseline" or "trial-<n>"
    replicate: int
    goodput: float | None  # version 2: goodput at the replicate's capacity
    feasible: bool
    metrics: dict[str, float | None]
    run_dir: str  # relative to the study directory
    slack: float | None = None  # version 1
    capacity: Load | None = None  # version 2 (0: missed the SLA at its own load)
    low: Load | None = None
    high: Load | None = None
    stopped_by: str | None = None
    # Where it missed the SLA at its own load: what it missed (for an undecided level, what
    # would decide it), and that level's margins and verdicts.
    note: str | None = None
    margins: dict[str, float | None] = Field(default_factory=dict)
    verdicts: dict[str, str] = Field(default_factory=dict)


class Confirmation(_Part):
    # Version 1: the common load of the comparison; version 2: a load the promoted config met
    # the SLA at in every replicate (None: not confirmed). compare-engines re-checks there.
    load: float | None = None
    load_unit: str | None = None
    # Config label -> metric -> spread
    spread: dict[str, dict[str, Spread]] = Field(default_factory=dict)
    replicates: list[ReplicateRecord] = Field(default_factory=list)


class Measurements(_Part):
    search: SearchMeasurement | None = None
    confirmation: Confirmation | None = None


class Verdicts(_Part):
    """The promoted config's constraints at the SLA's own load: from its search launch, or,
    when a confirmation replicate of it missed the SLA there, from that one; ``note`` says
    which, and each constraint's verdict there (a margin <= 0 can still be undecided)."""

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


class GpuAccount(_Part):
    """GPU-minutes spent to the decision (devices x wall minutes of every launch): the
    search's launches (raced-out ones included) and the confirmation replicates, by phase
    (engine_start, warmup, levels, stop). Launches recorded before the accounting (no
    ``gpu_seconds``) are counted in ``launches`` and ``untimed``, not in the minutes."""

    search: float = 0.0
    confirmation: float = 0.0
    total: float = 0.0
    by_phase: dict[str, float] = Field(default_factory=dict)
    launches: int = 0
    untimed: int = 0

    def describe(self) -> str:
        """``12.4 GPU-minutes to the decision (search 8.1, confirmation 4.3; engine start
        5.0, warm-up 0.4, levels 6.8, stop 0.2) over 9 launches``."""
        names = {"engine_start": "engine start", "warmup": "warm-up"}
        phases = ", ".join(f"{names.get(k, k)} {v:.1f}" for k, v in self.by_phase.items())
        untimed = f", {self.untimed} of them not timed" if self.untimed else ""
        return (
            f"{self.total:.1f} GPU-minutes to the decision (search {self.search:.1f}, "
            f"confirmation {self.confirmation:.1f}; {phases or 'no phase timed'}) over "
            f"{self.launches} launches{untimed}"
        )


class Decisions(_Part):
    """What happened to the trials that were not promoted, by kind (free-form entries)."""

    pruned: list[dict[str, Any]] = Field(default_factory=list)
    failed: list[dict[str, Any]] = Field(default_factory=list)
    duplicates: list[dict[str, Any]] = Field(default_factory=list)
    interrupted: list[dict[str, Any]] = Field(default_factory=list)
    infeasible: list[dict[str, Any]] = Field(default_factory=list)


class Manifest(Record):
    KIND = "optimization manifest"
    SCHEMA_VERSION = 2

    schema_version: int = 2

    schema_: str = Field(default=SCHEMA, alias="schema")
    created: str | None = None  # ISO 8601 UTC
    study: str | None = None
    promoted: PromotedConfig | None = None
    decision: DecisionRecord | NoDecision | None = Field(default=None, union_mode="left_to_right")
    measurements: Measurements | None = None
    verdicts: Verdicts | None = None
    sla: SlaSummary | None = None
    pareto_front: list[int] = Field(default_factory=list)  # trial numbers, ranked
    # What the Pareto chart says beside its points so that it agrees with the decision: why
    # the promoted point is off the front, that it does not meet the SLA, why a point on the
    # front was not promoted (empty: nothing to say, or an older manifest).
    pareto_notes: list[str] = Field(default_factory=list)
    provenance: Provenance | None = None
    decisions: Decisions | None = None
    lossy_tier: LossyTier | None = None  # search.allow_lossy: both winners, gain and price
    gpu_minutes: GpuAccount | None = None  # what the decision cost (None: an older manifest)

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    def to_data(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
