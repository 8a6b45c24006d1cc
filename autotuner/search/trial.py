"""One trial: launch one candidate config once and measure its capacity.

Engine start-up (40-130 s) dwarfs a load run, so a launch measures several load levels: the
capacity search of :mod:`autotuner.measure.capacity`. The first level is the SLA's own
workload; a config that misses the SLA there is infeasible (capacity 0), and when the miss is
on limits less load relieves (latency, errors) a few levels below it measure the load it does
hold (:mod:`autotuner.measure.sustainable`), else it is stopped after that level. A
candidate raced against the incumbent (:mod:`autotuner.search.study`) starts instead at
``SearchSettings.start_load``, the incumbent's capacity, and is stopped after that level if it
misses there.
Otherwise the load grows by ``tune.rate_step`` until a level misses, then the bracket between
the highest level that met the SLA and the lowest that did not is refined (interpolating the
two levels' SLA margins) until it is within ``tune.capacity_resolution`` or ``tune.max_levels``
are spent. A level meets or misses a percentile limit only when the order-statistic interval
of that percentile is clear of the limit (:mod:`autotuner.measure.levels`, which also sizes
the levels); an undecided level is measured once more with fresh requests, pooled with the
first run (its ``level-N.json`` holds both), and counts as a miss if still undecided. Every
level sends requests the engine has not seen: repeated prompts would hit the prefix cache.

What the trial reports: its capacity with the bracket and why the search stopped; feasibility
(the SLA's own load was shown met) and constraint margins at the SLA's own load (level 1),
latency and memory objectives there too (comparable across configs), and throughput-like
objectives (goodput, request rate, tokens/s) at the highest load that met the SLA: goodput at
capacity. ``run_trial`` is a plain function of its inputs, so that a Ray worker can run it as
well. Closed-loop workloads search the concurrency instead of the rate (in whole requests).

An engine that exits while a level runs has crashed: the trial is ``failed`` with cause
``crashed`` (:data:`CRASHED`), the levels measured before are kept for the record, and the
crashed level is neither a miss nor a level of the capacity search: a crashed launch has no
capacity.

Every launch records what it cost, devices x wall seconds by phase (``gpu_seconds``): engine
start, the levels' warm-up requests, the measured levels, and stopping the engine.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotuner.core.paths import atomic_write_text
from autotuner.core.types import ParamValue
from autotuner.engines.base import (
    Endpoint,
    EngineAdapter,
    EngineLaunchError,
    EngineProcess,
)
from autotuner.engines.layout import CAPACITY_PER_GPU
from autotuner.engines.process import ROOT_CAUSE_WINDOW_BYTES, launch_saying, tail
from autotuner.measure.bench import arrival_of, build_plan
from autotuner.measure.cache import cache_note
from autotuner.measure.capacity import Capacity, CapacitySearch
from autotuner.measure.evaluate import evaluate
from autotuner.measure.hostload import HostWatch
from autotuner.measure.launch import layout_of, make_engine
from autotuner.measure.levels import Judgement, judge, level_size, pooled
from autotuner.measure.loadgen import LoadResult, run_load
from autotuner.measure.monitor import Monitor
from autotuner.measure.pacing import describe as describe_pacing
from autotuner.measure.quantile import Outcome
from autotuner.measure.steady import describe as describe_warmup
from autotuner.measure.sustainable import (
    SUSTAINABLE_LEVELS,
    SustainableSearch,
    relieved_by_less_load,
)
from autotuner.measure.sustained import describe as describe_sustained
from autotuner.records.trial import CapacityRecord, TrialFile, legacy_capacity
from autotuner.sla.spec import Sla
from autotuner.workload.requests import Arrival

Say = Callable[[str], None]
Status = Literal["complete", "stopped_early", "failed"]

# A trial's ``cause`` when the engine exited while a load level ran (launch failures have
# the launcher's causes: out_of_memory, unknown_flag, timeout, ...).
CRASHED = "crashed"

# Measured at the best level that met the SLA; every other metric at the SLA's own load.
THROUGHPUT_METRICS = frozenset(
    {"goodput", "request_rate", "output_tokens_per_s", "total_tokens_per_s"}
)


@dataclass(frozen=True)
class SearchSettings:
    """How one launch searches load levels (:class:`CapacitySearch`'s knobs)."""

    max_levels: int = 8
    step: float = 1.5  # rate (or concurrency) factor between levels while bracketing
    resolution: float = 0.03  # stop refining once the bracket is this narrow (relative)
    start_load: float | None = None  # first level's rate/concurrency; None: the SLA's own
    # A capacity claimed earlier: search narrowly around it, not below the SLA's own load
    # (a confirmation replicate; :meth:`CapacitySearch.around`).
    around: float | None = None
    remeasure_undecided: int = 1  # re-measures (pooled) of an undecided level

    @classmethod
    def of(cls, sla: Sla) -> SearchSettings:
        """The search a study's launches run: the SLA's ``tune`` settings."""
        t = sla.tune
        return cls(max_levels=t.max_levels, step=t.rate_step, resolution=t.capacity_resolution)


@dataclass(frozen=True)
class Level:
    """One load level measured on the running engine."""

    load: float  # arrival rate (req/s) or concurrency
    feasible: bool  # the level's verdict is "meets" (older records: every point margin <= 0)
    metrics: dict[str, float | None]
    margins: dict[str, float | None]  # per constraint key; None = not measurable
    errors: dict[str, int]
    engine: dict[str, Any]
    result_file: str
    verdict: Outcome | None = None  # meets / misses / undecided (None: an older record)
    verdicts: dict[str, Outcome] = field(default_factory=dict)  # per constraint key
    requests: int | None = None  # measured requests (pooled runs together)
    runs: int = 1  # runs at this load pooled into the level (2: an undecided one re-measured)
    # What the warm-up before this level took (a launch's first level: measure.steady's
    # WarmupRecord as a dict; None for later levels and older records).
    warmup: dict[str, Any] | None = None
    # The rates the level sent and served, req/s (None: closed loop, too few requests to tell,
    # or an older record), and whether the engine kept up (autotuner.measure.sustained).
    sent_rate: float | None = None
    served_rate: float | None = None
    sustained: bool | None = None
    # How the load generator kept to its schedule (autotuner.measure.pacing; None: an older
    # record): the share of the scheduled rate it sent at, its latest send's lag, and whether
    # it fell behind.
    rate_kept: float | None = None
    max_lag_s: float | None = None
    generator_behind: bool | None = None
    warmup_s: float | None = None  # wall seconds of this run's warm-up requests
    # Why a level that met the SLA is undecided: too short for a steady load
    # (autotuner.measure.span; None: it was not, or an older record).
    short_note: str | None = None

    def sustain_note(self) -> str | None:
        """``not sustained: served 8.1 of 17.1 req/s sent`` when the engine fell behind."""
        if self.sustained is not False or self.sent_rate is None or self.served_rate is None:
            return None
        return describe_sustained(self.sent_rate, self.served_rate, False)

    def pacing_note(self) -> str | None:
        """``load generator behind: sent at 34% of the scheduled rate (sends up to 1.1 s late)``."""
        if not self.generator_behind or self.rate_kept is None or self.max_lag_s is None:
            return None
        return describe_pacing(self.rate_kept, self.max_lag_s)


@dataclass(frozen=True)
class TrialResult:
    """What one launch measured, or why it could not be measured.

    The in-memory form of ``trial.json`` (:class:`~autotuner.records.trial.TrialFile`, with
    :class:`Level` for its ``LevelRecord``): the same fields, plus what the search derives
    from them. :meth:`to_record` / :meth:`from_record` are the one conversion between the two;
    everything that reads or writes the file goes through them (:meth:`write`, :meth:`read`).
    """

    params: dict[str, ParamValue]
    status: Status
    load_kind: Literal["rate", "concurrency"]
    levels: tuple[Level, ...] = ()
    best: int | None = None  # index of the best level that met every constraint
    reason: str | None = None  # why it stopped early / failed
    cause: str | None = None  # launch failure class (out_of_memory, unknown_flag, ...)
    startup_s: float | None = None
    argv: tuple[str, ...] = ()
    log_path: str | None = None
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    capacity: CapacityRecord | None = None  # None: a failed launch, or an older record
    # Devices the config's layout took, as run_trial resolved it through the engine's
    # adapter: what capacity per GPU divides by. None: not recorded (a stand-in's result, a
    # record written before), counted as one; a reader of such records that needs the
    # per-GPU value computes it from ``params`` and the adapter's roles (bundle.promote).
    devices: int | None = None
    # Devices x wall seconds by phase (engine_start, warmup, levels, stop): what the launch
    # cost (:func:`gpu_seconds`); empty for a result that was not timed (a test's stand-in).
    gpu_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.best is not None

    def found_capacity(self) -> CapacityRecord | None:
        """The launch's capacity; for a result without one (written before capacities, or
        a test's stand-in), the one its levels imply: the highest load that met the SLA.
        None for a failed launch (it did not start, or crashed while measured)."""
        if self.status == "failed":
            return None
        if self.capacity is not None:
            return self.capacity
        loads = [(lv.load, lv.feasible) for lv in self.levels]
        return legacy_capacity(loads, self.load_kind, self.best)

    def metric(self, name: str) -> float | None:
        """A metric as the trial reports it (see the module docstring)."""
        if not self.levels:
            return None
        if name in ("capacity", CAPACITY_PER_GPU):
            cap = self.found_capacity()
            if cap is None:
                return None
            return cap.value if name == "capacity" else cap.value / (self.devices or 1)
        if name == "peak_memory_gib":
            peaks = [v for lv in self.levels if (v := lv.metrics.get(name)) is not None]
            return max(peaks) if peaks else None
        level = self.levels[0]
        if name in THROUGHPUT_METRICS and self.best is not None:
            level = self.levels[self.best]
        return level.metrics.get(name)

    def margins(self) -> dict[str, float | None]:
        """Constraint margins at the SLA's own load (<= 0 met; None = not measurable)."""
        return dict(self.levels[0].margins) if self.levels else {}

    @property
    def max_load(self) -> float | None:
        """The highest load level that met every constraint (the SLA goodput for rates)."""
        return self.levels[self.best].load if self.best is not None else None

    def to_record(self) -> TrialFile:
        """What ``trial.json`` holds (derived ``feasible`` and ``max_load`` included)."""
        return TrialFile.model_validate(
            {**asdict(self), "feasible": self.feasible, "max_load": self.max_load}
        )

    @classmethod
    def from_record(cls, r: TrialFile) -> TrialResult:
        return cls(
            params=dict(r.params),
            status=r.status,
            load_kind=r.load_kind,
            levels=tuple(Level(**lv.model_dump()) for lv in r.levels),
            best=r.best,
            reason=r.reason,
            cause=r.cause,
            startup_s=r.startup_s,
            argv=tuple(r.argv),
            log_path=r.log_path,
            duration_s=r.duration_s,
            extra=dict(r.extra),
            capacity=r.capacity,
            devices=r.devices,
            gpu_seconds=dict(r.gpu_seconds),
        )

    def to_dict(self) -> dict[str, Any]:
        return self.to_record().to_data()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        return cls.from_record(TrialFile.from_data(d, "trial result"))

    def write(self, path: Path) -> None:
        """Write ``trial.json`` (atomically)."""
        self.to_record().write(path)

    @classmethod
    def read(cls, path: Path) -> TrialResult:
        return cls.from_record(TrialFile.read(path))


def _arrival(base: Arrival, load: float) -> Arrival:
    if base.open_loop:
        return Arrival(base.process, rate=load)
    return Arrival("concurrency", concurrency=max(1, round(load)))


def _own_load(base: Arrival) -> float:
    """The SLA's own load: its arrival rate, or its concurrency."""
    return float(base.rate) if base.open_loop and base.rate else float(base.concurrency or 1)


def own_load(sla: Sla) -> float:
    """The SLA's own load (arrival rate, concurrency, or a trace's speed): the first level of
    a launch that is not raced."""
    return _own_load(arrival_of(sla))


def capacity_search(settings: SearchSettings, own: float, open_loop: bool) -> CapacitySearch:
    """The capacity search of one launch: from the SLA's own load (or ``start_load``), never
    below it; around a claimed capacity for a confirmation replicate."""
    unit = "req/s" if open_loop else "concurrent requests"
    quantum = None if open_loop else 1.0
    if settings.around is not None:
        # Start at or above the SLA's own load: a capacity below it does not meet the SLA.
        claimed = max(settings.around, own * (1 + settings.resolution))
        return CapacitySearch.around(
            claimed,
            resolution=settings.resolution,
            max_levels=settings.max_levels,
            min_rate=own,
            quantum=quantum,
            remeasure_undecided=settings.remeasure_undecided,
            unit=unit,
        )
    return CapacitySearch(
        settings.start_load or own,
        resolution=settings.resolution,
        max_levels=settings.max_levels,
        step=settings.step,
        quantum=quantum,
        remeasure_undecided=settings.remeasure_undecided,
        unit=unit,
    )


def _keys(verdicts: Mapping[str, Outcome], outcome: Outcome) -> str:
    return ", ".join(k for k, v in verdicts.items() if v == outcome)


def describe_stop(
    cap: Capacity, levels: list[Level], base: Arrival, settings: SearchSettings
) -> str:
    """Why the capacity search ended, in words (which budget, or what the first level saw)."""
    width = cap.width
    if cap.stopped_by == "resolution":
        return f"bracket within the resolution {settings.resolution:.0%}"
    if cap.stopped_by == "budget":
        spent = f"the level budget (tune.max_levels = {settings.max_levels}) was spent"
        if cap.low <= 0:  # a confirmation replicate stepping down from its claim
            lowest = min((lv.load for lv in levels), default=0.0)
            return f"{spent} before any level was shown to meet the SLA (lowest: {lowest:.3g})"
        if width is None:
            return f"{spent} before any level missed the SLA: capacity is at least {cap.low:.3g}"
        return f"{spent} with the bracket {width:.1%} wide (resolution {settings.resolution:.0%})"
    if cap.stopped_by == "max_rate":
        return f"met the SLA at the highest load tried, {cap.low:.3g}"
    last = levels[-1] if levels else None  # nothing met: the last level is the lowest load
    if last is None:
        return str(cap.stopped_by)
    at = _arrival(base, last.load).describe()
    if cap.stopped_by == "undecided":
        unsure = last.pacing_note() or (
            f"{_keys(last.verdicts, 'undecided')} undecided after {last.requests} requests"
        )
        return f"could not tell whether it meets the SLA at {at}: {unsure}"
    why = [k for k in (_keys(last.verdicts, "misses"), last.sustain_note()) if k]
    return f"misses the SLA at {at} ({'; '.join(why)})"


class _Crashed(Exception):
    """The engine exited while level ``level`` (0-based) ran."""

    def __init__(self, level: int, load: float, code: int, result: LoadResult) -> None:
        super().__init__(f"engine exited with status {code} during level {level + 1}")
        self.level = level
        self.load = load
        self.code = code
        self.requests = len(result.records)
        self.failed = len(result.failed)


def crash_reason(
    level: int, at: str, code: int, requests: int, failed: int, root: list[str]
) -> str:
    """``the engine crashed during level 2 (poisson 3 req/s): ...`` for records and reports."""
    why = f": {root[0]}" if root else ""
    return (
        f"the engine crashed during level {level + 1} ({at}): it exited with status {code}, "
        f"{failed} of {requests} requests failed{why}; a crash is no miss of the SLA and "
        "gives no capacity"
    )


async def _measure_levels(
    sla: Sla,
    engine: EngineProcess,
    adapter: EngineAdapter,
    endpoint: Endpoint,
    model_dir: Path,
    run_dir: Path,
    settings: SearchSettings,
    gpus: list[str] | None,
    say: Say,
    engine_gpus: dict[str, int],
    levels: list[Level],
) -> CapacityRecord:
    """Load levels until the capacity search ends, appended to ``levels``. ``engine_gpus``
    gets, per GPU UUID, the peak memory NVML saw the engine's processes hold there. Raises
    :class:`_Crashed` when the engine exits during a level."""
    base = arrival_of(sla)
    own = _own_load(base)
    search = capacity_search(settings, own, base.open_loop)
    if base.process == "trace":
        search.unit = "x trace speed"  # the load of a trace is how fast it is replayed
    size = level_size(sla)
    previous: LoadResult | None = None  # the run an undecided level's re-measure pools with
    # (not one the load generator fell behind on: its re-measure starts afresh)
    parts: list[LoadResult] = []  # the runs pooled into ``previous``, each judged for sustain

    async def measure(load: float, extending: bool) -> Judgement:
        """One level at ``load``, appended to ``levels``; what it says."""
        nonlocal previous, parts
        i = len(levels)
        again = extending and previous is not None
        plan = build_plan(
            sla,
            model_dir,
            _arrival(base, load),
            level=i,
            requests=size.requests,
            roles=adapter.roles,
        )
        monitor = Monitor(endpoint.urls, engine.processes, gpus, metrics=adapter.metrics)
        result = await run_load(endpoint.urls, endpoint.model, plan, around=monitor)
        warm = result.warmup_s
        if (warmed := result.warmup) is not None:
            say(f"    warm-up: {describe_warmup(warmed)}")
        result = LoadResult(
            result.plan, result.records, result.duration_s, result.warmup_failed, monitor.summary()
        )
        for uuid, held in result.monitor.get("engine_gpus", {}).items():
            engine_gpus[uuid] = max(engine_gpus.get(uuid, 0), held)
        if (code := engine.returncode()) is not None:
            # Died under load: the level measured a crash, not the config (never a verdict).
            atomic_write_text(run_dir / f"level-{i}-crashed.json", json.dumps(result.to_dict()))
            raise _Crashed(i, load, code, result)
        runs = 1
        parts = [*parts, result] if again else [result]
        if again and previous is not None:
            result = pooled(previous, result)
            runs = levels[-1].runs + 1
        ev = evaluate(result, sla)
        judged = judge(result, ev, sla, sla.tune.confidence, parts)
        verdicts, verdict = judged.verdicts, judged.verdict
        # A run behind its schedule or too short is measured again, not pooled with.
        previous = None if judged.behind or judged.short else result
        name = f"level-{i}.json"
        atomic_write_text(run_dir / name, json.dumps(result.to_dict()))
        levels.append(
            Level(
                load=load,
                feasible=verdict == "meets",
                metrics=ev.metrics,
                margins={v.key: None if math.isinf(v.margin) else v.margin for v in ev.verdicts},
                errors=result.errors(),
                engine=result.monitor.get("engine", {}),
                result_file=name,
                verdict=verdict,
                verdicts=verdicts,
                requests=len(result.records),
                runs=runs,
                sent_rate=kept.sent_rate if (kept := judged.sustained) else None,
                served_rate=kept.served_rate if kept else None,
                sustained=kept.ok if kept else None,
                rate_kept=pace.kept if (pace := judged.pacing) else None,
                max_lag_s=pace.max_lag_s if pace else None,
                generator_behind=pace.behind if pace else None,
                short_note=span.describe() if (span := judged.span) else None,
                warmup=warmed,
                warmup_s=warm,
            )
        )
        goodput = ev.metrics.get("goodput")
        shown = {"meets": "meets SLA", "misses": "misses SLA"}.get(
            verdict,
            "undecided ("
            + (levels[-1].pacing_note() or levels[-1].short_note or _keys(verdicts, "undecided"))
            + ")",
        )
        pooled_note = f", {runs} runs pooled" if runs > 1 else ""
        if note := levels[-1].sustain_note():
            shown += f" ({note})"
        say(
            f"    level {i + 1}: {_arrival(base, load).describe()}, {len(result.records)} "
            f"requests{pooled_note} -> {shown}, goodput "
            f"{goodput if goodput is None else f'{goodput:.2f}'} req/s"
            + (f", {note}" if (note := cache_note(levels[-1].engine)) else "")
        )
        return judged

    while (load := search.next_rate()) is not None:
        judged = await measure(load, search.extending)
        search.record(load, judged.verdict, judged.margin)
    cap = search.result()
    record = cap.to_record(describe_stop(cap, levels, base, settings), settings.resolution)
    say(f"    capacity {record.describe()}" + (f": {record.note}" if record.low > 0 else ""))
    below = _below(sla, settings, cap, levels, own, search.unit)
    if below is None:
        return record
    say(
        f"    missed the SLA's own load on limits less load relieves: measuring below it "
        f"(at most {below.budget} levels)"
    )
    previous, parts = None, []
    while (load := below.next_rate()) is not None:
        judged = await measure(load, False)
        relieved = relieved_by_less_load(sla, judged.verdicts)
        below.record(load, judged.verdict, judged.margin, relieved, _missed_by(levels[-1]))
    held = below.result()
    say(f"    {held.describe()}")
    return record.model_copy(
        update={"sustainable": held, "note": f"{record.note}; {held.describe()}"}
    )


def _below(
    sla: Sla,
    settings: SearchSettings,
    cap: Capacity,
    levels: list[Level],
    own: float,
    unit: str,
) -> SustainableSearch | None:
    """The search below the SLA's own load (:mod:`autotuner.measure.sustainable`), when the
    launch started there (not raced, not a confirmation), missed it on limits less load
    relieves, and has levels left; else None."""
    if settings.around is not None or settings.start_load not in (None, own):
        return None
    if cap.stopped_by != "infeasible_at_start" or not levels:
        return None
    budget = min(SUSTAINABLE_LEVELS, settings.max_levels - len(cap.levels))
    if budget < 1 or not relieved_by_less_load(sla, levels[-1].verdicts):
        return None
    return SustainableSearch(
        own,
        cap.levels[-1].margin,
        missed_by=_missed_by(levels[-1]),
        step=settings.step,
        max_levels=budget,
        quantum=None if arrival_of(sla).open_loop else 1.0,
        unit=unit,
    )


def _missed_by(level: Level) -> float | None:
    """The largest point margin of the limits ``level`` missed (None: none measurable)."""
    return max(
        (
            m
            for k, m in level.margins.items()
            if m is not None and level.verdicts.get(k) == "misses"
        ),
        default=None,
    )


def run_trial(
    params: Mapping[str, ParamValue],
    sla: Sla,
    *,
    python: Path,
    model_dir: Path,
    run_dir: Path,
    cuda_devices: list[str] | None,
    adapter: EngineAdapter,
    settings: SearchSettings | None = None,
    say: Say = print,
) -> TrialResult:
    """Launch ``params`` on the engine of ``adapter`` (the SLA's engine kind's, resolved once
    per study), search load levels, always stop the engine, return what was seen.

    Launch failures are results (status ``failed`` with the classified cause), not raised.
    """
    settings = settings or SearchSettings()
    run_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(
        sla, python, model_dir, params, run_dir / "engine.log", cuda_devices, engine=adapter
    )
    devices = layout_of(sla, params, adapter).devices
    load_kind: Literal["rate", "concurrency"] = (
        "rate" if arrival_of(sla).open_loop else "concurrency"
    )
    started = time.monotonic()
    started_at = time.time()
    engine_gpus: dict[str, int] = {}
    clock: dict[str, float] = {}  # wall seconds by phase (warm-up: from the levels)

    async def go() -> TrialResult:
        try:
            t0 = time.monotonic()
            try:
                endpoint = await launch_saying(engine, say, indent="    ")
            finally:
                clock["engine_start"] = time.monotonic() - t0
        except EngineLaunchError as exc:
            return TrialResult(
                dict(params),
                "failed",
                load_kind,
                reason=exc.message,
                cause=exc.cause.value,
                argv=tuple(engine.argv()),
                log_path=str(engine.log_path),
                extra={"log_tail": exc.log_tail[-2000:], "root_cause": list(exc.root_cause)},
            )
        say(f"    engine healthy after {endpoint.startup_s:.0f} s")
        levels: list[Level] = []
        t0 = time.monotonic()
        try:
            capacity = await _measure_levels(
                sla,
                engine,
                adapter,
                endpoint,
                model_dir,
                run_dir,
                settings,
                engine.cuda_devices,
                say,
                engine_gpus,
                levels,
            )
        except _Crashed as crash:
            return _crashed(crash, levels, endpoint)
        finally:
            t1 = time.monotonic()
            clock["levels"] = t1 - t0
            await engine.stop()
            clock["stop"] = time.monotonic() - t1
        best = _best_level(levels, capacity)
        reason = None if best is not None else capacity.note
        return TrialResult(
            dict(params),
            "stopped_early" if reason else "complete",
            load_kind,
            levels=tuple(levels),
            best=best,
            reason=reason,
            startup_s=endpoint.startup_s,
            argv=tuple(endpoint.argv),
            log_path=str(engine.log_path),
            capacity=capacity,
        )

    def _crashed(crash: _Crashed, levels: list[Level], endpoint: Endpoint) -> TrialResult:
        log = tail(engine.log_path, 1_000_000, max_bytes=ROOT_CAUSE_WINDOW_BYTES)
        root = adapter.root_cause(log)
        at = _arrival(arrival_of(sla), crash.load).describe()
        reason = crash_reason(crash.level, at, crash.code, crash.requests, crash.failed, root)
        say(f"    level {crash.level + 1}: {at} -> engine crashed (exit status {crash.code})")
        return TrialResult(
            dict(params),
            "failed",
            load_kind,
            levels=tuple(levels),
            reason=reason,
            cause=CRASHED,
            startup_s=endpoint.startup_s,
            argv=tuple(endpoint.argv),
            log_path=str(engine.log_path),
            extra={
                "crash": {
                    "level": crash.level + 1,
                    "load": crash.load,
                    "returncode": crash.code,
                    "requests": crash.requests,
                    "failed": crash.failed,
                    "result_file": f"level-{crash.level}-crashed.json",
                },
                "log_tail": "\n".join(log.splitlines()[-40:])[-2000:],
                "root_cause": root,
            },
        )

    # The host is part of the measurement: its load before and during the launch.
    watch = HostWatch()
    watch.start()
    try:
        result = asyncio.run(go())
    finally:
        host = watch.stop()
    # Wall-clock span and the GPUs NVML saw the engine on: which trials ran side by side where.
    extra = {**result.extra, "started_at": started_at, "ended_at": time.time(), "host": host}
    if engine_gpus:
        extra["engine_gpus"] = engine_gpus
    result = TrialResult(
        **{
            **result.__dict__,
            "duration_s": time.monotonic() - started,
            "extra": extra,
            "devices": devices,
            "gpu_seconds": gpu_seconds(devices, clock, result.levels),
        }
    )
    result.write(run_dir / "trial.json")
    return result


def gpu_seconds(
    devices: int, clock: Mapping[str, float], levels: tuple[Level, ...]
) -> dict[str, float]:
    """Devices x wall seconds of one launch by phase: ``engine_start`` (to healthy, or to a
    failed start), ``warmup`` (the levels' warm-up requests), ``levels`` (the rest of the
    measured load), ``stop``. A phase the launch never reached is left out."""
    warm = sum(lv.warmup_s or 0.0 for lv in levels)
    wall = dict(clock)
    if "levels" in wall:
        wall["warmup"] = min(warm, wall["levels"])
        wall["levels"] -= wall["warmup"]
    order = ("engine_start", "warmup", "levels", "stop")
    return {k: round(devices * wall[k], 3) for k in order if k in wall}


def gpu_minutes(phases: Mapping[str, float]) -> float:
    """A launch's GPU-minutes: its GPU-seconds over every phase."""
    return sum(phases.values()) / 60.0


def _best_level(levels: list[Level], capacity: CapacityRecord) -> int | None:
    """The last level measured to meet the SLA at the capacity's low edge (None: none did)."""
    if capacity.low <= 0:
        return None
    for i in range(len(levels) - 1, -1, -1):
        lv = levels[i]
        if lv.feasible and math.isclose(lv.load, capacity.low, rel_tol=1e-9):
            return i
    return None
