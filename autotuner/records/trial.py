"""What a study keeps about each trial, and what each launch writes to its ``trial.json``.

:class:`TrialRecord` is kept as Optuna user attributes, one per field under the field's name
(``role``, ``params_full``, ``metrics``, ...), so that optuna-dashboard and anyone reading the
study with Optuna alone sees them. A trial's attributes are written in steps (role on ask,
result on tell), each step through a record holding only the fields it sets; reading takes
every field at once. Studies written before the record had a ``schema_version`` attribute
have the same attributes and read as version 0. Version 2 (issue 16) added ``capacity``;
older trials have none, and readers fall back to ``max_load``.

:class:`TrialFile` is ``trial.json``: a launch's result with every load level, written by
the trial (or the executor that ran it) and read by promotion and the placement report.
Version 2 added the launch's ``capacity`` and each level's verdicts; a version 0/1 file gets
a capacity derived from its levels (the highest load that met the SLA, ``stopped_by``
``legacy``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from autotuner.core.types import ParamValue
from autotuner.records.base import Record
from autotuner.records.owner import ProcessOwner

TrialStatus = Literal["complete", "stopped_early", "failed"]
Role = Literal["baseline", "candidate"]
SetAttr = Callable[[str, Any], None]

# A load (req/s, or concurrent requests) as a record may hold it: finite, >= 0 and far below
# what overflows the arithmetic on it (a tampered 1e300 made a confirmation's exp() overflow).
# No engine comes near the bound, so a value beyond it is a damaged or edited file.
MAX_LOAD = 1e12
Load = Annotated[float, Field(ge=0, le=MAX_LOAD, allow_inf_nan=False)]


class _Trial(Protocol):
    """An Optuna trial, live or frozen: what reading its record needs."""

    @property
    def number(self) -> int: ...

    @property
    def user_attrs(self) -> dict[str, Any]: ...


class SustainableRecord(BaseModel):
    """How far below the SLA's own load a launch that missed there holds every limit.

    Measured only when the first level missed on limits that less load relieves (latency,
    errors, an engine that fell behind; never memory): ``value`` is the highest load below
    ``target`` (the SLA's own load) measured to meet every limit (0: none of the loads tried
    did, down to ``lowest``), ``high`` the lowest load above it that missed (``target`` at
    most). It is no capacity: the SLA's load was not met, and the capacity stays 0.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    value: Load
    high: Load | None
    target: Annotated[float, Field(gt=0, le=MAX_LOAD, allow_inf_nan=False)]
    unit: str
    lowest: Load  # the lowest load tried
    levels: int = 0  # load levels the search below the SLA's load spent
    # resolution, budget, infeasible (down to the lowest load there is), undecided, or
    # not_by_load (a level missed a limit less load cannot fix)
    stopped_by: str = ""

    @property
    def not_by_load(self) -> bool:
        """Whether the search stopped on a miss that less load did not shrink."""
        return self.stopped_by == "not_by_load"

    @property
    def short(self) -> float | None:
        """The share of the SLA's load it falls short by (0.16: 16 % short); None: none held."""
        return 1 - self.value / self.target if self.value > 0 else None

    def replicas(self) -> int | None:
        """Data-parallel copies that would carry the SLA's load at this rate each (a plan from
        the measured rate, not a measurement); None when no rate held."""
        if self.value <= 0:
            return None
        return max(1, math.ceil(self.target / self.value * (1 - 1e-9)))

    def describe(self) -> str:
        """``holds the SLA's limits up to 4.3 req/s; the SLA asks 5: 16% short``."""
        unit = self.unit
        if self.short is None:
            why = "; the miss does not shrink with the load" if self.not_by_load else ""
            return (
                f"holds the SLA's limits at no load tried below the SLA's {self.target:.3g} "
                f"{unit} (down to {self.lowest:.3g} {unit}{why})"
            )
        return (
            f"holds the SLA's limits up to {self.value:.3g} {unit}; the SLA asks "
            f"{self.target:.3g}: {self.short:.0%} short"
        )


