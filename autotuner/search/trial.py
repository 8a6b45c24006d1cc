"""One trial: launch one candidate config once and find the highest load it sustains.

Engine start-up (40-130 s) dwarfs a load run, so a launch measures several load levels. The
first is the SLA's own workload: a config that misses the SLA there is infeasible and is
stopped after that level. Otherwise the arrival rate is raised step by step until a level
misses the SLA, then bisected between the last level that met it and the first that did not.

What the trial reports: feasibility and constraint margins at the SLA's own load (level 1),
latency and memory objectives there too (comparable across configs), and throughput-like
objectives (goodput, request rate, tokens/s) at the highest load that met the SLA — the
"SLA goodput" of the config. ``run_trial`` is a plain function of its inputs, so that a Ray
worker can run it as well. Closed-loop workloads search the concurrency instead of the rate.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotuner.core.paths import atomic_write_text
from autotuner.core.types import ParamValue
from autotuner.engines.base import Endpoint, EngineLaunchError, EngineProcess
from autotuner.measure.bench import adapter_of, arrival_of, build_plan, make_engine
from autotuner.measure.evaluate import Evaluation, evaluate
from autotuner.measure.loadgen import LoadResult, run_load
from autotuner.measure.monitor import Monitor
from autotuner.measure.workload import Arrival
from autotuner.records.trial import TrialFile
from autotuner.sla.spec import Sla

Say = Callable[[str], None]
Status = Literal["complete", "stopped_early", "failed"]

# Measured at the best level that met the SLA; every other metric at the SLA's own load.
THROUGHPUT_METRICS = frozenset(
    {"goodput", "request_rate", "output_tokens_per_s", "total_tokens_per_s"}
)


@dataclass(frozen=True)
class SearchSettings:
    """How one launch searches load levels."""

    max_levels: int = 4
    step: float = 1.5  # rate (or concurrency) factor between levels before bisecting
    min_gap: float = 0.1  # stop bisecting when levels are closer than this (relative)
    start_load: float | None = None  # first level's rate/concurrency; None: the SLA's own


@dataclass(frozen=True)
class Level:
    """One load level measured on the running engine."""

    load: float  # arrival rate (req/s) or concurrency
    feasible: bool
    metrics: dict[str, float | None]
    margins: dict[str, float | None]  # per constraint key; None = not measurable
    errors: dict[str, int]
    engine: dict[str, Any]
    result_file: str


@dataclass(frozen=True)
class TrialResult:
    """What one launch measured, or why it could not be measured."""

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

    @property
    def feasible(self) -> bool:
        return self.best is not None

    def metric(self, name: str) -> float | None:
        """A metric as the trial reports it (see the module docstring)."""
        if not self.levels:
            return None
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


def _finite(m: float) -> float | None:
    return None if m == float("inf") else m


def _missed(ev: Evaluation) -> str:
    return ", ".join(v.key for v in ev.verdicts if not v.met)


def next_load(
    current: float, feasible: bool, ok: float | None, bad: float | None, s: SearchSettings
) -> float | None:
    """The next level to try, or None when the bracket is narrow enough."""
    ok = current if feasible and (ok is None or current > ok) else ok
    bad = current if not feasible and (bad is None or current < bad) else bad
    if ok is not None and bad is not None:
        if (bad - ok) / bad < s.min_gap:
            return None
        return (ok + bad) / 2
    return current * s.step if feasible else current / s.step


def _arrival(base: Arrival, load: float) -> Arrival:
    if base.open_loop:
        return Arrival(base.process, rate=load)
    return Arrival("concurrency", concurrency=max(1, round(load)))


async def _measure_levels(
    sla: Sla,
    engine: EngineProcess,
    endpoint: Endpoint,
    model_dir: Path,
    run_dir: Path,
    settings: SearchSettings,
    gpus: list[str] | None,
    say: Say,
    engine_gpus: dict[str, int],
) -> tuple[list[Level], str | None]:
    """Load levels until the highest one that meets the SLA is bracketed. ``engine_gpus``
    gets, per GPU UUID, the peak memory NVML saw the engine's processes hold there."""
    base = arrival_of(sla)
    load: float | None = settings.start_load
    if load is None:
        load = base.rate if base.open_loop else float(base.concurrency or 1)
    ok: float | None = None
    bad: float | None = None
    levels: list[Level] = []
    stop_reason = None
    for i in range(settings.max_levels):
        assert load is not None
        plan = build_plan(sla, model_dir, _arrival(base, load), level=i)
        metrics = adapter_of(sla).metrics
        monitor = Monitor(endpoint.base_url, engine.processes, gpus, metrics=metrics)
        result = await run_load(endpoint.base_url, endpoint.model, plan, around=monitor)
        result = LoadResult(
            result.plan, result.records, result.duration_s, result.warmup_failed, monitor.summary()
        )
        for uuid, held in result.monitor.get("engine_gpus", {}).items():
            engine_gpus[uuid] = max(engine_gpus.get(uuid, 0), held)
        ev = evaluate(result, sla)
        name = f"level-{i}.json"
        atomic_write_text(run_dir / name, json.dumps(result.to_dict()))
        levels.append(
            Level(
                load=load,
                feasible=ev.feasible,
                metrics=ev.metrics,
                margins={v.key: _finite(v.margin) for v in ev.verdicts},
                errors=result.errors(),
                engine=result.monitor.get("engine", {}),
                result_file=name,
            )
        )
        goodput = ev.metrics.get("goodput")
        say(
            f"    level {i + 1}: {_arrival(base, load).describe()} -> "
            f"{'meets SLA' if ev.feasible else 'misses SLA'}, goodput "
            f"{goodput if goodput is None else f'{goodput:.2f}'} req/s"
        )
        if i == 0 and not ev.feasible:
            stop_reason = f"misses the SLA at {_arrival(base, load).describe()} ({_missed(ev)})"
            break
        if ev.feasible:
            ok = load if ok is None or load > ok else ok
        else:
            bad = load if bad is None or load < bad else bad
        load = next_load(load, ev.feasible, ok, bad, settings)
        if load is None:
            break
    return levels, stop_reason


