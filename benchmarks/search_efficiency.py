"""Search efficiency: launches needed to reach a near-best config, and launches wasted.

A launch costs 60-130 s on an H200, so the questions are how many launches (trials) a search
needs before it has run a config whose SLA goodput is within ``--tolerance`` (3 %) of the best
one an exhaustive grid finds, and how many of its launches go to configs that miss the SLA at
its own load (or fail to start). No engine runs here. Surfaces:

* four analytic models of one deployment each (model x GPU x workload x SLA) that map an
  engine config to its true SLA goodput (the highest Poisson arrival rate whose p99 TTFT and
  p99 TPOT meet the limits), its latencies at any rate (``latencies``), the served rate and
  mean TPOT a load generator would see there (``served``), and launch failures (out of
  memory);
* ``h200-8b-real``: the H200 grid study under ``docs/benchmarks/h200-llama3-8b/trials/`` (one
  ``trial-NNN.json`` per launch: params, every level's metrics and margins) replayed: each
  config's levels as measured (the first at the SLA's own load, 15 req/s; memory included,
  which the engine defaults missed by 0.45 GiB) and its SLA goodput. Only the grid's 3 x 3
  configs and the defaults were measured, so the search runs over that grid (a config outside
  it would replay as its nearest grid point on a log scale). That doc's caveat holds: levels
  above the first re-sent cached prompts, so the goodputs that rank the points are overstated.
* ``h200-8b-equal-memory``: the later grid study of the same shape and SLA at equal memory
  (``docs/benchmarks/h200-llama3-8b-capacity/grid/``, a study tarball): every config, the
  defaults included, at ``gpu_memory_utilization`` 0.88, ranked by capacity measured to 3 %
  with fresh prompts per level; a grid point it has not measured yet replays as its nearest.

A launch is recorded as a real one is: ``run`` writes its ``trial.json`` into the trial's
folder, as ``run_trial`` does, where the study reads it back (the warm start sizes
``max_num_seqs`` from the incumbent's ``capacity_concurrency`` and picks directions by the
limit that bounded its capacity, both from that file). Each level of its capacity search is
measured at its own rate: p99 TTFT and TPOT, served rate, mean TTFT and E2E, a margin and a
verdict per SLA constraint, the rates sent and served and whether the engine kept up
(:class:`Seen`). On the analytic surfaces all of it comes from the model at that rate; on the
measured ones from the recorded levels (:meth:`RealSurface.level_at`: interpolated below the
capacity, the recorded first miss above it; the first grid study stopped at 33.75 req/s, so
for most of its points no level above the capacity was measured and the replay cannot say
which limit would have ended it, and it recorded no served/sent rates).

A trial measures with seeded multiplicative noise (``--noise``, 5 %), one draw per launch:
goodput (the engine's speed in that run: the load of a level at ``r`` is ``r / z``, so its
capacity scales by ``z``; on the measured surfaces, the recorded capacity times ``z``) and
both p99 latencies at every level are perturbed, so configs near a limit can be measured on
the wrong side of it.

Methods, each over the same discrete grid (the exhaustive grid is every combination):

* ``new``: the search ``autotuner tune`` runs now -- the real
  :class:`~autotuner.search.study.StudyRunner` loop with the space file's priors and hopeless
  values (:mod:`autotuner.search.priors`: baseline, then the warm start, then TPE modelling
  from its second trial), configs near an out-of-memory crash pruned, the sampler's
  candidates launched only within 2 steps of a config that met the SLA
  (:mod:`autotuner.search.nearby`), and the stopping rule (patience 4, resolution 3 %); it
  runs until it stops itself (or the budget).
* ``race``: ``new`` with candidates raced against the incumbent (``StudyRunner(race=True)``,
  what ``tune`` runs for a capacity-first SLA): a candidate's first level is the incumbent's
  capacity, and one that misses there ends after that level, pruned.
* ``ours``: plain TPE, the search before: the same loop without priors, warm start, hopeless
  values or stopping rule, with ``make_sampler("auto", ...)`` (multivariate TPE, constant liar)
  over a space from :func:`~autotuner.space.load_space` (GPU, 1 device, compute
  capability 9.0), narrowed to the grid's values with ``ParamOverride(values=...)`` and every
  other option excluded; SQLite storage in a temporary directory.
* ``grid``: the exhaustive grid in a fixed order: for the analytic surfaces the way vLLM's
  ``benchmarks/auto_tune`` sweeps (``max_num_seqs`` x ``max_num_batched_tokens`` innermost,
  ascending, the other options in outer loops with the engine default first); for the H200
  the order the study ran (the defaults, then its points). Deterministic.
* ``random``: the grid's points in a seeded random order (without replacement).
* diagnostics, only with ``--methods``: ``ours-random`` (the plain loop with
  ``make_sampler("random", ...)``) and ``ours-group`` (TPE ``group=True``, now the default).

The count stops at the first launch of a config that is truly feasible (noise-free) with true
goodput >= (1 - tolerance) x the grid's true best; a launch that crashed counts as a launch.
Not reached within ``--budget`` launches (or, for ``new``, before it stopped) counts as not
reached. This measures finding a near-best config, not recognising it: with noise the search's
own best-measured trial may be another one (promotion confirms the top candidates for that
reason); for ``new`` the table also says how often its own best was near-best when it stopped.
The plain methods are cut at the first near-best launch; ``new`` runs to its own end, and its
share of missed launches is over all of them.

Every launch runs the capacity search ``tune`` runs (:class:`CapacitySearch`: step 1.5,
resolution 3 %, at most 8 levels; the SLAs' first objective is capacity) on the levels above,
the search interpolating their margins as it does on a real engine; its cost in GPU-minutes is
an engine
start (130 s for a run's first launch, on a cold machine, then 80 s: the measured H200 starts
were 45-115 s with the compile caches warm, ../shared/device/README.md) plus 25 s per level (a
launch with 4 levels took 150-200 s there). The table gives the GPU-minutes to the first
near-best launch and, for ``new`` and ``race``, of all launches until the search stopped itself.

Not modelled: ``rules.check`` pruning (no grid point breaks a rule) and the memory model.

Run: ``nice python benchmarks/search_efficiency.py [--seeds 10] [--budget 60] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import platform
import shlex
import sys
import tarfile
import tempfile
import textwrap
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import optuna

from autotuner.engines import registry
from autotuner.measure.bench import arrival_of
from autotuner.measure.capacity import CapacitySearch
from autotuner.measure.levels import LOAD_INDEPENDENT
from autotuner.measure.quantile import Outcome, combine
from autotuner.measure.sustained import SUSTAIN_TOLERANCE
from autotuner.records.trial import TrialRecord
from autotuner.search.duplicates import DUPLICATE_STEPS
from autotuner.search.levers import load_levers
from autotuner.search.nearby import steps
from autotuner.search.priors import SearchPlan
from autotuner.search.progress import StudyStopper, best_launch, defaults_line
from autotuner.search.rules import CrashMemory
from autotuner.search.stopping import StoppingRule
from autotuner.search.study import (
    Budget,
    StudyRunner,
    make_sampler,
    open_study,
    raced_out,
    storage_url,
)
from autotuner.search.trial import Level, SearchSettings, TrialResult, describe_stop
from autotuner.sla.spec import Sla, parse_sla
from autotuner.sla.tuning import DEFAULT_GPU_MINUTES
from autotuner.space import ParamOverride, SearchSpace, load_space

Params = Mapping[str, Any]

VLLM_VERSION = "0.11.0"  # a release without the newer options: fewer to exclude

# The searched values. The engine defaults (vLLM API server on an H200: max_num_seqs 1024,
# max_num_batched_tokens 8192, chunked prefill and prefix caching on, block 16, auto KV dtype,
# gpu_memory_utilization 0.92) are grid points, so the baseline is one too.
GRID: dict[str, list[Any]] = {
    "max_num_seqs": [32, 64, 128, 256, 512, 1024],
    "enable_chunked_prefill": [True, False],
    "max_num_batched_tokens": [2048, 4096, 8192, 16384],  # only with chunked prefill
    "gpu_memory_utilization": [0.92, 0.88, 0.95],
    "block_size": [16, 32],
    "enable_prefix_caching": [True, False],
    "kv_cache_dtype": ["auto", "fp8"],  # fp8 only where lossy settings are allowed
}
DEFAULTS: dict[str, Any] = {
    "max_num_seqs": 1024,
    "enable_chunked_prefill": True,
    "max_num_batched_tokens": 8192,
    "gpu_memory_utilization": 0.92,
    "block_size": 16,
    "enable_prefix_caching": True,
    "kv_cache_dtype": "auto",
}
UNCHUNKED_BUDGET = 8192  # vLLM's step budget without chunking: max(max_model_len, 8192)


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Deployment:
    """Constants of one synthetic deployment: model x GPU x workload x SLA."""

    weights_gib: float
    kv_kib_per_token: float  # bf16 KV cache of one token, all layers
    step_floor_ms: float  # decode step at batch 1: weight reads + launch overhead
    kv_ms_per_mtok: float  # step time per million KV-cache tokens read (bf16)
    prefill_ms_per_ktok: float  # prefill compute per 1000 prompt tokens at full efficiency
    input_tokens: int
    output_tokens: int
    rate: float  # the SLA's own arrival rate (req/s)
    ttft_ms: float  # p99 limits
    tpot_ms: float
    gpu_gib: float = 140.0
    foreign_gib: float = 1.0  # held outside vLLM's budget: CUDA context, other processes
    graph_gib_per_kseq: float = 1.5  # CUDA graphs + sampler buffers, per 1024 max_num_seqs


@dataclass(frozen=True)
class Truth:
    """A config's noise-free behaviour: what an ideal measurement would report."""

    goodput: float  # req/s at the highest rate meeting both p99 limits (0: none)
    ttft_ms: float  # p99 at the SLA's own rate (inf: the queue grows without bound)
    tpot_ms: float
    launch_error: str | None = None  # "out_of_memory" when the engine can't start

    @property
    def feasible(self) -> bool:
        return self.launch_error is None and self.goodput > 0