class CapacityRecord(BaseModel):
    """A launch's capacity: the highest load that meets the SLA, inside a bracket.

    ``low`` is the highest load measured to meet the SLA (0: none did), ``high`` the lowest
    load above it that missed or stayed undecided (None: none did), ``value`` the capacity
    claimed: ``low``, only what was shown (records written before issue 28 may hold an
    interpolated value between them). ``stopped_by`` says why the search ended
    (``resolution``: the bracket is within ``resolution``; ``budget``: the launch's levels
    were spent; ``max_rate``;
    ``infeasible_at_start``, ``infeasible``, ``undecided``; ``legacy``: derived from a record
    written before capacities) and ``note`` says it in words.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    value: Load
    low: Load
    high: Load | None
    unit: str  # "req/s", or "concurrent requests" for a closed-loop workload
    stopped_by: str
    note: str = ""
    resolution: float | None = None
    # Where a launch that missed the SLA's own load still holds every limit (None: not
    # measured, and in records written before it was).
    sustainable: SustainableRecord | None = None

    @property
    def width(self) -> float | None:
        """(high - low) / low, the bracket's relative width (None: open or nothing met)."""
        if self.high is None or self.low <= 0:
            return None
        return (self.high - self.low) / self.low

    def describe(self) -> str:
        """``4.1 req/s [4.0, 4.12]`` (or ``0 req/s: ...`` when nothing met the SLA)."""
        if self.low <= 0:
            return f"0 {self.unit} ({self.note or self.stopped_by})"
        high = "open" if self.high is None else f"{self.high:.3g}"
        return f"{self.value:.3g} {self.unit} [{self.low:.3g}, {high}]"


def legacy_capacity(
    loads: Sequence[tuple[float, bool]], load_kind: str, best: int | None
) -> CapacityRecord | None:
    """The capacity a record without one implies: the highest load that met the SLA (the
    level ``best``) and the lowest load above it that did not. None without levels."""
    if not loads:
        return None
    unit = "req/s" if load_kind == "rate" else "concurrent requests"
    low = loads[best][0] if best is not None and 0 <= best < len(loads) else 0.0
    above = [load for load, ok in loads if not ok and load > low]
    high = min(above) if above else None
    note = "derived from a record written before capacities were measured"
    return CapacityRecord(value=low, low=low, high=high, unit=unit, stopped_by="legacy", note=note)


METRIC_ATTR = "metric:"  # prefix of the user attribute of each measured metric
CONSTRAINT_ATTR = "constraint:"  # prefix of the user attribute of each constraint's margin


def _numbers(prefix: str, values: Mapping[str, float | None]) -> dict[str, float]:
    """``values`` that are finite numbers, one attribute each (a None or NaN would make the
    dashboard treat the whole column as text)."""
    return {
        f"{prefix}{name}": float(v)
        for name, v in values.items()
        if isinstance(v, int | float) and math.isfinite(v)
    }


