"""One candidate config measured end to end on a real engine (the library of `autotuner bench`;
the command is :mod:`autotuner.cli.bench`).

Resolve the model (generate it when the SLA asks for a synthetic one) and the engine
interpreter, launch the engine with the SLA's parameters, load-test it with the SLA's
workload while watching memory and the engine's metrics, stop it (always), then check every
constraint and report.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotuner import __version__
from autotuner.core.errors import EngineCrashed
from autotuner.core.types import ParamValue
from autotuner.engines import envs
from autotuner.engines.base import EngineAdapter, EngineProcess, OptionRoles
from autotuner.engines.process import launch_saying
from autotuner.measure.conversations import synthetic_traffic
from autotuner.measure.evaluate import Evaluation, evaluate
from autotuner.measure.launch import engine_params, make_engine, resolve_model
from autotuner.measure.loadgen import LoadPlan, LoadResult, Progress, run_load
from autotuner.measure.monitor import Monitor
from autotuner.measure.steady import describe as describe_warmup
from autotuner.measure.steady import rule_of
from autotuner.records.bench import BenchResult, VerdictRecord
from autotuner.sla.spec import Sla, context_limit
from autotuner.workload.replay import replay_of, trace_deadline, trace_requests
from autotuner.workload.requests import (
    Arrival,
    LengthDist,
    PromptSource,
    RequestFactory,
)

Say = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def length_dist(spec: Any) -> LengthDist:
    """SLA token-length field (an int or a distribution model) -> :class:`LengthDist`."""
    if isinstance(spec, int):
        return LengthDist.fixed(spec)
    kind = spec.distribution
    if kind == "uniform":
        return LengthDist("uniform", (spec.min + spec.max) / 2, 0.0, spec.min, spec.max)
    return LengthDist(kind, float(spec.mean), float(spec.stddev), spec.min, spec.max)


def arrival_of(sla: Sla) -> Arrival:
    a = sla.workload.arrival
    rate = getattr(a, "rate", None) or getattr(a, "speed", None)  # a trace's speed is its rate
    return Arrival(a.process, rate, getattr(a, "concurrency", None))


# Request indices per load level on one engine (levels with a duration, not a count).
LEVEL_INDEX_STRIDE = 1_000_000


def build_plan(
    sla: Sla,
    model_dir: Path,
    arrival: Arrival | None = None,
    level: int = 0,
    requests: int | None = None,
    *,
    roles: OptionRoles,
) -> LoadPlan:
    """The SLA's workload as a load plan; ``arrival`` overrides the SLA's (rate probing).
    ``roles``: the engine's option roles (its context-length option bounds replayed requests).

    ``level`` > 0 is a later load level on an engine that already served the earlier ones:
    no warm-up, and requests (prompts, dataset rows) that the earlier levels did not send.
    ``requests`` overrides the workload's request count (every level of a launch the same:
    levels sized for a percentile, :mod:`autotuner.measure.levels`).
    """
    w = sla.workload
    replay = replay_of(sla, model_dir, context_limit(sla, roles))
    requests = requests or w.requests or trace_requests(replay)
    arrival = arrival or arrival_of(sla)
    deadline = w.timeout_s
    if deadline is None and (last := trace_deadline(replay, requests, arrival.rate)):
        deadline = last + w.request_timeout_s
    out = length_dist(w.output_tokens) if w.output_tokens is not None else LengthDist.fixed(128)
    factory = RequestFactory(
        api=w.api,
        source=PromptSource.from_model_dir(model_dir),
        input_len=length_dist(w.input_tokens) if w.input_tokens is not None else None,
        output_len=out,
        seed=w.seed,
        first_index=level * (requests or LEVEL_INDEX_STRIDE),
        replay=replay,
    )
    factory, conversation = synthetic_traffic(w, factory)
    return LoadPlan(
        api=w.api,
        factory=factory,
        conversation=conversation,
        arrival=arrival,
        requests=requests,
        duration_s=w.duration_s,
        warmup_requests=0 if level else w.warmup_requests,
        steady=None if level else rule_of(sla, requests),  # the first: warm up to steady state
        request_timeout_s=w.request_timeout_s,
        deadline_s=deadline,
    )


@dataclass(frozen=True)
class BenchOutcome:
    sla_name: str
    params: dict[str, ParamValue]
    argv: tuple[str, ...]
    engine_version: str
    startup_s: float
    result: LoadResult
    evaluation: Evaluation
    log_path: Path

    def to_record(self, with_records: bool = True) -> BenchResult:
        """The bench result (``result.json``); ``with_records=False`` leaves out every
        request's record (the ``--json`` print)."""
        result = self.result.to_dict()
        if not with_records:
            result.pop("records")
        ev = self.evaluation
        return BenchResult(
            tuner_version=__version__,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            sla=self.sla_name,
            engine_version=self.engine_version,
            params=self.params,
            argv=list(self.argv),
            startup_s=self.startup_s,
            errors=self.result.errors(),
            requests=len(self.result.records),
            failed=len(self.result.failed),
            feasible=ev.feasible,
            metrics=ev.metrics,
            verdicts=[VerdictRecord.model_validate(v.to_dict()) for v in ev.verdicts],
            objectives=ev.objectives,
            engine_log=str(self.log_path),
            result=result,
        )

    def to_dict(self, with_records: bool = True) -> dict[str, Any]:
        """:meth:`to_record` in its JSON form."""
        return self.to_record(with_records).to_data()


