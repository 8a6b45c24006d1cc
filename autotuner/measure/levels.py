"""How many requests a load level needs, and what one level says about each SLA constraint.

Sizing. A percentile limit (p99 TTFT <= 500 ms) can be shown met only when the level has enough
requests for an order statistic to bound the percentile at the SLA's confidence
(:func:`autotuner.measure.quantile.requests_needed`: p99 at 95 %: 299, p90: 29; a p99 from 30
requests is the sample's maximum). So a level sends the workload's ``requests``, raised to what
the highest constrained percentile needs and capped by ``tune.max_requests_per_level``. When
the cap (or a workload bounded by ``duration_s``) leaves fewer, no level can meet that limit:
the best it can say is undecided, and `autotuner check` warns.

Verdicts. Per constraint, ``meets`` / ``misses`` / ``undecided``: a percentile limit from the
order-statistic bounds of the level's latencies (those of successful requests, like the point
value the tables show; failures count through ``max_error_rate``); every other constraint
(means, rates, goodput, error rate, memory, p100) from its point value, which is what it
is: a mean over the level or a count, not a tail estimate. A metric that could not be
measured at all misses. Whatever the constraints say, an open-loop level whose engine did not
keep up with the rate it was sent misses (:mod:`autotuner.measure.sustained`): a short level
can end before the growing queue reaches a loose latency limit. And a level the load generator
could not send at its scheduled rate (:mod:`autotuner.measure.pacing`) is undecided whatever it
measured: the engine was offered less than the level claims. And an open-loop level too short
to show a steady load (:mod:`autotuner.measure.span`) cannot show the SLA met: undecided.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotuner.measure.evaluate import Evaluation
from autotuner.measure.loadgen import LoadResult
from autotuner.measure.pacing import Pacing, worst_pacing
from autotuner.measure.quantile import Outcome, combine, quantile_interval, requests_needed
from autotuner.measure.span import Span, shortest_span
from autotuner.measure.sustained import SUSTAIN_TOLERANCE, Sustained, least_sustained
from autotuner.sla.spec import Constraint, Sla, parse_percentile_metric


def percentile_of(c: Constraint) -> tuple[float, str] | None:
    """``(0.99, "ttft")`` for a ``p99_ttft_ms`` limit; None for point constraints (p100 too:
    the maximum is its own bound)."""
    parsed = parse_percentile_metric(c.metric)
    if parsed is None or c.bound != "max" or parsed[0] >= 100:
        return None
    return parsed[0] / 100, parsed[1]


@dataclass(frozen=True)
class LevelSize:
    """The requests each load level sends, and whether that resolves the SLA's percentiles."""

    requests: int | None  # None: the workload's duration_s alone bounds a level
    needed: int  # fewest requests for which every percentile limit can be met (0: none)
    hardest: str | None  # the constraint key that needs ``needed``
    confidence: float
    capped: bool  # ``needed`` is above tune.max_requests_per_level

    @property
    def resolves(self) -> bool:
        """Whether a level can show every percentile limit met (duration-only: unknown)."""
        return self.requests is None or self.requests >= self.needed


def level_size(sla: Sla) -> LevelSize:
    """The request count of one level for ``sla`` (see the module docstring)."""
    confidence = sla.tune.confidence
    needed, hardest = 0, None
    for c in sla.constraints:
        pct = percentile_of(c)
        if pct is not None and (n := requests_needed(pct[0], confidence)) > needed:
            needed, hardest = n, c.key
    cap = sla.tune.max_requests_per_level
    base = sla.workload.requests
    if base is None:
        return LevelSize(None, needed, hardest, confidence, needed > cap)
    return LevelSize(
        min(max(base, needed), max(base, cap)), needed, hardest, confidence, needed > cap
    )


