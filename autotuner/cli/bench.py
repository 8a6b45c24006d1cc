"""`autotuner bench SLA`: one config measured on a real engine, printed as a table or JSON.

Exit 0: the SLA is met; 1: it is not; 2: bad input; 3: the engine failed to start, or crashed
while measured (no verdict on the SLA); 130: interrupted (the engine is stopped first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from autotuner.core.errors import BadInput, EngineCrashed, EngineStartFailed, Interrupted
from autotuner.core.paths import atomic_write_text
from autotuner.core.types import ParamValue
from autotuner.engines import registry
from autotuner.engines.base import EngineLaunchError
from autotuner.engines.process import tail
from autotuner.measure.bench import BenchOutcome, bench
from autotuner.measure.cache import cache_note
from autotuner.measure.pacing import pacing


def main_bench(
    sla_path: str, output: str | None, sets: list[str], trials_dir: str, show_json: bool
) -> int:
    from autotuner.sla.allowed import override_problems
    from autotuner.sla.spec import load_sla

    try:
        sla = load_sla(sla_path)
        overrides = parse_overrides(sets)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    # The same allow-list and rules as the SLA's own options (declared choices included).
    if problems := override_problems(sla.engine.kind, overrides):
        raise BadInput("\n".join(problems))
    run_dir = default_run_dir(Path(trials_dir), sla.name)
    started = time.monotonic()
    try:
        engine = registry.get(sla.engine.kind)  # the one lookup of this run's engine
        outcome = asyncio.run(
            _run_cancellable(bench(sla, engine=engine, overrides=overrides, run_dir=run_dir))
        )
    except EngineLaunchError as exc:
        raise EngineStartFailed(
            f"{exc}\n--- last lines of {run_dir / 'engine.log'} ---\n{exc.log_tail}"
        ) from exc
    except EngineCrashed as exc:
        log = run_dir / "engine.log"
        raise EngineCrashed(f"{exc}\n--- last lines of {log} ---\n{tail(log, 20)}") from exc
    except (FileNotFoundError, ValueError) as exc:  # a missing file, an unusable value
        raise BadInput(str(exc)) from exc
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise Interrupted("interrupted; engine stopped") from None
    data = outcome.to_dict()
    atomic_write_text(run_dir / "result.json", json.dumps(data, indent=2))
    if output:
        atomic_write_text(Path(output), json.dumps(data, indent=2))
    if show_json:
        print(json.dumps(outcome.to_dict(with_records=False), indent=2))
    else:
        print_report(outcome)
        print(
            f"full result: {output or run_dir / 'result.json'} "
            f"({time.monotonic() - started:.0f} s in all)"
        )
    return 0 if outcome.evaluation.feasible else 1


def parse_overrides(items: list[str]) -> dict[str, ParamValue]:
    """``["max_num_seqs=8", "enforce_eager=true"]`` -> typed parameter values."""
    out: dict[str, ParamValue] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects NAME=VALUE, got {item!r}")
        out[key.strip().replace("-", "_")] = _typed(raw.strip())
    return out


def _typed(raw: str) -> ParamValue:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        with contextlib.suppress(ValueError):
            return cast(raw)
    return raw


def default_run_dir(trials_dir: Path, sla_name: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return trials_dir / sla_name / f"bench-{stamp}"


async def _run_cancellable(coro: Any) -> Any:
    """Run ``coro`` so that SIGTERM cancels it like Ctrl-C (its ``finally`` blocks run)."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_report(outcome: BenchOutcome, out: TextIO | None = None) -> None:
    """The human summary: latency percentiles, throughput, errors, memory, verdicts (on
    ``out``, else the standard output of the moment: not the one there was at import)."""
    out = out if out is not None else sys.stdout
    m = outcome.evaluation.metrics
    r = outcome.result
    w = out.write
    w(
        f"\n{outcome.sla_name}: {outcome.engine_version}, {len(r.records)} requests "
        f"in {r.duration_s:.1f} s, engine start {outcome.startup_s:.0f} s\n\n"
    )
    w(f"{'latency (ms)':<14}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}\n")
    for metric in ("ttft", "tpot", "itl", "e2e"):
        cells = [m.get(f"{k}_{metric}_ms") for k in ("mean", "p50", "p90", "p99")]
        w(f"{metric.upper():<14}" + "".join(f"{_fmt(c):>10}" for c in cells) + "\n")
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(r.errors().items())) or "none"
    mem = m.get("peak_memory_gib")
    source = r.monitor.get("memory_source", "")
    engine = r.monitor.get("engine", {})
    w("\n")
    w(f"{'request rate':<22}{_fmt(m.get('request_rate'), 2)} req/s\n")
    w(f"{'output tokens':<22}{_fmt(m.get('output_tokens_per_s'))} tok/s\n")
    w(f"{'total tokens':<22}{_fmt(m.get('total_tokens_per_s'))} tok/s\n")
    w(f"{'goodput':<22}{_fmt(m.get('goodput'), 2)} req/s (requests meeting every SLO)\n")
    w(f"{'errors':<22}{len(r.failed)} of {len(r.records)} ({errors})\n")
    w(f"{'peak engine memory':<22}{_fmt(mem, 2)} GiB ({source})\n")
    for uuid, held in sorted(r.monitor.get("engine_gpus", {}).items()):
        w(f"{'  on ' + uuid[:18]:<22}{_fmt(held / 2**30, 2)} GiB (NVML, the engine's processes)\n")
    if engine:
        kv = engine.get("peak_kv_cache_usage")
        w(
            f"{'engine':<22}preemptions {_fmt(engine.get('preemptions'), 0)}, "
            f"peak KV cache {_fmt(kv * 100 if kv is not None else None)}%, "
            f"peak waiting {_fmt(engine.get('peak_waiting'), 0)}\n"
        )
        if note := cache_note(engine):
            w(f"{'':<22}{note}\n")
    if (share := r.schedule_sent()) is not None:
        w(
            f"\nwarning: the load generator sent {share:.0%} of the schedule ({len(r.records):,} "
            f"of {r.scheduled:,} requests): its sends fell behind and the time to send ran "
            "out\n"
        )
    if (pace := pacing(r)) is not None and pace.behind:
        w(
            f"\nwarning: {pace.describe()}: the engine was offered less than the SLA's load; "
            "give the load generator spare cores\n"
        )
    w("\nSLA\n")
    for v in outcome.evaluation.verdicts:
        op = "<=" if v.bound == "max" else ">="
        status = "PASS" if v.met else "FAIL"
        w(f"  {status}  {v.key:<26} {_fmt(v.value, 3):>12} {op} {v.limit:g}\n")
    if not outcome.evaluation.verdicts:
        w("  (no constraints)\n")
    verdict = "met" if outcome.evaluation.feasible else "NOT met"
    w(f"\nSLA {verdict}.\n")