def _setting(p: Params, name: str) -> Any:
    v = p.get(name)
    return DEFAULTS[name] if v is None else v


def kv_tokens(d: Deployment, p: Params) -> tuple[float, str | None]:
    """KV-cache capacity in tokens, or why the launch fails.

    vLLM profiles weights + one step's activations inside ``gpu_memory_utilization`` and gives
    the rest to the KV cache; CUDA graphs and the CUDA context come on top of that budget, so
    a high utilization with a large ``max_num_seqs`` runs out of memory at start-up.
    """
    gmu = float(_setting(p, "gpu_memory_utilization"))
    seqs = int(_setting(p, "max_num_seqs"))
    step_tokens = _step_budget(p)
    graphs = 0.3 + d.graph_gib_per_kseq * seqs / 1024
    if gmu * d.gpu_gib + graphs + d.foreign_gib > d.gpu_gib:
        return 0.0, "out_of_memory"
    activations = 0.5 + 0.6 * step_tokens / 8192
    kv_gib = gmu * d.gpu_gib - d.weights_gib - activations
    if kv_gib < 0.5:
        return 0.0, "out_of_memory"
    per_token = d.kv_kib_per_token / (2 if _setting(p, "kv_cache_dtype") == "fp8" else 1)
    return kv_gib * 2**20 / per_token, None


def _step_budget(p: Params) -> int:
    if _setting(p, "enable_chunked_prefill"):
        return int(_setting(p, "max_num_batched_tokens"))
    return UNCHUNKED_BUDGET


BURSTINESS = 3.0
GATHER = 4  # prompts one prefill step gathers under load, at most
UNCHUNKED_STALL = 2.0

# Attention kernels are a little faster on larger pages (small effect; fragmentation below).
BLOCK_SPEED = {16: 1.0, 32: 0.99, 64: 0.985, 128: 0.99}


def latencies(d: Deployment, p: Params, kv: float, rate: float) -> tuple[float, float, float]:
    """p99 TTFT, p99 TPOT and mean TPOT (ms) at Poisson ``rate``; inf when overloaded.

    Decode steps are memory-bound: a floor plus KV reads that grow with the batch. Prefill
    takes a share ``rho`` of GPU time, stretching every decode step by ``1 / (1 - rho)``. A step
    prefills what is queued, up to the step budget (``max_num_batched_tokens`` minus the
    decodes): small budgets split prompts (slower first token, less efficient prefill), large
    ones let a step gather several prompts, and that long step stalls every decode in it (the
    p99 TPOT tail). Without chunked prefill a prompt is never split and the budget is vLLM's
    own. Requests beyond ``max_num_seqs`` wait for a slot (TTFT); a batch beyond what the KV
    cache holds preempts and recomputes (TPOT blows up: the cliff).
    """
    i, o = d.input_tokens, d.output_tokens
    seqs = int(_setting(p, "max_num_seqs"))
    block = int(_setting(p, "block_size"))
    budget = _step_budget(p)
    chunked = bool(_setting(p, "enable_chunked_prefill"))
    fp8 = _setting(p, "kv_cache_dtype") == "fp8"
    # Random prompts never share a prefix: caching neither helps nor measurably hurts.
    ctx = i + o / 2 + block / 2  # mean tokens a running sequence holds (half a page wasted)
    fits = kv / (i + o + block / 2)  # sequences that fit at full length
    kv_ms = d.kv_ms_per_mtok / 1e6 * (0.6 if fp8 else 1.0) * BLOCK_SPEED.get(block, 1.0)
    prefill_ms_per_tok = d.prefill_ms_per_ktok / 1000

    def shape(running: float) -> tuple[float, float, float]:
        """Prefill tokens a step can take, a typical prefill step, and prefill's GPU share."""
        room = max(budget - min(running, seqs), 64) if chunked else max(budget, i)
        step = min(room, GATHER * i) if chunked else max(i, min(room, GATHER * i))
        efficiency = step / (step + 600)  # small steps underuse the tensor cores
        return room, step, rate * i * prefill_ms_per_tok / 1000 / efficiency

    def decode_ms(batch: float, rho: float) -> float:
        return (d.step_floor_ms + batch * ctx * kv_ms) / (1 - rho)

    # Running requests (Little's law) and TPOT depend on each other: iterate to the fixed point.
    tpot = d.step_floor_ms
    running = 0.0
    for _ in range(80):
        running = rate * o * tpot / 1000
        rho = shape(running)[2]
        if rho >= 0.95:
            return math.inf, math.inf, math.inf
        nxt = decode_ms(min(running, seqs), rho)
        if running > fits:  # steady-state preemption: recomputation inflates every step
            nxt *= 1 + 2 * (running / fits - 1)
        if abs(nxt - tpot) < 1e-6:
            break
        tpot = 0.5 * (tpot + nxt)
    running = rate * o * tpot / 1000
    room, step, rho = shape(running)
    if rho >= 0.95 or running >= 0.98 * seqs or running >= 3 * fits:
        return math.inf, math.inf, math.inf
    # p99 batch: Poisson spread, widened because a freed slot admits a waiting burst at once.
    burst = min(seqs, running + 2.33 * BURSTINESS * math.sqrt(running))
    tpot99 = decode_ms(burst, rho)
    if burst > fits:
        tpot99 *= 1 + 4 * (burst / fits - 1)
    stall_ms = step * prefill_ms_per_tok / (step / (step + 600))
    if not chunked:  # whole prompts, and the decodes of that step wait for all of them
        stall_ms *= UNCHUNKED_STALL
    prefills_seen = running * i / step  # prefill steps during one request's decode
    tpot99 += stall_ms * 2.33 * math.sqrt(max(prefills_seen, 1)) / o
    # TTFT: the prompt's own chunks, the prefill queue, then the wait for a free slot (Erlang C
    # via Sakasegawa's approximation, p99 of the exponential waiting-time tail).
    chunks = math.ceil(i / room)
    prefill_ms = chunks * (decode_ms(running, rho) + min(room, i) * prefill_ms_per_tok)
    prefill_wait = prefill_ms * rho / (1 - rho) * 3
    util = running / seqs
    p_wait = util ** math.sqrt(2 * (seqs + 1))
    slot_wait = 0.0
    if p_wait > 0.01:
        slot_wait = o * tpot / (seqs * (1 - util)) * math.log(p_wait / 0.01)
    return prefill_ms + prefill_wait + slot_wait, tpot99, tpot


def served(d: Deployment, p: Params, kv: float, rate: float) -> tuple[float, float]:
    """The served request rate and mean TPOT (ms) a load generator would see at ``rate``.

    An overloaded engine serves what it can: the highest rate that does not overload it, with
    that rate's TPOT (its batch is full).
    """
    tpot = latencies(d, p, kv, rate)[2]
    if math.isfinite(tpot):
        return rate, tpot
    lo, hi = 0.0, rate
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.isfinite(latencies(d, p, kv, mid)[2]) else (lo, mid)
    return lo, latencies(d, p, kv, lo)[2] if lo > 0 else d.step_floor_ms


def truth(d: Deployment, p: Params) -> Truth:
    """SLA goodput by bisection on the rate; latencies at the SLA's own rate."""
    kv, err = kv_tokens(d, p)
    if err:
        return Truth(0.0, math.inf, math.inf, err)
    ttft, tpot, _ = latencies(d, p, kv, d.rate)

    def meets(rate: float) -> bool:
        t, s, _ = latencies(d, p, kv, rate)
        return t <= d.ttft_ms and s <= d.tpot_ms

    if not meets(d.rate):
        return Truth(0.0, ttft, tpot)
    lo, hi = d.rate, d.rate * 2
    while meets(hi):
        lo, hi = hi, hi * 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return Truth(lo, ttft, tpot)


# --------------------------------------------------------------------------- the surfaces


