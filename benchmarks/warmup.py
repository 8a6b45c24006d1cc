"""The cold engine: how many requests (or seconds) until per-token latency is steady.

Starts ONE engine through the tuner's own launch code (:mod:`autotuner.measure.bench`: the
SLA's model, engine parameters and target, the server bound to 127.0.0.1), then sends load
levels one after the other on that same engine, with no warm-up requests at all: by default the
SLA's own rate (600 requests), a second level 1.3 x higher (300) and the first rate again (300).
Each level is one open-loop run of the load generator (:func:`autotuner.measure.loadgen.run_load`,
Poisson arrivals, the SLA's prompt and output lengths, prompts no earlier level sent), as a
level of a tune is. The engine is always stopped, also on an error or Ctrl-C / SIGTERM.

Every level's requests are cut, in send order, into consecutive windows of ``--window``
requests. Per window (``windows.csv``): the requests sent so far (all levels), the seconds
since the engine turned healthy (first send, last completion), the offered rate (sends per
second over the window's sends), the served rate (the level's completions per second between
the window's first send and the next window's first send: 0 while the first requests are still
decoding, the offered rate once the engine keeps up),
mean / p50 / p99 TPOT and TTFT (p99 of 50 requests: their second-highest), and the
host's 1-minute load average at the window's end (``os.getloadavg``; on a CPU engine the
engine and this client share those cores).

Two rules for "steady" (``summary.txt``; TPOT is the mean, TTFT the p50, of the requests):

* Against the level's own end: the reference is the median of the level's last ``--final``
  windows; the rolling value at a window pools that window and the ``--rolling`` - 1 windows
  before it. The level is steady from the first window from which every rolling value stays
  within ``--tolerance`` (3 %; TTFT ``--ttft-tolerance``, 10 %) of the reference. This only
  resolves a warm-up larger than the window-to-window spread of the arrivals: near capacity,
  50-request windows of one Poisson schedule differ by tens of percent on a warm engine.
* Paired (the one that resolves a few percent): levels of the same rate use the same seed, so
  the same arrival schedule (prompts differ: each level starts at new request indices). The
  first level at a rate is compared window by window with a later level at that rate on the
  same engine (the warm reference), and with ``--baseline`` also level by level with another
  run (e.g. a second fresh engine on identical traffic). Only windows before either level's
  drain count (a request still running at the level's last send ends that stretch). The first
  level is steady from the first window from which every rolling ratio (first / later) is at
  most 1 + tolerance: a cold engine slower than the warm one by more than the tolerance.

"Steady after N requests / S seconds": the requests sent before that window and the seconds
from healthy to its first send. A new rate pays a warm-up again when its first level is slower
than a later level at the same rate (give the levels as, e.g., ``20:1500,26:600,20:600,26:600``).

Run (the CPU quick start; on a GPU, an SLA of that model and ``--levels``)::

    python3 benchmarks/warmup.py objectives/quickstart-cpu.yaml \\
        --levels 2:250,2.6:150,2:250,2.6:150 --window 25 --out /tmp/warmup-cpu
    python3 benchmarks/warmup.py --analyse /tmp/warmup-cpu/requests.csv --window 50
    python3 benchmarks/warmup.py --analyse B/requests.csv --baseline A/requests.csv

``--analyse`` recomputes the windows and the summary from a run's ``requests.csv`` (every
request's timings; ``result.json`` beside it supplies the run's description) without an engine.
Exit status: 0 when the run finished (steady or not), 2 on bad input or a failed start.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import csv
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from autotuner.engines import envs, registry
from autotuner.engines.base import EngineLaunchError, EngineProcess
from autotuner.measure.bench import build_plan
from autotuner.measure.launch import engine_params, make_engine, resolve_model
from autotuner.measure.loadgen import LoadResult, run_load
from autotuner.measure.monitor import Monitor
from autotuner.sla.spec import Sla, load_sla

REQUEST_FIELDS = (
    "level",
    "rate",
    "index",
    "sent_s",
    "end_s",
    "ttft_ms",
    "tpot_ms",
    "output_tokens",
    "error",
)
WINDOW_FIELDS = (
    "level",
    "rate",
    "window",
    "requests_so_far",
    "requests",
    "failed",
    "first_sent_s",
    "last_end_s",
    "offered_rps",
    "served_rps",
    "tpot_mean_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "ttft_mean_ms",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "load1",
)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Level:
    rate: float
    requests: int


@dataclass(frozen=True)
class Req:
    """One request's timings; times in seconds since the engine turned healthy."""

    level: int
    rate: float
    index: int
    sent_s: float
    end_s: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    output_tokens: int
    error: str | None


