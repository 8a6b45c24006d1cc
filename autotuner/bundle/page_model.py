"""What the study page shows (:mod:`autotuner.bundle.page`): a row per launch, the
confirmation's replicates, the page as a whole; every text from outside goes through
:func:`clean`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from autotuner.bundle.capacity_chart import VERDICT_COLORS, LevelPoint, capacity_svg
from autotuner.records.manifest import ReplicateRecord
from autotuner.records.trial import CapacityRecord

UNDECIDED = "replicate, no decision yet"
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# How a status reads where its key alone would say too little: a pruned trial never
# launched; a raced one launched, missed the SLA at the incumbent's capacity and was pruned.
_STATUS_TEXT = {"pruned": "pruned before launch", "raced": "pruned (raced out)"}


def clean(value: object) -> str:
    """``value`` as text with control characters shown as ``\\xNN`` (tab and newline kept)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def clean_params(params: Mapping[str, Any]) -> dict[str, object]:
    return {clean(k): clean(v) if isinstance(v, str) else v for k, v in params.items()}


@dataclass(frozen=True)
class Launch:
    """One engine launch (a search trial or a confirmation replicate), or a trial that never
    launched (pruned, a duplicate, waiting): a row of the launch table."""

    key: str  # "trial-3", "baseline-r0": the row's anchor
    number: int | None  # trial number (None: a confirmation replicate)
    role: str  # baseline / candidate / replicate of <config>
    config: dict[str, object]  # params that differ from the baseline's
    params: dict[str, object]  # every param
    # met / missed / raced / pruned / failed / interrupted / duplicate / running / waiting
    status: str
    reason: str
    capacity: CapacityRecord | None
    duration_s: float | None
    gpus: int | None  # GPUs the launch held (None: not recorded, e.g. a CPU target)
    levels: list[LevelPoint] = field(default_factory=list)
    log_tail: str = ""
    basis: str = "single run"
    startup_s: float | None = None  # the engine's start, part of duration_s
    # A candidate raced out: the one level it ran (the incumbent's capacity) and the incumbent
    race_level: float | None = None
    race_incumbent: int | None = None

    @property
    def gpu_s(self) -> float | None:
        if self.duration_s is None or not self.gpus:
            return None
        return self.duration_s * self.gpus

    @property
    def status_text(self) -> str:
        return _STATUS_TEXT.get(self.status, self.status)

    @property
    def unit(self) -> str:
        return self.capacity.unit if self.capacity else "req/s"

    @property
    def capacity_text(self) -> str:
        c = self.capacity
        if self.status == "raced":  # it missed the one level it ran: nothing is known below it
            return "none"
        if c is None:
            return "-"
        return f"{c.value:.3g}" if c.low > 0 else "0"

    @property
    def capacity_sort(self) -> float:
        """The capacity column's sort key (-1: no capacity known)."""
        if self.status == "raced" or self.capacity is None:
            return -1.0
        return self.capacity.value

    @property
    def bracket_text(self) -> str:
        c = self.capacity
        if self.status == "raced":  # the one level it ran (the reason names the incumbent)
            return "-" if self.race_level is None else f"missed {self.race_level:.3g} {self.unit}"
        if c is None or (c.stopped_by == "legacy" and c.low <= 0):
            return "-"
        if c.low <= 0:  # nothing met: why the search stopped (the reason column says more)
            held = c.sustainable  # and how far below the SLA's load it held every limit
            if held is not None and held.short is not None:
                return f"holds {held.value:.3g} {c.unit} ({held.short:.0%} short)"
            return c.stopped_by.replace("_", " ")
        high = "open" if c.high is None else f"{c.high:.3g}"
        return f"[{c.low:.3g}, {high}] {c.unit}"

    def chart(self) -> Markup:
        c = self.capacity
        title = f"{self.key}: capacity search"
        race = None
        if self.status == "raced" and self.race_level is not None:
            title = f"{self.key}: raced out at {self.race_level:.3g} {self.unit}, one level"
            who = "the incumbent" if self.race_incumbent is None else f"trial {self.race_incumbent}"
            race = (self.race_level, f"{who}'s capacity")
        # The SVG is built from escaped parts (autotuner.bundle.svg): safe to insert as is.
        return Markup(
            capacity_svg(
                self.levels,
                unit=self.unit,
                low=c.low if c else None,
                high=c.high if c else None,
                value=c.value if c else None,
                title=title,
                race=race,
            )
        )


@dataclass(frozen=True)
class Replicates:
    """The confirmation: replicate pairs and the comparison's interval."""

    configs: list[str]  # the config labels compared, the candidate(s) first
    rows: list[dict[str, ReplicateRecord | None]]  # per replicate: label -> record
    comparisons: dict[str, dict[str, Any]]
    planned: int | None  # replicates per config the plan asked for
    finished: bool | None  # the plan's own word (None: no plan file)
    unit: str


@dataclass(frozen=True)
class Page:
    """Everything the template shows."""

    name: str
    state: str  # promoted / not_promoted / failed / running / no_launch
    headline: str
    rests_on: list[str]
    decision_reason: str | None
    identity: dict[str, str]
    objectives: list[str]
    constraints: list[tuple[str, float]]
    promoted: dict[str, Any] | None  # label, params against the baseline, serve command
    launches: list[Launch]
    confirmation: Replicates | None
    pareto: Markup | None
    latency: Markup | None
    missing: list[str]
    notes: list[str]
    # The hardware it was measured on: (field, value per device) from the manifest
    hardware: list[tuple[str, list[str]]] = field(default_factory=list)
    files: list[tuple[str, str]] = field(default_factory=list)  # bundle text files shown whole
    colors: dict[str, str] = field(default_factory=lambda: dict(VERDICT_COLORS))