@dataclass(frozen=True)
class Surface:
    name: str
    doc: str
    deployment: Deployment
    allow_lossy: bool
    sla: Sla = field(repr=False)

    def truth(self, p: Params) -> Truth:
        return truth(self.deployment, p)

    def points(self) -> list[dict[str, Any]]:
        return grid_points(self.allow_lossy)

    def grid_order(self) -> list[dict[str, Any]]:
        """What the ``grid`` method launches, in order (the defaults are a grid point)."""
        return self.points()

    def space(self) -> SearchSpace:
        return search_space(self)

    def measure(
        self, p: Params, t: Truth, z: np.ndarray, start: float | None = None
    ) -> TrialResult:
        """What a real trial would record (``run_trial``'s ``trial.json``): the capacity search
        from the SLA's own rate (or ``start``, a candidate raced against the incumbent), each
        level measured at its own rate (:meth:`level_at`) with this run's noise ``z``."""
        params = dict(p)
        if t.launch_error:
            return TrialResult(
                params, "failed", "rate", reason="CUDA out of memory", cause=t.launch_error
            )
        kv = kv_tokens(self.deployment, p)[0]
        return _found(
            params,
            self.sla,
            self.deployment.rate,
            lambda r: self.level_at(p, kv, z, r),
            start,
        )

    def level_at(self, p: Params, kv: float, z: np.ndarray, rate: float) -> Seen:
        """One load level at ``rate`` as a load generator and ``evaluate`` would record it.

        The run's noise: ``z[2]`` is the engine's speed in this run (a run ``z[2]`` times as
        fast sees the load of ``rate / z[2]``: its capacity, the SLA goodput, scales by
        ``z[2]``), ``z[0]`` and ``z[1]`` multiply the p99 TTFT and TPOT it measures. The latencies
        are the model's at this level's own rate (:func:`latencies`); an overloaded engine
        (the queue grows without bound) serves what it can (:func:`served`), with its p99 TTFT
        at 10x the limit (a stand-in for a growing queue) and its p99 TPOT that of its full
        batch at the rate it serves. Mean TTFT: a quarter of the p99 (the p99 is several means
        out in a waiting-time tail); mean E2E: that plus the mean TPOT of every later token.
        """
        d = self.deployment
        load = rate / z[2]
        ttft99, tpot99, _ = latencies(d, p, kv, load)
        kept, tpot_mean = served(d, p, kv, load)
        if not math.isfinite(ttft99):
            ttft99 = 10 * d.ttft_ms
            tpot99 = latencies(d, p, kv, kept)[1] if kept > 0 else math.inf
        ttft = min(ttft99, 10 * d.ttft_ms) * z[0]
        tpot = min(tpot99, 10 * d.tpot_ms) * z[1]
        served_rate = kept * z[2]
        mean_ttft = ttft / 4
        metrics: dict[str, float | None] = {
            "p99_ttft_ms": ttft,
            "p99_tpot_ms": tpot,
            "request_rate": served_rate,
            "mean_ttft_ms": mean_ttft,
            "mean_e2e_ms": mean_ttft + (d.output_tokens - 1) * tpot_mean * z[1],
        }
        return Seen.judged(self.sla, metrics, rate, served_rate)


@dataclass(frozen=True)
class Seen:
    """One load level as ``run_trial`` records it (:class:`Level`'s measured fields)."""

    metrics: dict[str, float | None]
    margins: dict[str, float | None]  # per SLA constraint key; None: not measured
    verdicts: dict[str, Outcome]  # per SLA constraint key; empty: the record does not say
    sent_rate: float | None = None
    served_rate: float | None = None
    sustained: bool | None = None
    margin: float | None = None  # the level's search margin (``judge``'s); None: unknown
    verdict: Outcome | None = None  # None: combined from ``verdicts`` and ``sustained``

    @classmethod
    def judged(
        cls,
        sla: Sla,
        metrics: dict[str, float | None],
        sent: float | None,
        served: float | None,
    ) -> Seen:
        """Each SLA constraint judged on ``metrics`` by its point value (relative margin,
        <= 0 met), whether the engine kept up (served at least ``1 - SUSTAIN_TOLERANCE`` of the
        rate sent) and the level's search margin, as :func:`autotuner.measure.levels.judge`
        decides a level with enough requests that its confidence intervals sit on the point
        values (a met load-independent limit, peak memory, is left out of the search margin;
        the served/sent shortfall counts once the engine visibly falls behind)."""
        margins: dict[str, float | None] = {}
        verdicts: dict[str, Outcome] = {}
        search: list[float] = []
        informative = True
        for c in sla.constraints:
            value = metrics.get(c.metric)
            if value is None or not math.isfinite(value):
                margins[c.key], verdicts[c.key] = None, "misses"
                informative = False
                continue
            margin = (value - c.limit) / c.limit if c.limit else value - c.limit
            margins[c.key] = margin
            verdicts[c.key] = "meets" if margin <= 0 else "misses"
            if margin > 0 or (c.limit != 0 and c.metric not in LOAD_INDEPENDENT):
                search.append(margin)
        sustained = None
        if sent is not None and served is not None and sent > 0:
            ratio = served / sent
            sustained = ratio >= 1 - SUSTAIN_TOLERANCE
            if ratio < 1 - SUSTAIN_TOLERANCE / 4:
                search.append((1 - SUSTAIN_TOLERANCE - ratio) / (1 - SUSTAIN_TOLERANCE))
        worst = max(search) if informative and search else None
        return cls(metrics, margins, verdicts, sent, served, sustained, worst)

    def outcome(self) -> Outcome:
        if self.verdict is not None:
            return self.verdict
        outcomes = list(self.verdicts.values())
        if self.sustained is False:
            outcomes.append("misses")
        return combine(outcomes)


def _found(
    params: dict[str, Any],
    sla: Sla,
    rate: float,
    level_at: Callable[[float], Seen],
    start: float | None = None,
) -> TrialResult:
    """A launch's result as ``run_trial`` records it: the capacity search ``tune`` runs
    (:class:`CapacitySearch`, step 1.5, resolution 3 %, at most 8 levels) from the SLA's own
    rate, or from ``start`` (a candidate raced against the incumbent), each level as
    ``level_at`` measures it at its own rate: its metrics, a margin and a verdict per
    constraint key, the rates sent and served. The capacity, the best level and the reason
    of a launch that met the SLA nowhere follow from those levels as in ``run_trial``. Every
    level is one level of the launch's cost (:data:`LEVEL_S`)."""
    search = CapacitySearch(
        start or rate, resolution=RESOLUTION, max_levels=MAX_LEVELS, step=RATE_STEP
    )
    levels: list[Level] = []
    while (r := search.next_rate()) is not None:
        seen = level_at(r)
        verdict = seen.outcome()
        search.record(r, verdict, seen.margin)
        served = seen.served_rate if seen.served_rate is not None else r
        metrics = {**seen.metrics, "goodput": served if verdict == "meets" else 0.5 * served}
        levels.append(
            Level(
                r,
                verdict == "meets",
                metrics,
                dict(seen.margins),
                {},
                {},
                f"level-{len(levels)}.json",
                verdict=verdict,
                verdicts=dict(seen.verdicts),
                sent_rate=seen.sent_rate,
                served_rate=seen.served_rate,
                sustained=seen.sustained,
            )
        )
    cap = search.result()
    settings = SearchSettings(
        max_levels=MAX_LEVELS, step=RATE_STEP, resolution=RESOLUTION, start_load=start
    )
    record = cap.to_record(describe_stop(cap, levels, arrival_of(sla), settings), RESOLUTION)
    best = None
    for i, lv in enumerate(levels):
        if lv.feasible and cap.low > 0 and math.isclose(lv.load, cap.low, rel_tol=1e-9):
            best = i
    if best is None:
        return TrialResult(
            params, "stopped_early", "rate", tuple(levels), None, record.note, capacity=record
        )
    return TrialResult(params, "complete", "rate", tuple(levels), best, capacity=record)


def _surface(name: str, d: Deployment, allow_lossy: bool, doc: str) -> Surface:
    sla = parse_sla(
        f"name: {name}\n"
        "model: {synth: llama-3.1-8b}\n"
        f"workload: {{input_tokens: {d.input_tokens}, output_tokens: {d.output_tokens}, "
        f"arrival: {{process: poisson, rate: {d.rate}}}, requests: 600}}\n"
        f"constraints: {{p99_ttft_ms: {d.ttft_ms}, p99_tpot_ms: {d.tpot_ms}}}\n"
        "objectives: [{maximize: capacity}]\n"
    )
    return Surface(name, " ".join(doc.split()), d, allow_lossy, sla)


def h200_8b_like() -> Surface:
    """Llama 3.1 8B (bf16) on an H200, chat: 1024 in / 256 out at 22 req/s, p99 TTFT 300 ms,
    TPOT 20 ms.

    Decode-bound: goodput rises with max_num_seqs until the TPOT limit binds; a larger cap
    lets bursts in that cost p99 TPOT (a few % of goodput, and infeasible with a 2048 budget or
    without chunking). 32/64 queue too much; the KV cache is never short. Defaults: ~94 %.
    """
    d = Deployment(
        weights_gib=15.0,
        kv_kib_per_token=128,
        step_floor_ms=5.0,
        kv_ms_per_mtok=35.0,
        prefill_ms_per_ktok=14.0,
        input_tokens=1024,
        output_tokens=256,
        rate=22.0,
        ttft_ms=300.0,
        tpot_ms=20.0,
    )
    return _surface("h200-8b-like", d, False, h200_8b_like.__doc__ or "")


def latency_bound() -> Surface:
    """8B, interactive: 1024 in / 512 out at 8 req/s, p99 TTFT 300 ms, TPOT 10 ms.

    Only max_num_seqs 64 meets the SLA: 32 queues past the TTFT limit, 128 and up let batches
    grow past the TPOT limit (the cliff), and so does prefill without chunking. The engine
    defaults are infeasible.
    """
    d = Deployment(
        weights_gib=15.0,
        kv_kib_per_token=128,
        step_floor_ms=5.0,
        kv_ms_per_mtok=35.0,
        prefill_ms_per_ktok=14.0,
        input_tokens=1024,
        output_tokens=512,
        rate=8.0,
        ttft_ms=300.0,
        tpot_ms=10.0,
    )
    return _surface("latency-bound", d, False, latency_bound.__doc__ or "")