class TrialRecord(Record):
    """A trial as the study keeps it (Optuna user attributes)."""

    KIND = "trial record"
    SCHEMA_VERSION = 2

    schema_version: int = 2
    role: Role | None = None
    config_key: str | None = None  # canonical JSON of the full engine params
    params_full: dict[str, ParamValue] | None = None  # fixed and suggested params together
    result_file: str | None = None  # trial.json, relative to the study directory
    status: TrialStatus | None = None
    max_load: float | None = None  # highest load that met the SLA
    capacity: CapacityRecord | None = None  # the launch's capacity search (version 2)
    metrics: dict[str, float | None] = Field(default_factory=dict)
    reason: str | None = None  # why it was pruned, stopped early, failed or missed the SLA
    cause: str | None = None  # launch failure class
    duplicate_of: int | None = None  # an earlier trial with the same config: result reused
    interrupted: bool = False  # left RUNNING by a crash and failed at the next start
    requeued_from: int | None = None  # the interrupted trial whose config this one re-runs
    # The sampled trial, pruned out of reach, whose proposal this config is moved toward
    # (search.nearby.into_reach): a search candidate, enqueued only to run as it was moved.
    moved_from: int | None = None
    owner: ProcessOwner | None = None  # the tuner that asked it (None: an older tuner's trial)
    # The trial's Optuna constraints (<= 0 met), repeated here because optuna-dashboard reads
    # only the pre-5.0 list form of Optuna's own (see :meth:`attrs`).
    constraints: dict[str, float] = Field(default_factory=dict)
    # A candidate raced against the incumbent (search.study): the load of its first level
    # (the incumbent's capacity, its bracket's low end) and the incumbent's trial number.
    # A candidate that missed there is PRUNED, with no capacity: only this level.
    race_level: float | None = None
    race_incumbent: int | None = None
    # Devices x wall seconds of the launch, by phase (TrialFile.gpu_seconds).
    gpu_seconds: dict[str, float] = Field(default_factory=dict)

    @classmethod
    def from_trial(cls, trial: _Trial) -> TrialRecord:
        """The record of ``trial``, from its user attributes (other attributes ignored)."""
        return cls.from_data(trial.user_attrs, f"trial {trial.number}")

    @property
    def baseline(self) -> bool:
        return self.role == "baseline"

    @property
    def duplicate(self) -> bool:
        return self.duplicate_of is not None

    def queued_note(self) -> str | None:
        """Why a WAITING trial waits (its values aren't Optuna params until it is asked)."""
        if self.requeued_from is not None:
            return f"trial {self.requeued_from}'s config, queued again"
        if self.moved_from is not None:
            return f"trial {self.moved_from}'s proposal moved within reach, queued"
        return None

    def params_or(self, fallback: Mapping[str, Any]) -> dict[str, Any]:
        """The full params, or ``fallback`` (Optuna's suggested params) when never recorded."""
        return dict(self.params_full if self.params_full is not None else fallback)

    def attrs(self) -> dict[str, Any]:
        """The fields given to this record (not the defaults), as user attributes, stamped
        with the schema version.

        A dashboard sorts and filters trials by user attributes that hold a number, so given
        ``metrics`` and ``constraints`` are spread out as well, one number each:
        ``metric:<name>`` (measured values), ``constraint:<key>`` (margins, <= 0 met) and
        ``feasible`` (1 when every constraint is met, else 0). Reading ignores them.
        """
        given = self.model_dump(mode="json", exclude_unset=True, exclude={"schema_version"})
        out = {"schema_version": self.schema_version, **given}
        if "metrics" in given:
            out.update(_numbers(METRIC_ATTR, self.metrics))
        if "constraints" in given:
            out.update(_numbers(CONSTRAINT_ATTR, self.constraints))
            out["feasible"] = int(all(v <= 0 for v in self.constraints.values()))
        return out

    def save(self, set_attr: SetAttr) -> None:
        """Write :meth:`attrs` through ``set_attr`` (``trial.set_user_attr``, or the storage's
        setter for a trial of another process)."""
        for key, value in self.attrs().items():
            set_attr(key, value)