def _progress_printer(say: Say) -> Callable[[Progress], None]:
    def show(p: Progress) -> None:
        total = f"/{p.total}" if p.total else ""
        say(
            f"  load: {p.done}{total} done, {p.sent - p.done} in flight, "
            f"{p.failed} failed, {p.elapsed_s:.0f} s"
        )

    return show


async def measure(
    sla: Sla,
    engine: EngineProcess,
    model_dir: Path,
    *,
    adapter: EngineAdapter,
    arrival: Arrival | None = None,
    say: Say = _stderr,
) -> tuple[float, LoadResult]:
    """Launch ``engine``, run the SLA's load (or ``arrival``), always stop it. ``adapter``:
    the engine's (its metric names, its option roles).

    Returns the start-up time and the result with the monitor's summary attached. Raises
    :class:`EngineCrashed` when the engine exited during the load.
    """
    plan = build_plan(sla, model_dir, arrival, roles=adapter.roles)
    if plan.factory.replay is not None:
        say(plan.factory.replay.note())
    say(f"starting engine (log: {engine.log_path}) ...")
    try:
        endpoint = await launch_saying(engine, say)
        say(f"engine healthy after {endpoint.startup_s:.0f} s on {', '.join(endpoint.urls)}")
        say(
            f"load: {plan.arrival.describe()}, {plan.requests or ''} requests"
            f"{f', {plan.duration_s:g} s' if plan.duration_s else ''}"
            f", {plan.warmup_requests} warm-up"
        )
        gpus = None if sla.target.kind == "cpu" else list(sla.target.devices)
        metrics = adapter.metrics
        monitor = Monitor(endpoint.urls, engine.processes, gpus, metrics=metrics)
        result = await run_load(
            endpoint.urls,
            endpoint.model,
            plan,
            progress=_progress_printer(say),
            around=monitor,
        )
        summary = monitor.summary()
        if result.warmup is not None:
            say(f"warm-up: {describe_warmup(result.warmup)}")
        result = LoadResult(
            result.plan,
            result.records,
            result.duration_s,
            result.warmup_failed,
            summary,
            warmup_s=result.warmup_s,
            warmup=result.warmup,  # what the warm-up to steady state took, in result.json
            scheduled=result.scheduled,
        )
        if (code := engine.returncode()) is not None:  # died under load: no verdict on the SLA
            raise EngineCrashed(
                f"the engine crashed while measured: it exited with status {code}; "
                f"{len(result.failed)} of {len(result.records)} requests failed (a crash is "
                "no miss of the SLA)"
            )
        return endpoint.startup_s, result
    finally:
        await engine.stop()


async def bench(
    sla: Sla,
    *,
    engine: EngineAdapter,
    overrides: Mapping[str, ParamValue] | None = None,
    run_dir: Path,
    say: Say = _stderr,
) -> BenchOutcome:
    """Measure the SLA's config (plus ``overrides``) on ``engine``, the adapter of the SLA's
    engine kind."""
    model_dir = resolve_model(sla, say)
    python, how = envs.resolve_python(sla.engine.name, sla.engine.python, sla.engine.kind)
    dist, version = envs.probe_version(python)
    say(f"engine: {dist} {version} ({how})")
    params = engine_params(sla, model_dir, overrides, engine=engine)
    process = make_engine(sla, python, model_dir, params, run_dir / "engine.log", engine=engine)
    startup_s, result = await measure(sla, process, model_dir, adapter=engine, say=say)
    return BenchOutcome(
        sla_name=sla.name,
        params=params,
        argv=tuple(process.argv()),
        engine_version=f"{dist} {version}",
        startup_s=startup_s,
        result=result,
        evaluation=evaluate(result, sla),
        log_path=process.log_path,
    )