def memory_bound() -> Surface:
    """A 70B model with FP8 weights on one H200, 6 GiB held by another process; lossy allowed.

    Long batch-style requests: 4096 in / 1024 out at 0.7 req/s, p99 TTFT 5 s, TPOT 100 ms. The
    KV cache is what limits: in bf16 nothing meets the SLA (the defaults neither), fp8 KV
    doubles the sequences that fit; a max_num_seqs above what fits preempts in bursts (cliff),
    and gpu_memory_utilization 0.95 with max_num_seqs >= 256 runs out of memory at launch.
    """
    d = Deployment(
        weights_gib=68.0,
        kv_kib_per_token=320,
        step_floor_ms=17.0,
        kv_ms_per_mtok=90.0,
        prefill_ms_per_ktok=70.0,
        input_tokens=4096,
        output_tokens=1024,
        rate=0.7,
        ttft_ms=5000.0,
        tpot_ms=100.0,
        foreign_gib=6.0,
        graph_gib_per_kseq=3.0,
    )
    return _surface("memory-bound", d, True, memory_bound.__doc__ or "")


def defaults_best() -> Surface:
    """8B, short chat turns with loose limits: 256 in / 128 out at 20 req/s, p99 TTFT 1 s,
    TPOT 60 ms.

    Nothing binds until the GPU saturates, so goodput grows with max_num_seqs up to the largest
    value, the default; the rest hardly matters. The engine defaults are the best config.
    """
    d = Deployment(
        weights_gib=15.0,
        kv_kib_per_token=128,
        step_floor_ms=5.0,
        kv_ms_per_mtok=35.0,
        prefill_ms_per_ktok=14.0,
        input_tokens=256,
        output_tokens=128,
        rate=20.0,
        ttft_ms=1000.0,
        tpot_ms=60.0,
    )
    return _surface("defaults-best", d, False, defaults_best.__doc__ or "")


class Replayable(Protocol):
    """A response surface a search can be replayed on."""

    @property
    def name(self) -> str: ...

    @property
    def doc(self) -> str: ...

    @property
    def allow_lossy(self) -> bool: ...

    @property
    def sla(self) -> Sla: ...

    def truth(self, p: Params) -> Truth: ...

    def points(self) -> list[dict[str, Any]]: ...

    def grid_order(self) -> list[dict[str, Any]]: ...

    def space(self) -> SearchSpace: ...

    def measure(
        self, p: Params, t: Truth, z: np.ndarray, start: float | None = None
    ) -> TrialResult: ...


# --------------------------------------------------------------------------- measured surface

H200_GRID = Path(__file__).resolve().parent.parent / "docs/benchmarks/h200-llama3-8b/trials"
H200_EQUAL_MEMORY = (
    Path(__file__).resolve().parent.parent
    / "docs/benchmarks/h200-llama3-8b-capacity/grid/llama3-8b-h200-grid.tar.gz"
)
H200_DEFAULTS = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}  # vLLM 0.26, H200


@dataclass(frozen=True)
class Recorded:
    """One load level of a recorded launch, as its ``trial.json`` has it."""

    load: float
    met: bool
    metrics: dict[str, float]
    margins: dict[str, float | None]
    verdicts: dict[str, Outcome]  # empty in records written before per-constraint verdicts
    sent_rate: float | None
    served_rate: float | None
    sustained: bool | None

    @classmethod
    def of(cls, level: Mapping[str, Any]) -> Recorded:
        margins = dict(level["margins"])
        met = level.get("verdict", "meets" if level["feasible"] else "misses") == "meets"
        return cls(
            float(level["load"]),
            met,
            {k: float(v) for k, v in level["metrics"].items() if v is not None},
            margins,
            dict(level.get("verdicts") or {}),
            level.get("sent_rate"),
            level.get("served_rate"),
            level.get("sustained"),
        )


@dataclass(frozen=True)
class Measured:
    """One launch of an H200 grid study: its SLA goodput (or capacity) and its levels: the
    first at the SLA's own load (15 req/s), and the first miss above its capacity, the level
    that shows which limit ended it (None: every level it ran met the SLA, an open bracket)."""

    trial: int
    feasible: bool
    goodput: float  # 0 when it missed the SLA at its own load
    levels: tuple[Recorded, ...]
    miss: Recorded | None

    @property
    def level0(self) -> dict[str, float]:
        return self.levels[0].metrics


@dataclass(frozen=True)
class RealSurface:
    """The H200 grid study, replayed: Llama-3.1-8B shape on one H200, vLLM 0.26.0, 1024 in /
    256 out at 15 req/s, p99 TTFT 300 ms, TPOT 20 ms, <= 130 GiB (docs/benchmarks/
    h200-llama3-8b.md). Every grid point ran at gpu_memory_utilization 0.90 and met the SLA
    at 15 req/s; the defaults (0.92) took 130.45 GiB and missed it. Caveat from that doc:
    levels above the first re-sent cached prompts, so goodputs above 15 req/s are overstated
    (the ranking rests on them); the first level is valid."""

    name: str
    doc: str
    sla: Sla = field(repr=False)
    records: dict[tuple[int, int], Measured] = field(repr=False)
    order: list[tuple[int, int]] = field(repr=False)  # the grid study's launch order
    allow_lossy: bool = False
    nearest: list[int] = field(default_factory=lambda: [0], repr=False)  # replays by nearest

    @classmethod
    def load(cls, folder: Path = H200_GRID) -> RealSurface:
        """The first grid study: one ``trial-NNN.json`` per launch, ranked by SLA goodput."""
        files = sorted(folder.glob("trial-*.json"))
        launches = ((int(f.stem.split("-")[1]), json.loads(f.read_text())) for f in files)
        doc = " ".join((cls.__doc__ or "").split())
        return cls._of("h200-8b-real", doc, launches, by_capacity=False)

    @classmethod
    def load_study(cls, tarball: Path = H200_EQUAL_MEMORY) -> RealSurface:
        """The equal-memory grid study: its tarball's ``trial-NNN/trial.json`` records, ranked
        by measured capacity (bracketed to 3 %); a launch without a record (interrupted) is
        left out, and a grid point not yet measured replays as its nearest (``nearest``)."""
        launches = []
        with tarfile.open(tarball) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if member.isfile() and parts[-1] == "trial.json" and len(parts) >= 2:
                    f = tar.extractfile(member)
                    if f is not None:
                        launches.append((int(parts[-2].split("-")[1]), json.load(f)))
        doc = (
            "The H200 grid study at equal memory (docs/benchmarks/h200-llama3-8b-capacity.md, "
            "third piece): the same model, SLA and grid as h200-8b-real, but every config, the "
            "engine defaults included, at gpu_memory_utilization 0.88 (all met the SLA at 15 "
            "req/s), fresh prompts per level, and capacity measured to 3 % in place of goodput."
        )
        return cls._of("h200-8b-equal-memory", doc, sorted(launches), by_capacity=True)

    @classmethod
    def _of(
        cls, name: str, doc: str, launches: Iterable[tuple[int, dict[str, Any]]], by_capacity: bool
    ) -> RealSurface:
        records: dict[tuple[int, int], Measured] = {}
        for trial, data in launches:
            if not data.get("levels"):
                continue
            best = data["best"]
            levels = tuple(Recorded.of(lv) for lv in data["levels"])
            capacity = data.get("capacity") or {}
            if by_capacity:
                goodput = float(capacity.get("value") or 0.0) if best is not None else 0.0
            else:
                goodput = data["levels"][best]["metrics"]["goodput"] if best is not None else 0.0
            top = max((lv.load for lv in levels if lv.met), default=None)
            high = capacity.get("high")
            above = [
                lv
                for lv in levels
                if not lv.met
                and top is not None
                and lv.load > top
                and (high is None or math.isclose(lv.load, high, rel_tol=1e-9))
            ]
            # The bracket's high edge: the lowest load above the capacity that missed (the
            # last of its runs when it was re-measured).
            low_miss = min((lv.load for lv in above), default=None)
            miss = next((lv for lv in reversed(above) if lv.load == low_miss), None)
            params = {**H200_DEFAULTS, **data["params"]}
            key = (int(params["max_num_seqs"]), int(params["max_num_batched_tokens"]))
            records[key] = Measured(trial, best is not None, goodput, levels, miss)
        order = sorted(records, key=lambda k: records[k].trial)
        sla = parse_sla(
            f"name: {name}\n"
            "model: {synth: llama-3.1-8b}\n"
            "workload: {input_tokens: 1024, output_tokens: 256, "
            "arrival: {process: poisson, rate: 15}, requests: 300}\n"
            "constraints: {p99_ttft_ms: 300, p99_tpot_ms: 20, max_gpu_memory_gib: 130}\n"
            "objectives: [{maximize: capacity}]\n"
        )
        return cls(name, doc, sla, records, order)

    def _key(self, p: Params) -> tuple[int, int]:
        full = {**H200_DEFAULTS, **{k: v for k, v in p.items() if v is not None}}
        return int(full["max_num_seqs"]), int(full["max_num_batched_tokens"])

    def record(self, p: Params) -> Measured:
        """The measured launch of ``p``; a config the grid did not run (only the defaults'
        max_num_seqs with another step budget can come up) replays as the nearest grid point
        on a log scale, counted in ``nearest``."""
        key = self._key(p)
        if key in self.records:
            return self.records[key]
        self.nearest[0] += 1
        grid = [k for k in self.records if self.records[k].trial != 0]
        return self.records[
            min(grid, key=lambda k: sum(abs(math.log(a / b)) for a, b in zip(k, key, strict=True)))
        ]

    def truth(self, p: Params) -> Truth:
        m = self.record(p)
        return Truth(
            m.goodput if m.feasible else 0.0, m.level0["p99_ttft_ms"], m.level0["p99_tpot_ms"]
        )

    def points(self) -> list[dict[str, Any]]:
        return [
            {"max_num_seqs": k[0], "max_num_batched_tokens": k[1]}
            for k in self.order
            if self.records[k].trial != 0
        ]

    def grid_order(self) -> list[dict[str, Any]]:
        """The grid study as it ran: the defaults first, then its points in trial order."""
        return [{}, *self.points()]

    def space(self) -> SearchSpace:
        """vLLM 0.26.0 on one H200, narrowed to the grid's two dimensions."""
        full = load_space(
            "vllm",
            "0.26.0",
            device="gpu",
            gpu_count=1,
            compute_capability=(9, 0),
            allow_lossy=False,
            overrides={},
        )
        values = {
            "max_num_seqs": sorted({k[0] for k in self.records if self.records[k].trial}),
            "max_num_batched_tokens": sorted({k[1] for k in self.records if self.records[k].trial}),
        }
        overrides = {
            name: ParamOverride(values=list(values[name]))
            if name in values
            else ParamOverride(exclude=True)
            for name in full.names
        }
        return load_space(
            "vllm",
            "0.26.0",
            device="gpu",
            gpu_count=1,
            compute_capability=(9, 0),
            allow_lossy=False,
            overrides=overrides,
        )

    def measure(
        self, p: Params, t: Truth, z: np.ndarray, start: float | None = None
    ) -> TrialResult:
        """The capacity search from 15 req/s (or ``start``) up to the recorded SLA goodput
        (capacity) times this run's speed ``z[2]``, each level replayed from the record
        (:meth:`level_at`) with the run's noise on its p99 latencies (``z[0]``, ``z[1]``)."""
        m = self.record(p)
        top = max(15.0, m.goodput * z[2])
        return _found(dict(p), self.sla, 15.0, lambda r: self.level_at(m, z, top, r), start)

    def level_at(self, m: Measured, z: np.ndarray, top: float, rate: float) -> Seen:
        """A level at ``rate`` replayed from the record ``m``, as far as it allows.

        Up to the capacity ``top``: the recorded levels that met the SLA (every level when
        none did), linearly interpolated by load (clamped at the ends): served rate, mean TTFT
        and E2E, p99s (times the run's noise), peak memory; each constraint judged on those.
        The served/sent ratio where the record has one (the equal-memory study; the first
        grid study did not record it, so its levels are not judged on it).

        Above it: the record's first miss above its capacity as measured (its metrics, its
        verdict per constraint, or the verdicts its margins give in the older records): the
        limit that ended its capacity. Where the record has no such level (every level it ran
        met the SLA: the first grid study stopped at 33.75 req/s, so most of its points end
        in an open bracket), the record cannot say which limit would have ended it: the level
        misses with no verdicts and no margins (not measured), and the metrics of the highest
        level that met."""
        met = [lv for lv in m.levels if lv.met]
        if rate <= top * (1 + 1e-12) or not met:
            metrics, ratio = _interpolate(met or list(m.levels), rate)
            for k, f in (("p99_ttft_ms", z[0]), ("p99_tpot_ms", z[1])):
                if k in metrics:
                    metrics[k] *= f
            served = None if ratio is None else rate * ratio
            return Seen.judged(self.sla, dict(metrics), rate if ratio else None, served)
        if m.miss is not None:
            miss = m.miss
            ratio = (
                miss.served_rate / miss.sent_rate
                if miss.sent_rate and miss.served_rate is not None
                else None
            )
            seen = Seen.judged(
                self.sla,
                dict(miss.metrics),
                rate if ratio else None,
                None if ratio is None else rate * ratio,
            )
            keys = [c.key for c in self.sla.constraints]
            verdicts = {k: miss.verdicts[k] for k in keys if k in miss.verdicts} or seen.verdicts
            return dataclasses.replace(seen, verdicts=verdicts, verdict="misses")
        top_level = max(met, key=lambda lv: lv.load)
        return Seen(
            dict(top_level.metrics),
            {c.key: None for c in self.sla.constraints},
            {},
            verdict="misses",
        )


