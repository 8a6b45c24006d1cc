"""The whole SLA: the top-level model that joins the sections, with the checks that look at
more than one of them, and the size of its load levels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from autotuner.core.yamlpos import KeyPath
from autotuner.sla.base import NAME_RE, Strict, fail, fail_all, show
from autotuner.sla.bounds import MAX_GRID_POINTS, MAX_LEVEL_S
from autotuner.sla.constraints import Constraint, Objective
from autotuner.sla.costs import grid_points, percentile_requests, show_count, span
from autotuner.sla.engine_spec import EngineSpec
from autotuner.sla.metrics import parse_percentile_metric
from autotuner.sla.model_spec import ModelSpec
from autotuner.sla.quality import QualitySpec
from autotuner.sla.target import Target
from autotuner.sla.tuning import TuneSpec
from autotuner.sla.workload import Workload
from autotuner.space import SearchSpec


def _default_objectives() -> list[Objective]:
    return [Objective(metric="capacity", direction="maximize")]


class Sla(Strict):
    """A validated SLA file. Relative paths in it are resolved with ``resolve_path``.

    ``source_path`` is the file it was loaded from (None when parsed from text); it is not a
    field, so it can't be set from YAML and is left out of dumps and comparisons of dumps.
    """

    name: str = "sla"
    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    target: Target = Field(default_factory=Target)
    workload: Workload
    constraints: list[Constraint] = Field(default_factory=list)
    objectives: list[Objective] = Field(default_factory=_default_objectives)
    search: SearchSpec = Field(default_factory=SearchSpec)
    tune: TuneSpec = Field(default_factory=TuneSpec)
    quality: QualitySpec = Field(default_factory=QualitySpec)  # the lossy tier's gate

    _source_path: Path | None = PrivateAttr(default=None)
    _base_dir: Path | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        if len(v) > 100:  # it names directories and files
            raise fail(f"must be at most 100 characters, got {len(v)}")
        if not NAME_RE.match(v):
            raise fail(
                f"must start with a letter or digit and use only letters, digits, "
                f"'_', '.' and '-', got {v!r}"
            )
        return v

    @field_validator("engine", "target", "objectives", "search", "tune", "quality", mode="before")
    @classmethod
    def _empty_section(cls, v: Any, info: ValidationInfo) -> Any:
        # `engine:` with every line below commented out is YAML null: read it as "defaults".
        if v is None and info.field_name is not None:
            return cls.model_fields[info.field_name].get_default(call_default_factory=True)
        return v

    @field_validator("constraints", mode="before")
    @classmethod
    def _constraints_from_mapping(cls, v: Any) -> Any:
        # YAML writes constraints as a mapping; the model keeps them as a list in file order.
        # Errors then carry list indices, which the error mapper turns back into keys.
        if v is None:  # an empty `constraints:` section
            return []
        if isinstance(v, dict):
            return [{"key": k, "limit": limit} for k, limit in v.items()]
        # A list is the model_dump() form: accepted only as such.
        if isinstance(v, list) and all(
            isinstance(c, Constraint) or (isinstance(c, dict) and "key" in c) for c in v
        ):
            return v
        raise fail(f"must be a mapping like {{p99_ttft_ms: 500}}, got {show(v)}")

    @field_validator("constraints")
    @classmethod
    def _one_per_metric(cls, v: list[Constraint]) -> list[Constraint]:
        seen: dict[tuple[str, str], str] = {}
        problems: list[tuple[str, KeyPath]] = []
        for i, c in enumerate(v):
            first = seen.setdefault((c.metric, c.bound), c.key)
            if first != c.key:
                problems.append((f"bounds the same metric as {first!r}", (i,)))
        if problems:
            raise fail_all(problems)
        return v

    @field_validator("objectives")
    @classmethod
    def _distinct_objectives(cls, v: list[Objective]) -> list[Objective]:
        if not v:
            raise fail("give at least one objective, e.g. [{maximize: goodput}]")
        seen: set[str] = set()
        problems: list[tuple[str, KeyPath]] = []
        for i, o in enumerate(v):
            if o.metric in seen:
                problems.append((f"metric {o.metric!r} appears twice", (i,)))
            seen.add(o.metric)
        if problems:
            raise fail_all(problems)
        return v

    @model_validator(mode="after")
    def _search_values(self) -> Sla:
        from autotuner.sla import allowed

        problems = allowed.search_problems(self.engine.kind, self.search, self.engine.settings())
        for name in self.search.baseline:
            override = self.search.params.get(name)
            if override is None or override.fixed is not None or override.exclude:
                problems.append(
                    (
                        f"{name!r} is not searched by this SLA: give it values in "
                        f"search.params, e.g. {name}: {{values: [...]}}",
                        ("search", "baseline", name),
                    )
                )
        if problems:
            raise fail_all(problems)
        return self

    @model_validator(mode="after")
    def _grid_has_values(self) -> Sla:
        if self.tune.sampler == "grid" and not any(
            o.values is not None for o in self.search.params.values()
        ):
            raise fail(
                "the grid sampler tries every combination of the 'values' lists in "
                "search.params, and none has one: give e.g. "
                "search: {params: {max_num_seqs: {values: [128, 256, 512]}}}",
                "tune",
                "sampler",
            )
        points = grid_points(self.search) if self.tune.sampler == "grid" else 0
        if points > MAX_GRID_POINTS:
            sizes = " x ".join(
                f"{len(o.values)} {name}"
                for name, o in self.search.params.items()
                if o.values is not None and len(o.values) > 1
            )
            raise fail(
                f"the grid has {show_count(points)} points ({sizes} values), more than the "
                f"{MAX_GRID_POINTS:,} launches a grid study may make: list fewer values, or "
                "let a sampler choose among them (tune.sampler: auto)",
                "tune",
                "sampler",
            )
        return self

    @model_validator(mode="after")
    def _level_fits(self) -> Sla:
        planned = _planned_level(self)
        if planned is not None:
            raise fail(planned[0], *planned[1])
        return self

    @property
    def source_path(self) -> Path | None:
        return self._source_path

    @source_path.setter
    def source_path(self, value: Path | None) -> None:
        self._source_path = value

    def resolve_path(self, p: str) -> Path:
        """``p`` with ``~`` expanded, relative to the SLA file's directory (else the base dir
        given to ``parse_sla``, else the current directory)."""
        path = Path(p).expanduser()
        if path.is_absolute():
            return path
        if self._source_path is not None:
            base = self._source_path.parent
        elif self._base_dir is not None:
            base = self._base_dir
        else:
            base = Path.cwd()
        return base / path

    def latency_slos(self) -> dict[str, float]:
        """Per-request latency limits for goodput, from the ``p<q>_<metric>_ms`` constraints.

        Keys are ``ttft``/``tpot``/``itl``/``e2e`` (only those constrained); with several
        percentiles of one metric the tightest limit wins.
        """
        slos: dict[str, float] = {}
        for c in self.constraints:
            parsed = parse_percentile_metric(c.metric)
            if parsed is not None and c.bound == "max":
                base = parsed[1]
                slos[base] = min(slos.get(base, c.limit), c.limit)
        return slos


def level_requests(sla: Sla) -> tuple[int | None, int, str | None]:
    """``(requests, needed, hardest)``: the requests each load level sends (None: the
    workload's ``duration_s``, or a trace replayed once, bounds a level), the fewest its
    hardest percentile limit needs (0: none) and that constraint's key. As
    ``autotuner.measure.levels.level_size``: ``workload.requests``, raised to what the
    highest constrained percentile needs, up to ``tune.max_requests_per_level``."""
    needed, hardest = 0, None
    for c in sla.constraints:
        parsed = parse_percentile_metric(c.metric)
        if parsed is None or c.bound != "max" or parsed[0] >= 100:
            continue
        n = percentile_requests(parsed[0] / 100, sla.tune.confidence)
        if n > needed:
            needed, hardest = n, c.key
    base = sla.workload.requests
    if base is None:
        return None, needed, hardest
    cap = sla.tune.max_requests_per_level
    return min(max(base, needed), max(base, cap)), needed, hardest


def _planned_level(sla: Sla) -> tuple[str, KeyPath] | None:
    """Why the longest load level of a launch would take more than ``MAX_LEVEL_S``, and where
    (None: it fits, or only a data file or the engine's pace can tell; see the trace check
    of ``autotuner.sla.files``).

    The first level, at the SLA's own rate, is the longest (the capacity search never goes
    below that rate): its requests at that rate (at most ``duration_s``), plus the think time
    of the last conversation's later turns. A request still running after that gets up to
    ``workload.request_timeout_s`` more."""
    w = sla.workload
    rate: float | None = getattr(w.arrival, "rate", None)
    count, needed, hardest = level_requests(sla)
    send = count / rate if rate is not None and count is not None else None
    by_duration = w.duration_s is not None and (send is None or w.duration_s < send)
    if by_duration:
        assert w.duration_s is not None
        send = w.duration_s
    if send is None:
        return None
    conv = w.conversation
    turns, pause = (conv.turns, conv.think_time_s) if conv is not None else (1, 0.0)
    think = (turns - 1) * pause
    total = send + think
    if total <= MAX_LEVEL_S:
        return None
    at: KeyPath
    if by_duration:
        what = f"workload.duration_s {send:g} s"
        hint, at = "shorten workload.duration_s", ("workload", "duration_s")
    else:
        assert count is not None and rate is not None
        what = f"{count:,} requests at {rate:g} req/s"
        if w.requests is not None and count > w.requests and hardest is not None:
            what += f" ({hardest} at {sla.tune.confidence:.0%} confidence needs {needed:,})"
            hint = f"raise the rate or constrain a lower percentile than {hardest}"
        else:
            hint = "raise the rate or lower workload.requests"
        hint += " (or end each level with workload.duration_s)"
        at = ("workload", "arrival", "rate")
    if think:
        what += f" in {send:,.0f} s, then {turns - 1} later turns x {pause:g} s of think time"
        if think > send:
            hint = "shorten workload.conversation.think_time_s or the conversations"
            at = ("workload", "conversation", "think_time_s")
    return (
        f"a load level is planned to take {span(total)}: {what}; a level may take at most "
        f"{span(MAX_LEVEL_S)}: {hint}",
        at,
    )
