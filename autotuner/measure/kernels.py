"""Where the device time goes: a profiler trace aggregated by kernel class and engine phase.

Engine-neutral: it reads PyTorch profiler traces (Chrome trace JSON, gzipped or not), which
vLLM writes with its own profiler and any torch-based engine could. On a GPU the timed events
are the device's kernels, copies and memsets; on a CPU engine (no device events in the trace)
the CPU operators, each counted by its self time (its span minus its children's on the same
thread), so that ``aten::linear`` and the ``aten::addmm`` inside it are not counted twice.

Each event gets a class from its name (:func:`classify`): attention, GEMM,
normalization/activation, sampling, collective communication, memory copies, other. A CPU
operator whose own name says nothing (``aten::empty``, ``aten::view``) takes the class of the
nearest enclosing operator that has one (the ``empty`` inside a ``linear`` is GEMM work).

Phases come from the engine's per-step annotations where the trace has them (vLLM marks each
step ``execute_context_N(T)_generation_M(T)``): a step with only new requests is prefill, one
with only running requests decode, one with both mixed; time outside any annotated step is
"outside steps". Without annotations every event is in phase "all" only.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

CLASSES = (
    "attention",
    "gemm",
    "norm_activation",
    "sampling",
    "communication",
    "memory_copy",
    "other",
)
CLASS_LABELS = {
    "attention": "attention",
    "gemm": "GEMM",
    "norm_activation": "normalization / activation",
    "sampling": "sampling",
    "communication": "collective communication",
    "memory_copy": "memory copies",
    "other": "other",
}
PHASES = ("prefill", "decode", "mixed", "outside steps")
ALL = "all"

# First match wins, so the order matters: a flash-attention GEMM is attention, an all-reduce
# fused with a norm is communication, a copy inside sampling code is still a copy.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "communication",
        re.compile(
            r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce|"
            r"one_?shot|two_?shot|multimem|c10d::|broadcast|send_recv|custom_ar",
            re.I,
        ),
    ),
    (
        "attention",
        re.compile(
            r"attn|attention|flash|fmha|sdpa|scaled_dot_product|paged|mla_|flashinfer|"
            r"batchprefill|batchdecode|reshape_and_cache|rotary|rope|kv_cache|merge_attn",
            re.I,
        ),
    ),
    (
        "memory_copy",
        re.compile(
            r"^memcpy|^memset|aten::copy_|aten::_to_copy|aten::to$|aten::contiguous|"
            r"aten::clone|aten::index_copy|aten::index_put|aten::cat$|aten::stack$|"
            r"aten::fill_|aten::zero_|aten::zeros$|aten::ones$|aten::pad|copy_kernel|"
            r"catarraybatchedcopy|fillfunctor|index_select|aten::index$|gather_kernel|"
            r"aten::gather|aten::scatter",
            re.I,
        ),
    ),
    (
        "sampling",
        re.compile(
            r"sampl|topk|top_k|top_p|argmax|multinomial|softmax|sort|cumsum|gumbel|"
            r"exponential_|penalt|logit",
            re.I,
        ),
    ),
    (
        "gemm",
        re.compile(
            r"gemm|gemv|cutlass|cublas|nvjet|xmma|wgmma|splitk|matmul|aten::mm$|"
            r"aten::addmm|aten::bmm|aten::baddbmm|aten::linear|aten::_weight_int|"
            r"scaled_mm|marlin|dnnl|onednn|mkldnn|brgemm|_mm_|^mm_|triton_mm|sgemm|hgemm|"
            r"ampere_|sm80_|sm90_|sm100_|dot_kernel",
            re.I,
        ),
    ),
    (
        "norm_activation",
        re.compile(
            r"norm|silu|gelu|relu|swiglu|act_and_mul|activation|sigmoid|tanh|aten::mish",
            re.I,
        ),
    ),
)

_STEP = re.compile(
    r"^execute_(?:\d+_)?context_(?P<ctx>\d+)\((?:sq)?(?P<ctx_tok>\d+).*?\)_generation_"
    r"(?P<gen>\d+)\((?:sq)?(?P<gen_tok>\d+)"
)

# Events that are device work, by the trace's category.
_DEVICE_CATS = {"kernel": None, "gpu_memcpy": "memory_copy", "gpu_memset": "memory_copy"}
_CPU_OPS = "cpu_op"


class TraceError(ValueError):
    """A trace file that is not a readable profiler trace."""


@functools.lru_cache(maxsize=65536)  # a trace repeats a few hundred names many times over
def classify(name: str) -> str:
    """The kernel class of an event name (``other`` when no rule matches)."""
    for cls, pattern in _RULES:
        if pattern.search(name):
            return cls
    return "other"


def step_phase(annotation: str) -> str | None:
    """``prefill`` / ``decode`` / ``mixed`` for an engine step annotation, else None."""
    m = _STEP.match(annotation)
    if m is None:
        return None
    ctx, gen = int(m["ctx"]), int(m["gen"])
    if ctx and gen:
        return "mixed"
    if ctx:
        return "prefill"
    return "decode" if gen else None


@dataclass(frozen=True)
class ClassTime:
    """Time of one kernel class in one phase, summed over the trace(s)."""

    kernel_class: str
    phase: str
    time_us: float
    calls: int
    top: tuple[tuple[str, float], ...] = ()  # the largest names in it: (name, µs)


@dataclass(frozen=True)
class KernelBreakdown:
    """One profiled window: time per (class, phase), plus ``phase == "all"`` totals.

    ``timed`` says what was timed: ``gpu kernels`` or ``cpu operators (self time)``;
    ``steps`` counts the engine steps seen per phase; ``traces`` the trace files (one per
    worker / rank) summed.
    """

    timed: Literal["gpu kernels", "cpu operators (self time)"]
    rows: tuple[ClassTime, ...]
    traces: int
    steps: Mapping[str, int] = field(default_factory=dict)
    window_s: float = 0.0

    def total_us(self, phase: str = ALL) -> float:
        return sum(r.time_us for r in self.rows if r.phase == phase)

    def time_us(self, kernel_class: str, phase: str = ALL) -> float:
        return sum(
            r.time_us for r in self.rows if r.phase == phase and r.kernel_class == kernel_class
        )

    def share(self, kernel_class: str, phase: str = ALL) -> float:
        total = self.total_us(phase)
        return self.time_us(kernel_class, phase) / total if total > 0 else 0.0

    def phases(self) -> list[str]:
        """The phases with time in them, in :data:`PHASES` order (without ``all``)."""
        have = {r.phase for r in self.rows if r.time_us > 0}
        return [p for p in PHASES if p in have]

    def summary(self, top: int = 3) -> str:
        """``GEMM 41 %, attention 22 %, other 15 % of 812 ms of cpu operators (self time)``."""
        ranked = sorted(CLASSES, key=lambda c: -self.time_us(c))[:top]
        shares = ", ".join(
            f"{CLASS_LABELS[c]} {self.share(c) * 100:.0f} %" for c in ranked if self.time_us(c) > 0
        )
        return f"{shares} of {self.total_us() / 1000:,.0f} ms of {self.timed}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "timed": self.timed,
            "traces": self.traces,
            "steps": dict(self.steps),
            "window_s": self.window_s,
            "rows": [
                {
                    "kernel_class": r.kernel_class,
                    "phase": r.phase,
                    "time_us": r.time_us,
                    "calls": r.calls,
                    "top": [list(t) for t in r.top],
                }
                for r in self.rows
            ],
        }


# --------------------------------------------------------------------------- reading


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a Chrome trace file (``.json`` or ``.json.gz``)."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, EOFError, ValueError) as exc:  # gzip and JSON errors are ValueErrors
        raise TraceError(f"{path}: not a readable profiler trace ({exc})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list")
    return [e for e in events if isinstance(e, dict)]


@dataclass(frozen=True)
class _Span:
    name: str
    ts: float
    dur: float
    track: tuple[Any, Any]  # (pid, tid)

    @property
    def end(self) -> float:
        return self.ts + self.dur


def _spans(events: Iterable[Mapping[str, Any]], cats: Iterable[str]) -> list[_Span]:
    wanted = set(cats)
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in wanted:
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, int | float) or not isinstance(dur, int | float) or dur < 0:
            continue
        out.append(
            _Span(str(e.get("name", "")), float(ts), float(dur), (e.get("pid"), e.get("tid")))
        )
    return out


class _Steps:
    """Annotated engine steps on one timeline: which phase a moment belongs to."""

    def __init__(self, spans: Sequence[_Span]) -> None:
        marked = sorted(
            ((s.ts, s.end, phase) for s in spans if (phase := step_phase(s.name)) is not None),
        )
        self.starts = [m[0] for m in marked]
        self.marked = marked

    def __bool__(self) -> bool:
        return bool(self.marked)

    def phase_at(self, t: float) -> str:
        i = bisect_right(self.starts, t) - 1
        if i >= 0 and t <= self.marked[i][1]:
            return self.marked[i][2]
        return "outside steps"

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, _, phase in self.marked:
            out[phase] = out.get(phase, 0) + 1
        return out


class _Tally:
    def __init__(self) -> None:
        self.time: dict[tuple[str, str], float] = {}
        self.calls: dict[tuple[str, str], int] = {}
        self.names: dict[tuple[str, str], dict[str, float]] = {}

    def add(self, cls: str, phase: str, name: str, us: float) -> None:
        for key in ((cls, ALL), (cls, phase)) if phase != ALL else ((cls, ALL),):
            self.time[key] = self.time.get(key, 0.0) + us
            self.calls[key] = self.calls.get(key, 0) + 1
            by_name = self.names.setdefault(key, {})
            by_name[name] = by_name.get(name, 0.0) + us

    def rows(self, top: int) -> tuple[ClassTime, ...]:
        order = {c: i for i, c in enumerate(CLASSES)}
        phase_order = {p: i for i, p in enumerate((ALL, *PHASES))}
        keys = sorted(self.time, key=lambda k: (phase_order.get(k[1], 99), order.get(k[0], 99)))
        return tuple(
            ClassTime(
                kernel_class=cls,
                phase=phase,
                time_us=self.time[(cls, phase)],
                calls=self.calls[(cls, phase)],
                top=tuple(
                    sorted(self.names[(cls, phase)].items(), key=lambda kv: (-kv[1], kv[0]))[:top]
                ),
            )
            for cls, phase in keys
        )


def _device_events(events: Sequence[Mapping[str, Any]], tally: _Tally) -> bool:
    """Tally the GPU's kernels, copies and memsets; False when the trace has none."""
    device = _spans(events, _DEVICE_CATS)
    if not device:
        return False
    # On the GPU's timeline the profiler mirrors each annotation as gpu_user_annotation;
    # without those, a kernel's phase is that of the CPU launch it correlates with.
    steps = _Steps(_spans(events, ["gpu_user_annotation"]))
    launches: dict[Any, float] = {}
    cpu_steps = _Steps([])
    if not steps:
        cpu_steps = _Steps(_spans(events, ["user_annotation"]))
        for e in events:
            args = e.get("args")
            if e.get("cat") == "cuda_runtime" and isinstance(args, dict) and "correlation" in args:
                ts = e.get("ts")
                if isinstance(ts, int | float):
                    launches[args["correlation"]] = float(ts)
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X" or cat not in _DEVICE_CATS:
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, int | float) or not isinstance(dur, int | float) or dur < 0:
            continue
        name = str(e.get("name", ""))
        cls = _DEVICE_CATS[cat] or classify(name)
        phase = ALL
        if steps:
            phase = steps.phase_at(float(ts))
        elif cpu_steps:
            args = e.get("args")
            launched = launches.get(args.get("correlation")) if isinstance(args, dict) else None
            phase = "outside steps" if launched is None else cpu_steps.phase_at(launched)
        tally.add(cls, phase, name, float(dur))
    return True