def _interpolate(levels: Sequence[Recorded], rate: float) -> tuple[dict[str, float], float | None]:
    """The recorded levels' metrics at ``rate``, linear in the load between the two levels
    around it (clamped to the lowest and highest), and their served/sent ratio (None when
    not recorded). A load measured twice (an undecided level re-measured) counts its last
    run."""
    by_load = {lv.load: lv for lv in levels}
    loads = sorted(by_load)
    lo = max((x for x in loads if x <= rate), default=loads[0])
    hi = min((x for x in loads if x >= rate), default=loads[-1])
    a, b = by_load[lo], by_load[hi]
    w = 0.0 if hi == lo else (rate - lo) / (hi - lo)

    def mix(x: float, y: float) -> float:
        return x + w * (y - x)

    metrics = {k: mix(a.metrics[k], b.metrics[k]) for k in a.metrics if k in b.metrics}

    def ratio(lv: Recorded) -> float | None:
        if lv.sent_rate and lv.served_rate is not None:
            return lv.served_rate / lv.sent_rate
        return None

    ra, rb = ratio(a), ratio(b)
    return metrics, None if ra is None or rb is None else mix(ra, rb)


# --------------------------------------------------------------------------- long prompts


LONG_BUDGETS = [1024, 2048, 4096, 8192, 16384]
LONG_THRESHOLDS = [0, 256, 512, 1024, 2048, 4096]
LONG_SEQS = [16, 24, 32, 48, 64, 96, 128, 256, 512, 1024]
LONG_DEFAULTS = {
    "max_num_seqs": 1024,
    "max_num_batched_tokens": 8192,
    "long_prefill_token_threshold": 0,
}
# p99 TPOT / p99 TTFT factors of the step budget and of the long-prefill cap (see the doc).
LONG_BUDGET_EFFECT = {
    1024: (1.0, 1.8),
    2048: (0.97, 1.3),
    4096: (0.985, 1.1),
    8192: (1.0, 1.0),
    16384: (1.05, 0.95),
}
LONG_CAP_EFFECT = {
    0: (1.0, 1.0),
    256: (0.985, 1.15),
    512: (0.985, 1.08),
    1024: (0.99, 1.04),
    2048: (1.0, 1.0),
    4096: (1.0, 1.0),
}


@dataclass(frozen=True)
class LongPromptSurface:
    """Llama-3.1-8B shape on one GPU, prompts of about 2,000 tokens: 2000 in / 256 out at
    5 req/s, p99 TPOT 15 ms, p99 TTFT 2 s, lossless. The engine defaults miss p99 TPOT by 12 %:
    the prefill work of long prompts shares decode steps. max_num_seqs only trades TPOT for
    TTFT (a cap below the p99 burst cuts the decode batch, the requests over it wait for a
    slot), a step budget of 2048 or 4096 and a long-prefill cap take 1.5-3 % off TPOT at a TTFT
    cost, and no setting of the three meets both limits (an analytic stand-in for the study of
    issue 37, not a measurement)."""

    name: str = "long-prompt-tpot"
    allow_lossy: bool = False
    rate: float = 5.0
    tpot_ms: float = 15.0
    ttft_ms: float = 2000.0
    output_tokens: int = 256

    @property
    def doc(self) -> str:
        return " ".join((LongPromptSurface.__doc__ or "").split())

    @property
    def sla(self) -> Sla:
        return parse_sla(
            f"name: {self.name}\n"
            "model: {synth: llama-3.1-8b}\n"
            f"workload: {{input_tokens: 2000, output_tokens: {self.output_tokens}, "
            f"arrival: {{process: poisson, rate: {self.rate}}}, requests: 600}}\n"
            f"constraints: {{p99_ttft_ms: {self.ttft_ms}, p99_tpot_ms: {self.tpot_ms}}}\n"
            "objectives: [{maximize: capacity}]\n"
        )

    def latencies(self, p: Params, rate: float) -> tuple[float, float, float]:
        """p99 TTFT, p99 TPOT and the requests in flight at ``rate`` (inf: slots too few)."""
        seqs = int(p.get("max_num_seqs") or LONG_DEFAULTS["max_num_seqs"])
        budget = int(p.get("max_num_batched_tokens") or LONG_DEFAULTS["max_num_batched_tokens"])
        cap = int(p.get("long_prefill_token_threshold") or 0)
        tb, fb = LONG_BUDGET_EFFECT.get(budget, (1.0, 1.0))
        tc, fc = LONG_CAP_EFFECT.get(cap, (1.0, 1.0))
        running = 20.0 * rate / self.rate
        if seqs <= running:
            return math.inf, math.inf, running
        burst = running + 7 * math.sqrt(running)
        x = min(1.0, seqs / burst)
        tpot = 16.8 * math.sqrt(rate / self.rate) * tb * tc * (0.8 + 0.2 * x)
        ttft = 900 * (rate / self.rate) * fb * fc + 12000 * (1 - x)
        return ttft, tpot, running

    def truth(self, p: Params) -> Truth:
        ttft, tpot, _ = self.latencies(p, self.rate)

        def meets(rate: float) -> bool:
            t, s, _ = self.latencies(p, rate)
            return t <= self.ttft_ms and s <= self.tpot_ms

        if not meets(self.rate):
            return Truth(0.0, ttft, tpot)
        lo, hi = self.rate, self.rate * 2
        while meets(hi):
            lo, hi = hi, hi * 2
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if meets(mid) else (lo, mid)
        return Truth(lo, ttft, tpot)

    def points(self) -> list[dict[str, Any]]:
        return [
            {"max_num_seqs": s, "max_num_batched_tokens": b, "long_prefill_token_threshold": c}
            for c in LONG_THRESHOLDS
            for b in LONG_BUDGETS
            for s in LONG_SEQS
        ]

    def grid_order(self) -> list[dict[str, Any]]:
        return self.points()

    def space(self) -> SearchSpace:
        """The three knobs: max_num_seqs as the space file's log range (so that a warm start
        sized from a measurement can land 1 apart), the step budget on its list, the cap on
        the file's own choices; everything else left to the engine."""

        def space(overrides: Mapping[str, ParamOverride]) -> SearchSpace:
            return load_space(
                "vllm",
                VLLM_VERSION,
                device="gpu",
                gpu_count=1,
                compute_capability=(9, 0),
                allow_lossy=False,
                overrides=overrides,
            )

        keep = {"max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold"}
        overrides = {n: ParamOverride(exclude=True) for n in space({}).names if n not in keep}
        overrides["max_num_batched_tokens"] = ParamOverride(values=list(LONG_BUDGETS))
        return space(overrides)

    def measure(
        self, p: Params, t: Truth, z: np.ndarray, start: float | None = None
    ) -> TrialResult:
        return _found(dict(p), self.sla, self.rate, lambda r: self.level_at(p, z, r), start)

    def level_at(self, p: Params, z: np.ndarray, rate: float) -> Seen:
        load = rate / z[2]
        ttft, tpot, running = self.latencies(p, load)
        seqs = int(p.get("max_num_seqs") or LONG_DEFAULTS["max_num_seqs"])
        kept = rate if math.isfinite(ttft) else rate * seqs / max(running, 1e-9)
        ttft = min(ttft, 10 * self.ttft_ms) * z[0]
        tpot = min(tpot, 10 * self.tpot_ms) * z[1]
        mean_ttft = ttft / 4
        metrics: dict[str, float | None] = {
            "p99_ttft_ms": ttft,
            "p99_tpot_ms": tpot,
            "request_rate": kept,
            "mean_ttft_ms": mean_ttft,
            "mean_e2e_ms": mean_ttft + (self.output_tokens - 1) * tpot / 1.4,
        }
        return Seen.judged(self.sla, metrics, rate, kept)