class PromotionNote(BaseModel):
    """The promotion as the study remembers it (`autotuner report` shows it)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    promoted: str  # config label: "baseline" or "trial-<n>"
    trial: int
    reason: str
    time: str  # ISO 8601, the manifest's ``created``


class StudyRecord(Record):
    """What the study keeps about itself (Optuna study user attributes, one per field)."""

    KIND = "study record"

    identity: dict[str, str] | None = None  # what must not change within one study
    # Objective metrics, in the study's direction order
    objectives: list[str] = Field(default_factory=list)
    promotion: PromotionNote | None = None
    # A fresh re-tune's first trial number: its decision rests on the launches from it on
    # (the engine defaults measured again among them); earlier ones may be out of date (a
    # failed re-check) and never decide. None: every launch counts.
    fresh_from: int | None = None

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], study_name: str) -> StudyRecord:
        return cls.from_data(attrs, f"study {study_name}")

    def save(self, set_attr: SetAttr) -> None:
        """Write the fields given to this record (``study.set_user_attr``)."""
        given = self.model_dump(mode="json", exclude_unset=True, exclude={"schema_version"})
        for key, value in {"schema_version": self.schema_version, **given}.items():
            set_attr(key, value)


class LevelRecord(BaseModel):
    """One load level of a launch (part of :class:`TrialFile`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    load: Load  # arrival rate (req/s) or concurrency
    feasible: bool
    metrics: dict[str, float | None]
    margins: dict[str, float | None]  # per constraint key; None = not measurable
    errors: dict[str, int]
    engine: dict[str, Any]  # the engine's own metrics over the level
    result_file: str  # the level's load result, next to trial.json
    # Version 2: the level's verdict (meets / misses / undecided; None in older files), each
    # constraint's, the requests it measured and how many runs at this load were pooled.
    verdict: Literal["meets", "misses", "undecided"] | None = None
    verdicts: dict[str, Literal["meets", "misses", "undecided"]] = Field(default_factory=dict)
    requests: int | None = None
    runs: int = 1
    # What the warm-up to steady state before the level took (a launch's first level:
    # requests, seconds, steady or the bound that ended it; autotuner.measure.steady).
    warmup: dict[str, Any] | None = None
    # The rates the level sent and served (req/s) and whether the engine kept up; None in
    # older files, for closed-loop levels, and where too few requests succeeded to tell.
    sent_rate: float | None = None
    served_rate: float | None = None
    sustained: bool | None = None
    # How the load generator kept to its schedule (autotuner.measure.pacing): the share of the
    # scheduled rate it sent at, its latest send's lag, whether it fell behind; None in older
    # files and where a level sent fewer than two requests.
    rate_kept: float | None = None
    max_lag_s: float | None = None
    generator_behind: bool | None = None
    # Wall seconds of the level's warm-up requests (its runs together); None in older files.
    warmup_s: float | None = None
    # Why a level that met the SLA is undecided: too short for a steady load
    # (autotuner.measure.span); None where it was not, and in older files.
    short_note: str | None = None


class TrialFile(Record):
    """``trial.json``: what one launch measured, or why it could not be measured."""

    KIND = "trial file"
    SCHEMA_VERSION = 2

    schema_version: int = 2
    params: dict[str, ParamValue]
    status: TrialStatus
    load_kind: Literal["rate", "concurrency"]
    levels: list[LevelRecord] = Field(default_factory=list)
    best: int | None = None  # index of the best level that met every constraint
    reason: str | None = None
    cause: str | None = None
    startup_s: float | None = None
    argv: list[str] = Field(default_factory=list)
    log_path: str | None = None
    duration_s: float = 0.0
    # Wall-clock span, executor, node, GPUs, log tail
    extra: dict[str, Any] = Field(default_factory=dict)
    capacity: CapacityRecord | None = None  # the launch's capacity search (version 2)
    # Devices the config's layout took (tensor x pipeline x data parallel; on a CPU target,
    # engine ranks); None in files written before it was recorded.
    devices: int | None = None
    # Devices x wall seconds, by phase: ``engine_start`` (launch to healthy, a failed start
    # included), ``warmup`` (the levels' warm-up requests), ``levels`` (measured load),
    # ``stop`` (stopping the engine); empty in files written before it was recorded.
    gpu_seconds: dict[str, float] = Field(default_factory=dict)
    # Derived from the above, written for readers of the file.
    feasible: bool = False
    max_load: float | None = None

    @classmethod
    def upgrade(cls, data: dict[str, Any], version: int) -> dict[str, Any]:
        """Versions 0 and 1 have no capacity: derive it from the levels."""
        levels = data.get("levels")
        if data.get("capacity") is not None or not isinstance(levels, list):
            return data
        try:
            loads = [(float(lv["load"]), bool(lv["feasible"])) for lv in levels]
        except (KeyError, TypeError, ValueError):
            return data  # not the shape of a trial file: validation says what is wrong
        best = data.get("best")
        derived = legacy_capacity(
            loads, str(data.get("load_kind")), best if isinstance(best, int) else None
        )
        return {**data, "capacity": None if derived is None else derived.model_dump()}


def launched_files(
    trials: Iterable[tuple[int, TrialRecord]], study_dir: Path
) -> Iterator[tuple[int, TrialFile]]:
    """Each launched trial's readable ``trial.json`` (by its record's ``result_file``) with
    its number; trials that launched nothing, or whose file cannot be read, are left out."""
    for number, record in trials:
        if not record.result_file:
            continue
        trial = TrialFile.read_or_none(study_dir / record.result_file)
        if trial is not None:
            yield number, trial