def resolution_notes(sla: Sla) -> tuple[list[str], list[str]]:
    """``(warnings, notes)`` about the level size, for `autotuner check` and `tune`.

    A warning: some percentile limit can never be shown met (levels too small). A note: levels
    are larger than ``workload.requests`` because the percentile needs it.
    """
    size = level_size(sla)
    warnings: list[str] = []
    notes: list[str] = []
    if size.hardest is None:
        return warnings, notes
    conf = f"{size.confidence:.0%}"
    what = f"{size.hardest} at {conf} confidence needs {size.needed} requests per load level"
    w = sla.workload
    if size.requests is not None and size.requests < size.needed:
        warnings.append(
            f"{what}, but levels send {size.requests} (tune.max_requests_per_level "
            f"{sla.tune.max_requests_per_level}): no level can show it met, capacity will be "
            "undecided; raise the cap, lower tune.confidence or constrain a lower percentile"
        )
    elif size.requests is not None and w.requests is not None and size.requests > w.requests:
        notes.append(
            f"{what}: levels send {size.requests} instead of workload.requests {w.requests}"
        )
    if w.trace is not None and w.requests is None and w.duration_s is None:
        from autotuner.workload.traces import read_trace

        trace = read_trace(sla.resolve_path(w.trace), w.trace_format, w.trace_block_tokens)
        if len(trace.records) < size.needed:
            warnings.append(
                f"{what}, but a level replays the trace's {len(trace.records)} records once: "
                f"set workload.requests to {size.needed} or more (the trace repeats)"
            )
    rate = getattr(w.arrival, "rate", None)
    if w.duration_s is not None and rate is not None:
        expected = math.floor(rate * w.duration_s)
        if expected < size.needed:
            warnings.append(
                f"{what}, but workload.duration_s {w.duration_s:g} at {rate:g} req/s sends "
                f"about {expected}: at the SLA's own load no level can show it met; "
                "lengthen duration_s or constrain a lower percentile"
            )
    return warnings, notes


# Metrics whose value a launch fixes before any load (the KV pool is reserved at start).
LOAD_INDEPENDENT = frozenset({"peak_memory_gib"})


@dataclass(frozen=True)
class Judgement:
    """What one level says: each constraint's verdict, the level's, the margin the capacity
    search interpolates (> 0: not shown met; None: nothing to interpolate), and the rates the
    level sent and served (None: closed loop, or too few requests to tell), and how the load
    generator kept to its schedule (None: fewer than two requests)."""

    verdicts: dict[str, Outcome]
    verdict: Outcome
    margin: float | None
    sustained: Sustained | None = None
    pacing: Pacing | None = None
    span: Span | None = None  # set where a level too short to show a steady load is undecided

    @property
    def behind(self) -> bool:
        """Whether the load generator fell behind its schedule (the level tells nothing)."""
        return self.pacing is not None and self.pacing.behind

    @property
    def short(self) -> bool:
        """Whether the level met the SLA but was too short to show it at a steady load."""
        return self.span is not None