def _real() -> Replayable:
    return RealSurface.load()


def _equal_memory() -> Replayable:
    return RealSurface.load_study()


SURFACES: dict[str, Callable[[], Replayable]] = {
    "h200-8b-like": h200_8b_like,
    "latency-bound": latency_bound,
    "memory-bound": memory_bound,
    "defaults-best": defaults_best,
    "h200-8b-real": _real,
    "h200-8b-equal-memory": _equal_memory,
    "long-prompt-tpot": LongPromptSurface,
}


def grid_points(allow_lossy: bool) -> list[dict[str, Any]]:
    """Every config of the grid, in the fixed nested order of the ``grid`` method.

    Outer loops: options other than the batching pair, engine default first; inner loops:
    max_num_seqs, then the step budget ascending (chunked prefill off last: no budget to set).
    """
    outer = ["kv_cache_dtype", "gpu_memory_utilization", "block_size", "enable_prefix_caching"]
    kv_values = GRID["kv_cache_dtype"] if allow_lossy else ["auto"]
    pairs = [(True, t) for t in GRID["max_num_batched_tokens"]] + [(False, None)]
    points = []
    for kv, gmu, block, prefix in itertools.product(kv_values, *(GRID[k] for k in outer[1:])):
        for seqs in GRID["max_num_seqs"]:
            for chunked, tokens in pairs:
                p: dict[str, Any] = {
                    "max_num_seqs": seqs,
                    "enable_chunked_prefill": chunked,
                    "gpu_memory_utilization": gmu,
                    "block_size": block,
                    "enable_prefix_caching": prefix,
                }
                if tokens is not None:
                    p["max_num_batched_tokens"] = tokens
                if allow_lossy:
                    p["kv_cache_dtype"] = kv
                points.append(p)
    return points