def _cpu_ops(events: Sequence[Mapping[str, Any]], tally: _Tally) -> bool:
    """Tally CPU operators by self time; False when the trace has none."""
    ops = _spans(events, [_CPU_OPS])
    if not ops:
        return False
    steps = _Steps(_spans(events, ["user_annotation"]))
    by_track: dict[tuple[Any, Any], list[_Span]] = {}
    for s in ops:
        by_track.setdefault(s.track, []).append(s)
    for spans in by_track.values():
        for span, cls, self_us in _self_times(spans):
            tally.add(cls, steps.phase_at(span.ts) if steps else ALL, span.name, self_us)
    return True


def _self_times(spans: list[_Span]) -> list[tuple[_Span, str, float]]:
    """Each operator of one thread with its class and self time (its span minus its
    children's); an operator whose name says nothing takes its nearest parent's class."""
    # Parents before children: earlier start, then the longer span first.
    spans = sorted(spans, key=lambda s: (s.ts, -s.dur))
    stack: list[tuple[_Span, str, list[float]]] = []  # span, class, [children's time]
    done: list[tuple[_Span, str, float]] = []
    for s in [*spans, None]:
        while stack and (s is None or stack[-1][0].end <= s.ts):
            span, cls, child = stack.pop()
            done.append((span, cls, max(0.0, span.dur - child[0])))
        if s is None:
            break
        own = classify(s.name)
        if own == "other" and stack:
            own = stack[-1][1]
        if stack:
            stack[-1][2][0] += s.dur
        stack.append((s, own, [0.0]))
    return done