def judge(
    result: LoadResult,
    ev: Evaluation,
    sla: Sla,
    confidence: float,
    runs: Sequence[LoadResult] | None = None,
) -> Judgement:
    """Each constraint's verdict on one level (see the module docstring), and the level's
    search margin: the largest over the constraints of the margin that decides ``meets``.
    ``runs``: the runs :func:`pooled` into ``result``, when it pools several (a pooled
    ``result`` knows them itself: its rates, sustain and pacing are judged run by run).

    For a percentile limit that is the margin of the percentile's upper confidence bound,
    not of its point value, so that the margin crosses zero where the verdicts turn from
    meets to undecided: the search then looks where a level can be shown to meet the SLA
    (interpolating point values would aim at the middle of the undecided zone). A limit of
    0 (``max_error_rate: 0``) has an absolute margin that is 0 whenever it is met, which
    says nothing about the distance to the limit: it counts only when violated. The same holds
    for a limit on a quantity the load does not move (peak memory: the engine reserves its KV
    pool at start): met, its margin is the same at every rate, and as the largest margin it
    would put the interpolated crossing next to the low edge (on an H200 a memory margin of
    -4 % against p99 TPOT's -42 % aimed the next level at 16 req/s for a crossing near 20).

    A level the engine did not sustain misses whatever its constraints say, and the shortfall
    of its served rate counts as one more margin. A sustained level's served/sent ratio is
    near 1 at every rate below capacity, so, like peak memory, it counts only near its limit:
    once the engine visibly falls behind (served below 1 - SUSTAIN_TOLERANCE / 4 of sent; on
    an H200 and on 2 CPU cores levels well below the edge served 0.97-1.0). Without it, an
    edge set by the served rate is invisible from below: on 2 CPU cores a level that served
    17.5 of 18.7 req/s sent (ratio 0.94, margin -18 %) showed a TTFT margin of -85 % against
    a loose limit, and the search crept down from the missing edge at 25.6 req/s (24.9, 24.1,
    23.5, all not sustained) until its budget ran out with the bracket 38 % wide.

    A level whose load generator fell behind (any of ``runs``) is undecided and has no margin,
    whatever its constraints say.
    """
    verdicts: dict[str, Outcome] = {}
    margins: list[float] = []
    informative = True
    by_key = {v.key: v for v in ev.verdicts}
    for c in sla.constraints:
        point = by_key[c.key]
        pct = percentile_of(c)
        if point.value is None or math.isnan(point.value):
            verdicts[c.key] = "misses"
            informative = False
            continue
        if pct is None:
            verdicts[c.key] = "meets" if point.met else "misses"
            if point.margin > 0 or (c.limit != 0 and c.metric not in LOAD_INDEPENDENT):
                margins.append(point.margin)
            continue
        interval = quantile_interval(result.latencies_ms(pct[1]).tolist(), pct[0], confidence)
        verdicts[c.key] = interval.verdict(c.limit, "max")
        if interval.upper is None:
            informative = False  # too few requests for an upper bound: no margin to use
        else:
            margins.append((interval.upper - c.limit) / c.limit)
    kept = least_sustained(runs or (result,))
    outcomes: list[Outcome] = list(verdicts.values())
    if kept is not None and not kept.ok:
        outcomes.append("misses")
    if kept is not None and kept.ratio < 1 - SUSTAIN_TOLERANCE / 4:
        margins.append(kept.margin)
    margin = max(margins) if informative and margins else None
    pace = worst_pacing(runs or (result,))
    if pace is not None and pace.behind:
        return Judgement(verdicts, "undecided", None, kept, pace)
    verdict = combine(outcomes)
    span = shortest_span(runs or (result,))
    if verdict == "meets" and span is not None and span.short:
        return Judgement(verdicts, "undecided", None, kept, pace, span)
    return Judgement(verdicts, verdict, margin, kept, pace)


def pooled(a: LoadResult, b: LoadResult) -> LoadResult:
    """Two runs at the same load as one sample: their requests together, their measured
    durations added, and where each run's requests are (``runs``): each run's times count from
    its own start, so rates are measured run by run and combined (requests over the runs'
    windows together), never over the pooled records as one window. The monitor summary is
    the later run's, with the peak memory of both."""
    monitor = dict(b.monitor)
    peaks = [
        p for p in (a.monitor.get("peak_memory_bytes"), b.monitor.get("peak_memory_bytes")) if p
    ]
    if peaks:
        monitor["peak_memory_bytes"] = max(peaks)
    return LoadResult(
        b.plan,
        a.records + b.records,
        a.duration_s + b.duration_s,
        a.warmup_failed + b.warmup_failed,
        monitor,
        runs=(*a.spans(), *b.spans()),
        # a run cut short keeps saying so: the schedules of both, if either was cut
        scheduled=(
            max(a.scheduled, len(a.records)) + max(b.scheduled, len(b.records))
            if a.scheduled or b.scheduled
            else 0
        ),
    )