def key_of(p: Params) -> str:
    return json.dumps(dict(sorted(p.items())), sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------- one search run


@dataclass
class Problem:
    """One surface prepared for searching: its grid, true values and the near-best bar."""

    surface: Replayable
    points: list[dict[str, Any]]
    truths: dict[str, Truth]
    best: float
    best_config: dict[str, Any]
    near: int  # grid points within the tolerance of the best
    target: float  # true goodput a launch needs to count as near-best
    defaults: dict[str, Any] = field(default_factory=dict)  # the engine's, for comparisons

    @classmethod
    def of(cls, surface: Replayable, tolerance: float) -> Problem:
        points = surface.points()
        truths = {key_of(p): surface.truth(p) for p in points}
        top = max(points, key=lambda p: truths[key_of(p)].goodput)
        best = truths[key_of(top)].goodput
        target = (1 - tolerance) * best
        near = sum((t := truths[key_of(p)]).feasible and t.goodput >= target for p in points)
        return cls(surface, points, truths, best, top, near, target, engine_defaults(surface))

    def truth(self, p: Params) -> Truth:
        key = key_of(p)
        if key not in self.truths:  # the baseline: engine defaults, no flags
            self.truths[key] = self.surface.truth(p)
        return self.truths[key]

    def near_best(self, p: Params) -> bool:
        t = self.truth(p)
        return t.feasible and t.goodput > 0 and t.goodput >= self.target


@dataclass(frozen=True)
class Run:
    """One search run: when it first launched a near-best config, and its wasted launches."""

    reached: int | None
    launches: int  # launches until the run ended (its own stop, the budget, or near-best)
    missed: int  # launches of configs that fail or miss the SLA at its own load
    missed_before: int  # ... among the launches up to the first near-best (or all)
    window: int  # launches up to the first near-best (or all)
    recognised: bool | None = None  # the search's own best at its end is near-best (new)
    stop: str = ""  # why the run ended (new)
    learned: int = 0  # candidates pruned because an earlier launch missed (new)
    gpu_min: float = 0.0  # GPU-minutes of every launch until the run ended
    gpu_min_near: float | None = None  # ... up to the first near-best launch (None: never)
    raced_out: int = 0  # candidates pruned at the incumbent's capacity (race)
    answer: str = ""  # what the search ended with (new, old): see ANSWERS
    near_duplicates: int = 0  # launches within the resolution of an earlier launch


def _within_resolution(space: SearchSpace, a: Params, b: Params) -> bool:
    """Two launched configs the measurement cannot tell apart: every knob of the space less
    than ``DUPLICATE_STEPS`` of :func:`autotuner.search.nearby.steps` apart (a log-range knob
    ~11 %; a list's choice, a flag, a quarter of a linear range are whole steps), the rest
    equal."""
    specs = {p.name: p for p in space.params}
    for k in set(a) | set(b):
        x, y = a.get(k), b.get(k)
        if x == y:
            continue
        if (
            k in specs
            and x is not None
            and y is not None
            and steps(specs[k], x, y) < DUPLICATE_STEPS
        ):
            continue
        return False
    return True


class Bench:
    """Counts launches of one search and measures each one with seeded noise."""

    def __init__(self, problem: Problem, seed: int, noise: float) -> None:
        self.problem = problem
        self.seed = seed
        self.noise = noise
        self.launches = 0
        self.reached_at: int | None = None
        self.seen: dict[str, int] = {}
        self.missed: list[bool] = []  # per launch: failed, or missed the SLA at its own load
        self.gpu_s: list[float] = []  # per launch: engine start + levels, GPU-seconds
        self.launched: list[dict[str, Any]] = []
        self.near_duplicates = 0
        self.space = problem.surface.space()

    def launch(self, p: Params) -> Truth:
        self.launches += 1
        mine = {**self.problem.defaults, **p}
        if any(
            _within_resolution(self.space, mine, {**self.problem.defaults, **q})
            for q in self.launched
        ):
            self.near_duplicates += 1
        self.launched.append(dict(p))
        if self.reached_at is None and self.problem.near_best(p):
            self.reached_at = self.launches
        t = self.problem.truth(p)
        self.missed.append(not t.feasible)
        return t

    def stats(self) -> Run:
        window = self.missed[: self.reached_at] if self.reached_at else self.missed
        near = sum(self.gpu_s[: self.reached_at]) / 60 if self.reached_at else None
        return Run(
            reached=self.reached_at,
            launches=self.launches,
            missed=sum(self.missed),
            missed_before=sum(window),
            window=len(window),
            gpu_min=sum(self.gpu_s) / 60,
            gpu_min_near=near,
            near_duplicates=self.near_duplicates,
        )

    def measure(self, p: Params, start: float | None = None) -> TrialResult:
        """What a real trial would report, with this run's seeded noise; ``start``: its
        first level's rate (raced). Its cost: an engine start (the first of a run cold) and
        one :data:`LEVEL_S` per level, on one GPU."""
        t = self.launch(p)
        key = key_of(p)
        n = self.seen[key] = self.seen.get(key, 0) + 1
        rng = np.random.default_rng([self.seed, zlib.crc32(key.encode()), n])
        z = np.exp(self.noise * rng.standard_normal(3))
        result = self.problem.surface.measure(p, t, z, start)
        boot = ENGINE_START_COLD_S if len(self.gpu_s) == 0 else ENGINE_START_S
        spent = {"engine_start": boot}
        if result.status != "failed":
            spent["levels"] = LEVEL_S * len(result.levels)
        self.gpu_s.append(sum(spent.values()))
        return dataclasses.replace(
            result,
            startup_s=None if result.status == "failed" else boot,
            duration_s=sum(spent.values()),
            devices=1,
            gpu_seconds=spent,
        )


def search_space(surface: Surface) -> SearchSpace:
    """The space ``autotuner tune`` would build, narrowed to the grid's values."""

    def space(overrides: Mapping[str, ParamOverride]) -> SearchSpace:
        return load_space(
            "vllm",
            VLLM_VERSION,
            device="gpu",
            gpu_count=1,
            compute_capability=(9, 0),
            allow_lossy=surface.allow_lossy,
            overrides=overrides,
        )

    full = space({})
    overrides = {
        name: ParamOverride(values=list(GRID[name]))
        if name in GRID
        else ParamOverride(exclude=True)
        for name in full.names
    }
    narrowed = space(overrides)
    assert sorted(narrowed.names) == sorted(
        k for k in GRID if k != "kv_cache_dtype" or surface.allow_lossy
    ), narrowed.names
    return narrowed


class _UntilNearBest(StudyRunner):
    """The real loop; it just stops once a near-best config was launched (the rest is moot)."""

    bench: Bench

    def time_left(self) -> bool:
        return self.bench.reached_at is None and super().time_left()


def grouped_tpe(budget: int, seed: int) -> optuna.samplers.BaseSampler:
    """``make_sampler("auto", ...)`` with ``group=True`` (diagnostic method ``ours-group``).

    The baseline trial has no params, so Optuna's intersection search space -- what
    ``multivariate=True`` models jointly -- is empty for the whole study and TPE samples each
    parameter on its own. Group decomposition ignores the empty set (and also models the
    conditional max_num_batched_tokens in its own group).
    """
    auto = make_sampler("auto", budget, 1, seed)
    assert isinstance(auto, optuna.samplers.TPESampler)
    return optuna.samplers.TPESampler(
        seed=seed,
        multivariate=True,
        group=True,
        constant_liar=True,
        n_startup_trials=auto._n_startup_trials,
    )


def run_ours(
    problem: Problem,
    sampler: str,
    seed: int,
    budget: int,
    noise: float,
    *,
    new: bool = False,
    race: bool = False,
    levers: bool = True,
) -> Run:
    """The real study loop on ``problem``. ``new``: with the search as ``autotuner tune`` runs
    it now (priors, warm start, hopeless values, stopping rule), to its own end; otherwise the
    plain loop, cut at the first near-best launch."""
    surface = problem.surface
    space = surface.space()
    bench = Bench(problem, seed, noise)
    with tempfile.TemporaryDirectory(prefix="search-eff-") as tmp:
        study_dir = Path(tmp)
        url = storage_url(study_dir, None)
        study = open_study(
            surface.sla,
            url,
            grouped_tpe(budget, seed)
            if sampler == "group"
            else make_sampler(
                sampler,
                budget,
                len(surface.sla.objectives),
                seed,
                startup_trials=WARM_STARTUP if new else None,
            ),
            {"engine": f"vllm {VLLM_VERSION}", "space": space.hash()[:16]},
        )
        defaults = {k: v for k, v in space.defaults.items() if v is not None}
        traits = registry.get("vllm").crash_traits
        memory = CrashMemory(defaults={**defaults, **space.fixed}, traits=traits)

        def run(
            params: Params, trial_dir: Path, /, *, start_load: float | None = None
        ) -> TrialResult:
            # As run_trial does: the launch's record in its folder, where the study (the
            # warm start's capacity_concurrency and bounding limit) reads it back.
            result = bench.measure(params, start_load)
            trial_dir.mkdir(parents=True, exist_ok=True)
            result.write(trial_dir / "trial.json")
            return result

        stops: list[str] = []  # what the loop said besides its trials: why it stopped
        plan, stopper = None, None
        if new:
            plan = SearchPlan(space, surface.sla, study_dir, warm_limit=max(1, budget // 2))
            plan.engine_defaults = lambda params: engine_defaults(surface)
            if levers:  # the lever table, near-duplicates, the GPU-minute budget (issue 37)
                plan.levers = load_levers(registry.get("vllm").levers_file)
                plan.where = "on this GPU"
            else:
                plan.duplicate_steps = None
            stopper = StudyStopper(StoppingRule(patience=PATIENCE, resolution=RESOLUTION))
        runner = (StudyRunner if new else _UntilNearBest)(
            surface.sla,
            study,
            study_dir,
            suggest=space.suggest,
            fixed=space.fixed,
            prune=memory.near_crash,
            run=run,
            budget=Budget(budget, None, DEFAULT_GPU_MINUTES if new and levers else None),
            on_crash=lambda p, cause: memory.record(p, cause),
            say=lambda line: None if line.startswith(("trial", " ")) else stops.append(line),
            plan=plan,
            stopper=stopper,
            race=race,
        )
        if isinstance(runner, _UntilNearBest):
            runner.bench = bench
        runner.loop()
        run_stats = bench.stats()
        if new:
            best = best_launch(study)
            own = TrialRecord.from_trial(best).params_or(best.params) if best else None
            recognised = own is not None and problem.near_best(own)
            stop = stops[-1] if stops else f"budget of {budget} launches spent"
            learned = sum(
                "which missed" in (TrialRecord.from_trial(t).reason or "")
                for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,))
            )
            raced = sum(raced_out(t) for t in study.get_trials(deepcopy=False))
            run_stats = dataclasses.replace(
                run_stats,
                recognised=recognised,
                stop=stop,
                learned=learned,
                raced_out=raced,
                answer=answer_of(study, stop),
            )
    return run_stats


ANSWERS = {
    "infeasible": "infeasible losslessly, with the closest miss",
    "defaults": "the engine defaults, within the resolution of the best",
    "config": "a config that met the SLA",
    "none": "nothing met the SLA, the budget spent (no answer)",
}


def answer_of(study: optuna.Study, stop: str) -> str:
    """What a search ended with (a key of :data:`ANSWERS`)."""
    if stop.startswith("stopped, infeasible"):
        return "infeasible"
    if best_launch(study) is None:
        return "none"
    line = defaults_line(study, RESOLUTION) or ""
    return "defaults" if "inside the" in line or "no config tried" in line else "config"


def engine_defaults(surface: Replayable) -> dict[str, Any]:
    """What ``autotuner tune`` knows of the engine's own values (the vLLM adapter's
    ``defaults`` on an H200): the batch sizes, gpu_memory_utilization and block size; not
    chunked prefill or prefix caching, which the space leaves to the engine unresolved."""
    if isinstance(surface, RealSurface):
        return dict(H200_DEFAULTS)
    if isinstance(surface, LongPromptSurface):
        return dict(LONG_DEFAULTS)
    known = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "block_size")
    return {k: DEFAULTS[k] for k in known}


def run_order(problem: Problem, order: list[dict[str, Any]], budget: int) -> Run:
    bench = Bench(problem, 0, 0.0)
    for p in order[:budget]:
        bench.measure(p)  # noise-free: its levels, for its GPU-minutes
        if bench.reached_at is not None:
            break
    return bench.stats()


METHODS = ("new", "race", "ours", "grid", "random")
SELF_STOPPING = ("new", "race", "old")  # searches that end themselves: their answer counts
EXTRA_METHODS = (
    "ours-random",
    "ours-group",
    "old",
)  # diagnostics, only when asked for with --methods
LABELS = {
    "new": "new search (priors, warm start, hopeless, stopping, levers, near-duplicates)",
    "old": "the new search before issue 37 (no lever table, no near-duplicate rule)",
    "race": "the new search racing candidates against the incumbent",
    "ours": "plain TPE (the search before)",
    "ours-random": "study loop, random sampler",
    "grid": "grid (auto_tune order)",
    "random": "random order",
    "ours-group": "TPE group=True",
}
PATIENCE = 4  # tune.patience's default
RESOLUTION = 0.03  # tune.capacity_resolution's default
WARM_STARTUP = 2  # TPE's random startup trials after a warm start (priors.sampler_startup)
RATE_STEP = 1.5  # tune.rate_step's default
MAX_LEVELS = 8  # tune.max_levels' default
# A launch's cost, modelled from the measured H200 launches (vLLM 0.26.0, Llama-3.1-8B shape;
# ../shared/device/README.md, docs/benchmarks/warmup.md): the engine starts in 130 s on a cold
# machine (the first launch of a run) and in 45-115 s with the compile caches warm (80 s
# here); a launch with 4 load levels took 150-200 s, so a level is about 25 s.
ENGINE_START_COLD_S = 130.0
ENGINE_START_S = 80.0
LEVEL_S = 25.0


def run_method(problem: Problem, method: str, seed: int, budget: int, noise: float) -> Run:
    if method == "new":
        return run_ours(problem, "auto", seed, budget, noise, new=True)
    if method == "old":
        return run_ours(problem, "auto", seed, budget, noise, new=True, levers=False)
    if method == "race":
        return run_ours(problem, "auto", seed, budget, noise, new=True, race=True)
    if method == "ours":
        return run_ours(problem, "auto", seed, budget, noise)
    if method == "ours-group":
        return run_ours(problem, "group", seed, budget, noise)
    if method == "ours-random":
        return run_ours(problem, "random", seed, budget, noise)
    if method == "grid":
        return run_order(problem, problem.surface.grid_order(), budget)
    if method == "random":
        order = list(problem.points)
        np.random.default_rng(seed).shuffle(order)  # type: ignore[arg-type]
        return run_order(problem, order, budget)
    raise ValueError(method)


# --------------------------------------------------------------------------- report


def nearest_rank(values: list[int | None], q: float) -> int | None:
    """The q-quantile by nearest rank; None (not reached) sorts last."""
    ranked = sorted(values, key=lambda v: math.inf if v is None else v)
    return ranked[max(0, math.ceil(q * len(ranked)) - 1)]