def aggregate(
    traces: Sequence[Sequence[Mapping[str, Any]]], *, window_s: float = 0.0, top: int = 3
) -> KernelBreakdown:
    """The breakdown of one profiled window from its trace(s) (one per worker).

    GPU kernels when any trace has device events, CPU operators otherwise; raises
    :class:`TraceError` when there is neither.
    """
    has_device = any(
        e.get("ph") == "X" and e.get("cat") in _DEVICE_CATS for events in traces for e in events
    )
    tally = _Tally()
    steps: dict[str, int] = {}
    annotations = "gpu_user_annotation" if has_device else "user_annotation"
    for events in traces:
        if has_device:
            _device_events(events, tally)
        else:
            _cpu_ops(events, tally)
        for phase, n in _Steps(_spans(events, [annotations])).counts().items():
            steps[phase] = steps.get(phase, 0) + n
    if not tally.time:
        raise TraceError("the trace has neither device kernels nor CPU operators")
    timed: Literal["gpu kernels", "cpu operators (self time)"] = (
        "gpu kernels" if has_device else "cpu operators (self time)"
    )
    return KernelBreakdown(timed, tally.rows(top), len(traces), steps, window_s)


def breakdown_csv(named: Sequence[tuple[str, KernelBreakdown]]) -> str:
    """``kernel_breakdown.csv``: one row per config, phase and class, with time and share."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        ["config", "timed", "phase", "kernel_class", "time_ms", "share", "calls", "top_names"]
    )
    for label, b in named:
        for r in b.rows:
            total = b.total_us(r.phase)
            share = r.time_us / total if total > 0 else 0.0
            top = "; ".join(f"{n} ({us / 1000:.3f} ms)" for n, us in r.top)
            w.writerow(
                [
                    label,
                    b.timed,
                    r.phase,
                    r.kernel_class,
                    f"{r.time_us / 1000:.3f}",
                    f"{share:.4f}",
                    r.calls,
                    top,
                ]
            )
    return buf.getvalue()