def run_trial(
    params: Mapping[str, ParamValue],
    sla: Sla,
    *,
    python: Path,
    model_dir: Path,
    run_dir: Path,
    cuda_devices: list[str] | None,
    settings: SearchSettings | None = None,
    say: Say = print,
) -> TrialResult:
    """Launch ``params``, search load levels, always stop the engine, return what was seen.

    Launch failures are results (status ``failed`` with the classified cause), not raised.
    """
    settings = settings or SearchSettings()
    run_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(sla, python, model_dir, params, run_dir / "engine.log", cuda_devices)
    load_kind: Literal["rate", "concurrency"] = (
        "rate" if arrival_of(sla).open_loop else "concurrency"
    )
    started = time.monotonic()
    started_at = time.time()
    engine_gpus: dict[str, int] = {}

    async def go() -> TrialResult:
        try:
            endpoint = await engine.launch()
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
        try:
            levels, reason = await _measure_levels(
                sla,
                engine,
                endpoint,
                model_dir,
                run_dir,
                settings,
                engine.cuda_devices,
                say,
                engine_gpus,
            )
        finally:
            await engine.stop()
        feasible = [i for i, lv in enumerate(levels) if lv.feasible]
        best = max(feasible, key=lambda i: levels[i].load) if feasible else None
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
        )

    result = asyncio.run(go())
    # Wall-clock span and the GPUs NVML saw the engine on: which trials ran side by side where.
    extra = {**result.extra, "started_at": started_at, "ended_at": time.time()}
    if engine_gpus:
        extra["engine_gpus"] = engine_gpus
    result = TrialResult(
        **{**result.__dict__, "duration_s": time.monotonic() - started, "extra": extra}
    )
    result.write(run_dir / "trial.json")
    return result