def random_odds(n: int, k: int, budget: int) -> tuple[float, float]:
    """Random order without replacement: expected launches to the first of k good among n,
    and the chance that one is among the first ``budget``."""
    miss = 1.0
    for j in range(min(budget, n)):
        miss *= max(n - k - j, 0) / (n - j)
    return (n + 1) / (k + 1), 1 - miss


def machine() -> dict[str, str]:
    return {
        "nproc": str(os.cpu_count()),
        "python": platform.python_version(),
        "optuna": optuna.__version__,
        "platform": platform.platform(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10, help="runs per method and surface")
    ap.add_argument("--budget", type=int, default=60, help="launches per run, baseline included")
    ap.add_argument("--tolerance", type=float, default=0.03, help="near-best: within this share")
    ap.add_argument("--noise", type=float, default=0.05, help="multiplicative measurement noise")
    ap.add_argument("--surfaces", nargs="+", choices=list(SURFACES), default=list(SURFACES))
    ap.add_argument("--methods", nargs="+", choices=METHODS + EXTRA_METHODS, default=list(METHODS))
    ap.add_argument("--json", type=Path, help="write every run's count here")
    args = ap.parse_args(argv)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    cmd = shlex.join([Path(sys.executable).name, *sys.argv])
    info = machine()
    print(f"$ {cmd}")
    print(", ".join(f"{k} {v}" for k, v in info.items()))
    print(
        f"budget {args.budget} launches, {args.seeds} seeds, near-best = true goodput within "
        f"{args.tolerance:.0%} of the grid's best, noise {args.noise:.0%}"
    )
    started = time.monotonic()
    report: dict[str, Any] = {
        "command": cmd,
        "machine": info,
        "settings": vars(args) | {"json": str(args.json) if args.json else None},
        "surfaces": {},
    }
    rows: list[list[str]] = []
    answer_rows: list[list[str]] = []
    checks: list[str] = []
    for name in args.surfaces:
        problem = Problem.of(SURFACES[name](), args.tolerance)
        s = problem.surface
        base = problem.truth({})
        n, k = len(problem.points), problem.near
        grid_launches = len(s.grid_order())
        expect, odds = random_odds(n, k, args.budget)
        grid_truths = [problem.truth(p) for p in problem.points]
        feasible = sum(t.feasible for t in grid_truths)
        oom = sum(t.launch_error is not None for t in grid_truths)
        print()
        print(textwrap.fill(f"{name}: {s.doc}", width=100, subsequent_indent="    "))
        print(
            f"  grid {n} configs: {feasible} feasible, {oom} out of memory, {k} near-best; "
            f"best {problem.best:.2f} req/s; engine defaults "
            + (f"{base.goodput / problem.best:.0%} of it" if base.feasible else "infeasible")
        )
        print(f"  best: {problem.best_config}")
        print(
            f"  the whole grid: {grid_launches} launches; random order, exact: {expect:.1f} "
            f"launches expected, {odds:.0%} within {args.budget}"
        )
        entry: dict[str, Any] = {
            "doc": s.doc,
            "grid": n,
            "grid_launches": grid_launches,
            "feasible": feasible,
            "out_of_memory": oom,
            "near_best": k,
            "best_goodput": problem.best,
            "best_config": problem.best_config,
            "defaults_ratio": base.goodput / problem.best if base.feasible else None,
            "defaults_miss": not base.feasible,
            "random_expected": expect,
            "random_within_budget": odds,
            "methods": {},
        }
        for method in args.methods:
            t0 = time.monotonic()
            runs = [
                run_method(problem, method, seed, args.budget, args.noise)
                for seed in range(args.seeds)
            ]
            counts = [r.reached for r in runs]
            med, p90 = nearest_rank(counts, 0.5), nearest_rank(counts, 0.9)
            reached = sum(c is not None for c in counts) / len(counts)
            before = sum(r.missed_before for r in runs) / max(1, sum(r.window for r in runs))
            whole = sum(r.missed for r in runs) / max(1, sum(r.launches for r in runs))
            # The defaults are every study's first launch: what the search itself chose.
            own = (sum(r.missed for r in runs) - len(runs) * (not base.feasible)) / max(
                1, sum(r.launches - 1 for r in runs)
            )
            ends = nearest_rank([r.launches for r in runs], 0.5)
            recognised = [r.recognised for r in runs if r.recognised is not None]
            gpu_near = [r.gpu_min_near for r in runs]
            gpu_all = [r.gpu_min for r in runs]
            gpu_med = _median_minutes(gpu_near)
            entry["methods"][method] = {
                "trials": counts,
                "median": med,
                "p90": p90,
                "gpu_minutes_to_near_best_median": gpu_med,
                "gpu_minutes_median": _median_minutes(gpu_all),
                "reached": reached,
                "missed_share_before_near_best": before,
                "runs": [dataclasses.asdict(r) for r in runs],
                "wall_s": round(time.monotonic() - t0, 1),
            }
            if method in SELF_STOPPING:
                entry["methods"][method] |= {
                    "raced_out": sum(r.raced_out for r in runs),
                    "launches_median": ends,
                    "missed_share": whole,
                    "missed_share_after_defaults": own,
                    "recognised": sum(recognised) / len(recognised) if recognised else None,
                    "pruned_after_a_miss": sum(r.learned for r in runs),
                    "answers": {a: sum(r.answer == a for r in runs) for a in ANSWERS},
                    "near_duplicate_launches": sum(r.near_duplicates for r in runs),
                }
                answers = Counter(r.answer for r in runs)
                top, n_top = answers.most_common(1)[0]
                answer_rows.append(
                    [
                        name,
                        method,
                        f"{top} ({n_top}/{len(runs)})",
                        str(ends),
                        _minutes(_median_minutes(gpu_all)),
                        str(sum(r.near_duplicates for r in runs)),
                    ]
                )
                third = grid_launches / 3
                ok_reach = p90 is not None and p90 <= third
                checks.append(
                    f"{name} ({method}): near-best by launch {_cell(med, args.budget)} (median) / "
                    f"{_cell(p90, args.budget)} (p90), a third of the grid is {third:.1f}: "
                    f"{'met' if ok_reach else 'NOT met'}; {whole:.0%} of its launches missed "
                    f"the SLA at the first level ({own:.0%} after the defaults): "
                    f"{'met' if whole <= 0.10 else 'NOT met'}"
                )
            shown = " ".join("-" if c is None else str(c) for c in counts)
            print(f"  {method:<12} {shown}   ({time.monotonic() - t0:.0f} s)")
            if method in SELF_STOPPING:
                print(f"  {'':<12} stopped at " + " ".join(str(r.launches) for r in runs))
                print(f"  {'':<12} GPU-minutes " + " ".join(f"{g:.0f}" for g in gpu_all))
                if method == "race":
                    print(f"  {'':<12} raced out " + " ".join(str(r.raced_out) for r in runs))
                print(f"  {'':<12} pruned after a miss " + " ".join(str(r.learned) for r in runs))
            rows.append(
                [
                    name,
                    method,
                    _cell(med, args.budget),
                    _cell(p90, args.budget),
                    f"{reached:.0%}",
                    f"{before:.0%}",
                    str(ends) if method in SELF_STOPPING else "-",
                    f"{whole:.0%} ({own:.0%})" if method in SELF_STOPPING else "-",
                    f"{entry['methods'][method]['recognised']:.0%}"
                    if method in SELF_STOPPING
                    else "-",
                    _minutes(gpu_med),
                    _minutes(_median_minutes(gpu_all)) if method in SELF_STOPPING else "-",
                ]
            )
        report["surfaces"][name] = entry

    print(
        f"\nlaunches to a near-best config (median and p90 by nearest rank over {args.seeds} "
        f"seeds; 'never': not within {args.budget} launches, or before the search stopped "
        "itself); 'missed': share of launches "
        "of configs that fail or miss the SLA at its own load, up to the first near-best one; "
        "for the new search also its launches until it stopped itself and the share missed over "
        "all of them (in brackets: not counting the defaults, every study's first launch), and "
        "how often its own best at the end was near-best; GPU-minutes (median): up to the first "
        "near-best launch, and for the new searches of all launches until they stopped (engine "
        f"start {ENGINE_START_COLD_S:.0f} s cold, then {ENGINE_START_S:.0f} s, {LEVEL_S:.0f} s "
        "per level)"
    )
    header = [
        "surface",
        "method",
        "median",
        "p90",
        "reached",
        "missed",
        "stopped at",
        "missed (all)",
        "own best near",
        "GPU-min to near",
        "GPU-min (all)",
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    if answer_rows:
        print(
            "\nlaunches and GPU-minutes to an actionable answer (median over the seeds; the "
            "searches that end themselves): "
            + "; ".join(f"{k}: {v}" for k, v in ANSWERS.items())
            + "; near-dup: launches within the resolution of an earlier launch (all seeds)"
        )
        _table(["surface", "method", "answer", "launches", "GPU-min", "near-dup"], answer_rows)
    report["answers"] = answer_rows
    if checks:
        print("\ndone-when targets (issue 16):")
        for line in checks:
            print(f"  {line}")
    report["checks"] = checks
    print(f"\n{time.monotonic() - started:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print(
            "  ".join(
                c.ljust(w) if i < 3 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )


def _cell(v: int | None, budget: int) -> str:
    return "never" if v is None else str(v)


def _median_minutes(values: Sequence[float | None]) -> float | None:
    """The median by nearest rank; None (never reached) sorts last."""
    ranked = sorted(values, key=lambda v: math.inf if v is None else v)
    v = ranked[max(0, math.ceil(0.5 * len(ranked)) - 1)]
    return None if v is None else round(v, 1)


def _minutes(v: float | None) -> str:
    return "never" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    sys.exit(main())