@dataclass(frozen=True)
class Window:
    level: int
    rate: float
    window: int
    requests_so_far: int
    requests: int
    failed: int
    first_sent_s: float
    last_end_s: float | None
    offered_rps: float | None
    served_rps: float | None
    tpot_mean_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    ttft_mean_ms: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    load1: float | None


@dataclass(frozen=True)
class Steady:
    """Where one level's metric became steady under the rule (module docstring)."""

    metric: str
    reference: float  # median of the final windows
    spread: float  # largest relative distance of a final window's rolling value from it
    first: float  # the first window's value / the reference
    window: int | None  # first steady window (None: never within the tolerance)
    requests_before: int | None  # requests sent in this level before that window
    requests_so_far: int | None  # requests sent on the engine before that window
    seconds: float | None  # seconds from healthy to that window's first send


# --- analysis (no engine) -------------------------------------------------------------------


def _stat(values: list[float], how: str) -> float | None:
    if not values:
        return None
    if how == "mean":
        return float(np.mean(values))
    return float(np.percentile(values, float(how)))


def _rate(times: list[float]) -> float | None:
    """Events per second over the span of ``times``: (n - 1) / span."""
    if len(times) < 2:
        return None
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else None


def make_windows(
    reqs: Sequence[Req], size: int, loads: Sequence[tuple[float, float]] = ()
) -> list[Window]:
    """Consecutive windows of ``size`` requests (send order), per level; a level's last
    partial window is kept when it holds at least half a window."""
    out: list[Window] = []
    so_far = 0
    for level in sorted({r.level for r in reqs}):
        mine = sorted((r for r in reqs if r.level == level), key=lambda r: r.sent_s)
        all_ends = sorted(r.end_s for r in mine if r.error is None and r.end_s is not None)
        for w, start in enumerate(range(0, len(mine), size)):
            chunk = mine[start : start + size]
            so_far += len(chunk)
            if len(chunk) < max(2, size // 2):
                continue
            ok = [r for r in chunk if r.error is None]
            ends = [r.end_s for r in ok if r.end_s is not None]
            tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
            ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
            last_end = max(ends) if ends else None
            # The window's span: its first send to the next window's first send (the last
            # window: to its own last send). Served: the level's completions in that span.
            t_a = chunk[0].sent_s
            following = mine[start + size] if start + size < len(mine) else None
            t_b = following.sent_s if following is not None else chunk[-1].sent_s
            served = None
            if t_b > t_a:
                done = bisect.bisect_left(all_ends, t_b) - bisect.bisect_left(all_ends, t_a)
                served = done / (t_b - t_a)
            load = None
            if loads and last_end is not None:
                load = min(loads, key=lambda s: abs(s[0] - last_end))[1]
            out.append(
                Window(
                    level=level,
                    rate=chunk[0].rate,
                    window=w,
                    requests_so_far=so_far,
                    requests=len(chunk),
                    failed=len(chunk) - len(ok),
                    first_sent_s=chunk[0].sent_s,
                    last_end_s=last_end,
                    offered_rps=_rate([r.sent_s for r in chunk]),
                    served_rps=served,
                    tpot_mean_ms=_stat(tpot, "mean"),
                    tpot_p50_ms=_stat(tpot, "50"),
                    tpot_p99_ms=_stat(tpot, "99"),
                    ttft_mean_ms=_stat(ttft, "mean"),
                    ttft_p50_ms=_stat(ttft, "50"),
                    ttft_p99_ms=_stat(ttft, "99"),
                    load1=load,
                )
            )
    return out


def _pooled(reqs: Sequence[Req], metric: str) -> float | None:
    values = [v for r in reqs if r.error is None and (v := getattr(r, metric)) is not None]
    return float(np.mean(values)) if values else None


def steady_point(
    reqs: Sequence[Req],
    windows: Sequence[Window],
    level: int,
    *,
    size: int,
    metric: str,
    tolerance: float,
    rolling: int,
    final: int,
) -> Steady | None:
    """The rule of the module docstring for one level and one metric (``tpot_mean_ms``:
    rolling pooled mean TPOT; ``ttft_p50_ms``: rolling p50 TTFT)."""
    mine = [w for w in windows if w.level == level]
    if len(mine) < final + 1:
        return None
    level_reqs = sorted((r for r in reqs if r.level == level), key=lambda r: r.sent_s)
    per_window = [getattr(w, metric) for w in mine]
    if any(v is None for v in per_window[-final:]):
        return None
    reference = float(np.median([v for v in per_window[-final:] if v is not None]))
    field, how = ("tpot_ms", "mean") if metric.startswith("tpot") else ("ttft_ms", "50")
    rolled: list[float | None] = []
    for i, w in enumerate(mine):
        lo = mine[max(0, i - rolling + 1)].window * size
        hi = w.window * size + w.requests
        values = [
            v for r in level_reqs[lo:hi] if r.error is None and (v := getattr(r, field)) is not None
        ]
        rolled.append(_stat(values, how))
    ok = [v is not None and abs(v / reference - 1) <= tolerance for v in rolled]
    first_steady: int | None = None
    for i in range(len(mine) - 1, -1, -1):
        if not ok[i]:
            break
        first_steady = i
    spread = max(abs(v / reference - 1) for v in rolled[-final:] if v is not None)
    first_value = per_window[0]
    if first_steady is None:
        return Steady(
            metric, reference, spread, (first_value or 0) / reference, None, None, None, None
        )
    w = mine[first_steady]
    return Steady(
        metric=metric,
        reference=reference,
        spread=spread,
        first=(first_value or 0) / reference,
        window=w.window,
        requests_before=w.window * size,
        requests_so_far=w.requests_so_far - w.requests,
        seconds=w.first_sent_s,
    )


@dataclass(frozen=True)
class Paired:
    """One level against another of the same rate and arrival schedule, window by window."""

    first: str  # e.g. "level 0"
    second: str
    metric: str  # tpot_mean_ms or ttft_p50_ms
    windows: int  # windows compared (before either level's drain)
    ratios: tuple[float, ...]  # per window: first / second
    overall: float  # pooled over the compared requests: first / second
    window: int | None  # first window from which the rolling ratio stays <= 1 + tolerance
    requests_before: int | None  # requests of the first level sent before that window
    seconds: float | None  # seconds from healthy to that window's first send (first level)


def before_drain(reqs: Sequence[Req]) -> int:
    """Requests (send order) before the first one still running at the level's last send:
    from there on the level's load falls off, whatever the engine does."""
    ordered = sorted(reqs, key=lambda r: r.sent_s)
    if not ordered:
        return 0
    last_send = ordered[-1].sent_s
    for i, r in enumerate(ordered):
        if r.end_s is None or r.end_s > last_send:
            return i
    return len(ordered)


def _window_stat(reqs: Sequence[Req], field: str, how: str) -> float | None:
    return _stat([v for r in reqs if r.error is None and (v := getattr(r, field)) is not None], how)


def compare(
    first: Sequence[Req],
    second: Sequence[Req],
    *,
    names: tuple[str, str],
    size: int,
    metric: str,
    tolerance: float,
    rolling: int,
) -> Paired | None:
    """``first`` against ``second`` (two levels with the same rate and seed, so the same
    arrival schedule), window by window over the windows before either level's drain.

    The first level is steady from the first window from which every rolling ratio (the
    ``rolling`` windows up to it, pooled) is at most 1 + ``tolerance``: from there on it is
    not slower than the second level by more than the tolerance (faster is no warm-up cost).
    """
    a = sorted(first, key=lambda r: r.sent_s)
    b = sorted(second, key=lambda r: r.sent_s)
    n = min(before_drain(a), before_drain(b)) // size
    if n < 1:
        return None
    field, how = ("tpot_ms", "mean") if metric.startswith("tpot") else ("ttft_ms", "50")

    def ratio(lo: int, hi: int) -> float | None:
        x = _window_stat(a[lo * size : hi * size], field, how)
        y = _window_stat(b[lo * size : hi * size], field, how)
        return None if x is None or not y else x / y

    ratios = [ratio(k, k + 1) for k in range(n)]
    rolled = [ratio(max(0, k - rolling + 1), k + 1) for k in range(n)]
    overall = ratio(0, n)
    if overall is None or any(r is None for r in ratios):
        return None
    steady: int | None = None
    for k in range(n - 1, -1, -1):
        value = rolled[k]
        if value is None or value > 1 + tolerance:
            break
        steady = k
    return Paired(
        first=names[0],
        second=names[1],
        metric=metric,
        windows=n,
        ratios=tuple(r for r in ratios if r is not None),
        overall=overall,
        window=steady,
        requests_before=None if steady is None else steady * size,
        seconds=None if steady is None else a[steady * size].sent_s,
    )


def describe_paired(p: Paired, size: int, tolerance: float) -> list[str]:
    name = "TPOT (mean)" if p.metric.startswith("tpot") else "TTFT (p50)"
    if p.window is None:
        verdict = f"never within {tolerance:.0%} (rolling) over these windows"
    elif p.window == 0:
        verdict = f"within {tolerance:.0%} from the first window: no warm-up seen"
    else:
        verdict = (
            f"steady after {p.requests_before} requests / {p.seconds:.0f} s since healthy "
            f"(rolling ratio <= {1 + tolerance:.2f} from there)"
        )
    return [
        f"  {name} {p.first} / {p.second}, {p.windows} windows ({p.windows * size} "
        f"requests): {p.overall:.3f} pooled, per window " + " ".join(f"{r:.2f}" for r in p.ratios),
        f"    {verdict}",
    ]


def pairs_within(reqs: Sequence[Req]) -> list[tuple[int, int]]:
    """(earlier level, later level) of every later level whose rate an earlier level had."""
    rates = {r.level: r.rate for r in reqs}
    out = []
    for later in sorted(rates):
        for earlier in sorted(rates):
            if earlier < later and rates[earlier] == rates[later]:
                out.append((earlier, later))
                break
    return out


def summarise(
    reqs: Sequence[Req],
    windows: Sequence[Window],
    meta: dict[str, Any],
    *,
    size: int,
    tolerance: float,
    ttft_tolerance: float,
    rolling: int,
    final: int,
    baseline: Sequence[Req] = (),
) -> tuple[str, dict[str, Any]]:
    """The text summary and its figures; ``baseline``: another run's requests, compared
    level by level (same level number and rate)."""
    lines: list[str] = []
    out: dict[str, Any] = {"levels": []}
    lines.append(
        f"engine: {meta.get('engine_version', '?')} on {meta.get('machine', '?')}, "
        f"start {meta.get('startup_s', float('nan')):.0f} s, "
        f"params {json.dumps(meta.get('params', {}), sort_keys=True)}"
    )
    lines.append(
        f"workload: {meta.get('workload', '?')}; windows of {size} requests, no warm-up requests"
    )
    if "load_before" in meta:
        loads = [w.load1 for w in windows if w.load1 is not None]
        during = f", {min(loads):.2f}-{max(loads):.2f} during the run" if loads else ""
        lines.append(
            f"host: {meta.get('nproc', '?')} cores, 1-minute load average "
            f"{meta['load_before']:.2f} before the launch{during}"
        )
    lines.append(
        f"rule: steady from the first window from which the rolling mean TPOT ({rolling} "
        f"window(s) = {rolling * size} requests) stays within {tolerance:.0%} of the median of "
        f"the level's last {final} windows; TTFT likewise with the rolling p50 and "
        f"{ttft_tolerance:.0%}"
    )
    references: dict[float, float] = {}
    for level in sorted({r.level for r in reqs}):
        mine = [r for r in reqs if r.level == level]
        rate = mine[0].rate
        entry: dict[str, Any] = {"level": level, "rate": rate, "requests": len(mine)}
        failed = sum(r.error is not None for r in mine)
        lw = [w for w in windows if w.level == level]
        served = [w.served_rps for w in lw[-final:] if w.served_rps is not None]
        head = (
            f"level {level}: poisson {rate:g} req/s, {len(mine)} requests ({failed} failed), "
            f"mean TPOT {_fmt(_pooled(mine, 'tpot_ms'))} ms, mean TTFT "
            f"{_fmt(_pooled(mine, 'ttft_ms'))} ms"
            + (f", served {np.median(served):.2f} req/s (final windows)" if served else "")
        )
        lines.append(head)
        for metric, tol in (("tpot_mean_ms", tolerance), ("ttft_p50_ms", ttft_tolerance)):
            s = steady_point(
                reqs,
                windows,
                level,
                size=size,
                metric=metric,
                tolerance=tol,
                rolling=rolling,
                final=final,
            )
            name = "TPOT (mean)" if metric.startswith("tpot") else "TTFT (p50)"
            if s is None:
                lines.append(f"  {name}: too few windows to judge")
                continue
            entry[metric] = asdict(s)
            noise = f"final windows within {s.spread:.1%} of it"
            if s.window is None:
                verdict = "not steady under the rule"
            elif s.window == 0:
                verdict = "steady from the first window"
            else:
                verdict = (
                    f"steady after {s.requests_before} requests of this level "
                    f"({s.requests_so_far} on the engine) / {s.seconds:.0f} s since healthy"
                )
            lines.append(
                f"  {name}: first window {s.first:.2f} x the final median "
                f"{s.reference:.2f} ms ({noise}); {verdict}"
            )
            if metric.startswith("tpot"):
                if rate in references:
                    ratio = s.reference / references[rate]
                    entry["vs_earlier_same_rate"] = ratio
                    lines.append(
                        f"  back at {rate:g} req/s: final median TPOT {ratio:.3f} x the "
                        "earlier level's at this rate"
                    )
                else:
                    references[rate] = s.reference
        out["levels"].append(entry)
    groups: list[tuple[str, list[tuple[str, list[Req], str, list[Req]]]]] = []
    within = [
        (
            f"level {a}",
            [r for r in reqs if r.level == a],
            f"level {b}",
            [r for r in reqs if r.level == b],
        )
        for a, b in pairs_within(reqs)
    ]
    groups.append(("same engine, same rate and arrival schedule (earlier / later)", within))
    if baseline:
        across = []
        for level in sorted({r.level for r in reqs}):
            mine = [r for r in reqs if r.level == level]
            theirs = [r for r in baseline if r.level == level]
            if theirs and theirs[0].rate == mine[0].rate:
                across.append((f"level {level}", mine, f"baseline level {level}", theirs))
        groups.append(("this run / the baseline run, same levels and schedules", across))
    out["paired"] = []
    for title, pairs in groups:
        if not pairs:
            continue
        lines.append(
            f"paired, {title}; windows before either level's drain; steady: rolling ratio "
            f"({rolling} windows) at most {1 + tolerance:.2f} for TPOT, "
            f"{1 + ttft_tolerance:.2f} for TTFT"
        )
        for a_name, a, b_name, b in pairs:
            for metric, tol in (("tpot_mean_ms", tolerance), ("ttft_p50_ms", ttft_tolerance)):
                p = compare(
                    a,
                    b,
                    names=(a_name, b_name),
                    size=size,
                    metric=metric,
                    tolerance=tol,
                    rolling=rolling,
                )
                if p is None:
                    lines.append(f"  {a_name} / {b_name}: too few requests before the drain")
                    break
                out["paired"].append(asdict(p))
                lines.extend(describe_paired(p, size, tol))
    return "\n".join(lines) + "\n", out


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# --- files ----------------------------------------------------------------------------------


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return value


def write_csv(path: Path, fields: Sequence[str], rows: Sequence[Any]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        for row in rows:
            data = asdict(row)
            writer.writerow([_cell(data[k]) for k in fields])


def read_requests(path: Path) -> list[Req]:
    def num(raw: str) -> float | None:
        return float(raw) if raw else None

    out = []
    with path.open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            out.append(
                Req(
                    level=int(row["level"]),
                    rate=float(row["rate"]),
                    index=int(row["index"]),
                    sent_s=float(row["sent_s"]),
                    end_s=num(row["end_s"]),
                    ttft_ms=num(row["ttft_ms"]),
                    tpot_ms=num(row["tpot_ms"]),
                    output_tokens=int(row["output_tokens"]),
                    error=row["error"] or None,
                )
            )
    return out


# --- the run --------------------------------------------------------------------------------


def requests_of(result: LoadResult, level: int, rate: float, t0: float) -> list[Req]:
    """A level's records as :class:`Req`, times shifted by ``t0`` (level start since healthy)."""
    out = []
    for r in result.records:
        tpot = r.tpot_s
        out.append(
            Req(
                level=level,
                rate=rate,
                index=r.index,
                sent_s=t0 + r.sent_s,
                end_s=None if r.e2e_s is None else t0 + r.sent_s + r.e2e_s,
                ttft_ms=None if r.ttft_s is None else r.ttft_s * 1000,
                tpot_ms=None if tpot is None else tpot * 1000,
                output_tokens=r.output_tokens,
                error=r.error,
            )
        )
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    text = f"{os.cpu_count()} x {cpu}"
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            text += f", GPU 0 {name.decode() if isinstance(name, bytes) else name}"
        finally:
            pynvml.nvmlShutdown()
    return text


async def _sample_load(out: list[tuple[float, float]], healthy: list[float]) -> None:
    while True:
        if healthy:
            out.append((time.perf_counter() - healthy[0], os.getloadavg()[0]))
        await asyncio.sleep(1.0)


async def run_levels(
    sla: Sla,
    levels: Sequence[Level],
    overrides: dict[str, Any],
    out_dir: Path,
) -> tuple[list[Req], list[tuple[float, float]], dict[str, Any]]:
    """One engine, every level in turn; the engine is always stopped."""
    model_dir = resolve_model(sla, say)
    python, how = envs.resolve_python(sla.engine.name, sla.engine.python, sla.engine.kind)
    dist, version = envs.probe_version(python)
    adapter = registry.get(sla.engine.kind)
    params = engine_params(sla, model_dir, overrides, engine=adapter)
    engine: EngineProcess = make_engine(
        sla, python, model_dir, params, out_dir / "engine.log", engine=adapter
    )
    meta: dict[str, Any] = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "sla": sla.name,
        "engine_version": f"{dist} {version}",
        "engine_python": how,
        "params": params,
        "argv": list(engine.argv()),
        "machine": machine(),
        "nproc": os.cpu_count(),
        "load_before": os.getloadavg()[0],
        "levels": [asdict(lv) for lv in levels],
        "monitor": [],
    }
    reqs: list[Req] = []
    loads: list[tuple[float, float]] = []
    healthy: list[float] = []
    sampler = asyncio.create_task(_sample_load(loads, healthy))
    say(f"engine: {dist} {version} ({how}); log {engine.log_path}")
    try:
        endpoint = await engine.launch()
        healthy.append(time.perf_counter())
        meta["startup_s"] = endpoint.startup_s
        meta["urls"] = list(endpoint.urls)
        say(f"healthy after {endpoint.startup_s:.0f} s on {', '.join(endpoint.urls)}")
        gpus = None if sla.target.kind == "cpu" else list(sla.target.devices)
        sent = 0
        for i, lv in enumerate(levels):
            plan = build_plan(sla, model_dir, requests=lv.requests, roles=adapter.roles)
            # Poisson at the level's rate, no warm-up, and prompts that no earlier level sent
            # (no prefix-cache hits).
            plan = replace(
                plan,
                arrival=replace(plan.arrival, process="poisson", rate=lv.rate, concurrency=None),
                warmup_requests=0,
                factory=replace(plan.factory, first_index=sent),
            )
            if i == 0:
                meta["workload"] = (
                    f"{plan.api}, input {_lengths(plan.describe()['input_len'])} / output "
                    f"{_lengths(plan.describe()['output_len'])} tokens, seed {plan.factory.seed}"
                )
            monitor = Monitor(endpoint.urls, engine.processes, gpus, metrics=adapter.metrics)
            t0 = time.perf_counter() - healthy[0]
            say(f"level {i}: poisson {lv.rate:g} req/s, {lv.requests} requests, at {t0:.0f} s")
            result = await run_load(endpoint.urls, endpoint.model, plan, around=monitor)
            meta["monitor"].append(monitor.summary())
            mine = requests_of(result, i, lv.rate, t0)
            reqs.extend(mine)
            sent += lv.requests
            failed = sum(r.error is not None for r in mine)
            say(
                f"level {i}: done in {result.duration_s:.0f} s, {failed} failed, "
                f"mean TPOT {_fmt(_pooled(mine, 'tpot_ms'))} ms"
            )
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await engine.stop()
        say("engine stopped")
    return reqs, loads, meta


def _lengths(spec: dict[str, Any] | None) -> str:
    if not spec:
        return "?"
    if spec["kind"] == "fixed":
        return f"{spec['mean']:g}"
    return f"{spec['kind']} {spec['lo']}-{spec['hi']}"


async def _cancellable(coro: Any) -> Any:
    """SIGTERM cancels like Ctrl-C, so the engine is stopped in ``finally``."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def parse_levels(text: str | None, sla: Sla) -> list[Level]:
    """``"20:600,26:300,20:300"`` (rate:requests); default: the SLA's rate x 1, 1.3, 1."""
    if text:
        out = []
        for item in text.split(","):
            value, _, count = item.partition(":")
            out.append(Level(float(value), int(count or 300)))
        return out
    rate: float | None = getattr(sla.workload.arrival, "rate", None)
    if not rate:
        raise ValueError("the SLA has no arrival rate: give --levels")
    return [Level(rate, 600), Level(round(rate * 1.3, 3), 300), Level(rate, 300)]


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    from autotuner.cli.bench import parse_overrides

    return dict(parse_overrides(list(items)))


def report(
    reqs: list[Req],
    loads: Sequence[tuple[float, float]],
    meta: dict[str, Any],
    args: argparse.Namespace,
    out_dir: Path | None,
) -> None:
    baseline = read_requests(args.baseline) if args.baseline else []
    windows = make_windows(reqs, args.window, loads)
    text, figures = summarise(
        reqs,
        windows,
        meta,
        size=args.window,
        tolerance=args.tolerance,
        ttft_tolerance=args.ttft_tolerance,
        rolling=args.rolling,
        final=args.final,
        baseline=baseline,
    )
    print(text, end="")
    if out_dir is None:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "windows.csv", WINDOW_FIELDS, windows)
    (out_dir / "summary.txt").write_text(text, encoding="utf-8")
    (out_dir / "summary.json").write_text(json.dumps(figures, indent=2), encoding="utf-8")
    say(f"wrote {out_dir}/windows.csv, summary.txt, summary.json")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sla", nargs="?", help="SLA file (YAML): model, engine, target, workload")
    p.add_argument("--levels", help="rate:requests,... (default: SLA rate 600, x1.3 300, x1 300)")
    p.add_argument("--window", type=int, default=50, help="requests per window (50)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--out", type=Path, help="folder for requests.csv, windows.csv, summary")
    p.add_argument("--tolerance", type=float, default=0.03, help="TPOT rule (0.03)")
    p.add_argument("--ttft-tolerance", type=float, default=0.10, help="TTFT rule (0.10)")
    p.add_argument("--rolling", type=int, default=2, help="windows in a rolling mean (2)")
    p.add_argument("--final", type=int, default=4, help="final windows: the reference (4)")
    p.add_argument("--analyse", type=Path, metavar="REQUESTS_CSV", help="no engine: re-analyse")
    p.add_argument(
        "--baseline", type=Path, metavar="REQUESTS_CSV", help="another run to compare with"
    )
    args = p.parse_args(argv)
    if args.analyse:
        reqs = read_requests(args.analyse)
        meta_path = args.analyse.parent / "result.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        loads = [(float(t), float(v)) for t, v in meta.get("loads", [])]
        report(reqs, loads, meta, args, args.out)
        return 0
    if not args.sla:
        p.error("an SLA file is needed (or --analyse)")
    try:
        sla = load_sla(args.sla)
        levels = parse_levels(args.levels, sla)
        overrides = parse_sets(args.sets)
    except ValueError as exc:
        say(f"error: {exc}")
        return 2
    stamp = datetime.now(UTC).strftime("warmup-%Y%m%dT%H%M%SZ")
    out_dir = args.out or Path("trials") / sla.name / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        reqs, loads, meta = asyncio.run(_cancellable(run_levels(sla, levels, overrides, out_dir)))
    except EngineLaunchError as exc:
        say(f"error: the engine did not start: {exc}\n{exc.log_tail}")
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        say("interrupted; engine stopped")
        return 130
    meta["loads"] = [list(s) for s in loads]
    meta["window"] = args.window
    (out_dir / "result.json").write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    write_csv(out_dir / "requests.csv", REQUEST_FIELDS, reqs)
    report(reqs, loads, meta, args, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
