"""The human-facing files of a promoted bundle: the Pareto plot and table, the latency
breakdown, the fallback runbook and the triggers it lists.

Contract: every function is pure — the frozen dataclasses below (or plain dicts) in, the
file's whole content out as a string; the caller (promote) gathers the data and writes the
files atomically. Nothing reads the study, the clock or the machine, so the same inputs give
byte-identical files and bundles diff cleanly.

Metric names are those of :mod:`autotuner.measure.evaluate`; units and the better direction are read
off the name (``_ms`` ms, ``goodput``/``request_rate`` req/s, ``*tokens_per_s`` tok/s, ``_gib``
GiB). SVGs are hand-written SVG 1.1 with inline attributes only (no script, no external
fonts), so they render the same in browsers and in rsvg; every marker and bar carries a
``class`` and a ``<title>`` (hover text, and something for tests to count). Missing values
(``None``, NaN) are skipped, never plotted as zero.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Literal

from autotuner.bundle.svg import AXIS as _AXIS
from autotuner.bundle.svg import GRID as _GRID
from autotuner.bundle.svg import INK as _INK
from autotuner.bundle.svg import Scale as _Scale
from autotuner.bundle.svg import attrs as _attrs
from autotuner.bundle.svg import clip as _clip
from autotuner.bundle.svg import document as _svg
from autotuner.bundle.svg import line as _line
from autotuner.bundle.svg import n as _n
from autotuner.bundle.svg import scale as _scale
from autotuner.bundle.svg import text as _text
from autotuner.engines.base import OptionRoles
from autotuner.engines.deploy import argv_lines, format_command

if TYPE_CHECKING:
    from autotuner.measure.kernels import KernelBreakdown

Better = Literal["max", "min"]


@dataclass(frozen=True)
class Point:
    """One trial on the objective plane."""

    trial: int
    values: dict[str, float | None]  # objective metric name -> value
    feasible: bool
    on_front: bool
    promoted: bool
    baseline: bool
    params: dict[str, object] = field(default_factory=dict)
    # Where the values come from: "single run" (the search) or "confirmed, N replicates".
    basis: str = "single run"

    @property
    def role(self) -> str:
        """``promoted``, ``baseline``, ``front``, ``dominated`` or ``infeasible`` (first match)."""
        if self.promoted:
            return "promoted"
        if self.baseline:
            return "baseline"
        if not self.feasible:
            return "infeasible"
        return "front" if self.on_front else "dominated"


@dataclass(frozen=True)
class LatencyProfile:
    """One config's latency summary, for the latency breakdown."""

    label: str  # "promoted (trial 7)"
    percentiles: dict[str, dict[str, float | None]]  # {"ttft": {"p50": ms, ...}, "tpot": ...}
    phases_ms: dict[str, float] = field(default_factory=dict)  # mean "queue"/"prefill"/"decode"
    # The engine's prefix cache: "prompt_cached_share", "prefix_cache_hit_rate" (0 to 1).
    cache: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Fallback:
    """One ranked alternative to the promoted config, and when to switch to it."""

    rank: int
    label: str  # "trial 4 (next Pareto point)", "baseline (engine defaults)"
    params: dict[str, object]
    argv: list[str]
    metrics: dict[str, float | None]
    cost: dict[str, float | None]  # relative to the promoted config: -0.12 is 12 % lower
    triggers: list[str]
    # Per metric, where this config's figure comes from ("single run", "confirmed, 3
    # replicates"); shown beside it when given.
    basis: dict[str, str] = field(default_factory=dict)
    # Per metric, a change column text that replaces the plain ratio (a confirmed effect
    # with its interval and verdict).
    change_text: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Metric names: labels, units, directions, formatting

_LATENCY = re.compile(r"^(?P<kind>p\d+(?:\.\d+)?|mean)_(?P<m>ttft|tpot|itl|e2e)_ms$")
_NAMES = {
    "capacity": "capacity",
    "capacity_per_gpu": "capacity per GPU",
    "goodput": "goodput",
    "request_rate": "request rate",
    "output_tokens_per_s": "output tokens",
    "total_tokens_per_s": "total tokens",
    "peak_memory_gib": "peak memory",
    "error_rate": "error rate",
    "trial": "trial",
}


def metric_unit(name: str) -> str:
    """The unit of metric ``name`` read off its name ("" when it has none)."""
    if name.endswith("_ms"):
        return "ms"
    if name.endswith("_gib"):
        return "GiB"
    if name.endswith("tokens_per_s"):
        return "tok/s"
    if name == "capacity_per_gpu":
        return "req/s/GPU"
    if name in ("capacity", "goodput", "request_rate") or name.endswith("_req_per_s"):
        return "req/s"
    return ""


def metric_name(name: str) -> str:
    """``p99_ttft_ms`` -> ``p99 TTFT``; ``peak_memory_gib`` -> ``peak memory``."""
    match = _LATENCY.match(name)
    if match:
        return f"{match['kind']} {match['m'].upper()}"
    if name in _NAMES:
        return _NAMES[name]
    return re.sub(r"_(ms|gib|per_s)$", "", name).replace("_", " ")


def metric_label(name: str) -> str:
    """An axis label: ``p99 TTFT (ms)``, ``goodput (req/s)``."""
    unit = metric_unit(name)
    return f"{metric_name(name)} ({unit})" if unit else metric_name(name)


def metric_better(name: str) -> Better | None:
    """Whether more (``max``) or less (``min``) of ``name`` is better; ``None`` if unknown."""
    if name.endswith(("_ms", "_gib")) or name == "error_rate":
        return "min"
    if metric_unit(name) in ("req/s", "tok/s"):
        return "max"
    return None


def format_value(name: str, value: float | None) -> str:
    """``value`` of metric ``name`` with its unit, for tables and labels."""
    if value is None or not math.isfinite(value):
        return "n/a"
    unit = metric_unit(name)
    if name == "error_rate":
        return f"{value:.2%}"
    if unit == "ms":
        return f"{value:,.1f} ms" if abs(value) >= 1 else f"{value:.3f} ms"
    if unit == "tok/s":
        return f"{value:,.0f} tok/s"
    if unit in ("req/s", "GiB"):
        return f"{value:,.2f} {unit}"
    return f"{value:.4g}"


def format_change(name: str, change: float | None) -> str:
    """A relative change (``-0.12``) as ``-12.0 % (worse)`` given the metric's direction."""
    if change is None or not math.isfinite(change):
        return "n/a"
    text = f"{change * 100:+.1f} %"
    better = metric_better(name)
    if better is None or abs(change) < 0.0005:
        return text
    good = (change > 0) == (better == "max")
    return f"{text} ({'better' if good else 'worse'})"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


# ---------------------------------------------------------------------------------------------
# CSV


def pareto_csv(points: Sequence[Point], metrics: Sequence[str], *, figures: bool = False) -> str:
    """One row per trial: trial, role, feasible, each metric (empty when missing), params JSON;
    with ``figures``, a ``figures`` column after ``feasible`` says where the values come from
    (each point's ``basis``).

    Floats are written with ``repr`` so they read back exactly.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    extra = ["figures"] if figures else []
    writer.writerow(["trial", "role", "feasible", *extra, *metrics, "params"])
    for p in sorted(points, key=lambda p: p.trial):
        values = [_csv_number(p.values.get(m)) for m in metrics]
        params = json.dumps(p.params, sort_keys=True, separators=(",", ":"), default=str)
        basis = [p.basis] if figures else []
        writer.writerow([p.trial, p.role, str(p.feasible).lower(), *basis, *values, params])
    return buf.getvalue()


def _csv_number(value: float | None) -> str:
    return "" if value is None else repr(float(value))


# ---------------------------------------------------------------------------------------------
# SVG building blocks

_PROMOTED = "#d62728"
_FEASIBLE = "#4c78a8"
_FRONT = "#1f4e89"
_FRONT_LINE = "#f58518"
_INFEASIBLE = "#9a9a9a"
_PROFILE_COLORS = ("#d62728", "#7f7f7f", "#4c78a8", "#54a24b", "#b279a2", "#9d755d")
_PHASE_COLORS = {"queue": "#bab0ac", "prefill": "#f58518", "decode": "#54a24b"}
_OTHER_PHASE_COLORS = ("#72b7b2", "#b279a2", "#9d755d")


# ---------------------------------------------------------------------------------------------
# Pareto plot


def _value(p: Point, name: str) -> float | None:
    if name == "trial":
        return float(p.trial)
    return _finite(p.values.get(name))


def _better(a: float, b: float, better: Better) -> bool:
    return a > b if better == "max" else a < b


def pareto_svg(
    points: Sequence[Point],
    x: str,
    y: str | None = None,
    *,
    x_better: Better = "max",
    y_better: Better = "min",
    title: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """A scatter of the trials on objectives ``x`` and ``y`` (an SVG document).

    Feasible trials are dots, infeasible ones crosses; the front is joined by its staircase
    (the boundary of the region it dominates), the promoted trial is ringed and labeled, the
    baseline boxed and labeled. With one objective (``y`` None) the plot is ``x`` against the
    trial number, ``x_better`` its direction, with the best feasible value so far as the line.
    Trials without a value on an axis are left out (the subtitle counts them). ``notes`` are
    printed under the plot (why the promoted point is off the front, or does not meet the SLA).
    """
    single = y is None
    x_name, y_name = ("trial", x) if y is None else (x, y)
    xb: Better = "max" if single else x_better
    yb: Better = x_better if single else y_better

    shown: list[tuple[Point, float, float]] = []
    for p in points:
        vx, vy = _value(p, x_name), _value(p, y_name)
        if vx is not None and vy is not None:
            shown.append((p, vx, vy))
    missing = len(points) - len(shown)

    lines = [ln for n in notes for ln in textwrap.wrap(n, 118, subsequent_indent="  ")]
    width, height = 810.0, 500.0 + 18.0 * len(lines) + (8.0 if lines else 0.0)
    left, right, top, bottom = 80.0, 570.0, 62.0, 430.0
    sx = _scale([v for _, v, _ in shown], left, right, integer=single)
    sy = _scale([v for _, _, v in shown], bottom, top)

    if single:
        heading = title or f"{metric_name(y_name)} by trial"
    else:
        heading = title or f"{metric_name(y_name)} vs {metric_name(x_name)}"
    feasible = sum(p.feasible for p, _, _ in shown)
    sub = f"{len(shown)} trial{'' if len(shown) == 1 else 's'} shown, {feasible} feasible"
    if not single:
        sub += f", {sum(p.on_front and p.feasible for p, _, _ in shown)} on the front"
    if missing:
        sub += f"; {missing} without a value not shown"
    confirmed = [p for p, _, _ in shown if p.basis != "single run"]
    if confirmed:
        names = ", ".join(f"trial {p.trial}" for p in sorted(confirmed, key=lambda p: p.trial))
        sub += f"; confirmed in replicates: {names}, others single runs"
    elif shown:
        sub += "; single runs"

    body = [_text(left, 26, heading, size=16, weight="bold"), _text(left, 45, sub, fill=_AXIS)]
    body += _axes(sx, sy, left, right, top, bottom)
    x_label = metric_label(x_name) if single else _directed(x_name, xb)
    body.append(_text((left + right) / 2, bottom + 42, x_label, anchor="middle"))
    body.append(_text(24, (top + bottom) / 2, _directed(y_name, yb), anchor="middle", rotate=True))
    if not shown:
        body.append(
            _text((left + right) / 2, (top + bottom) / 2, "no measured points", anchor="middle")
        )

    line = _best_so_far(shown, yb) if single else _staircase(shown, xb, yb)
    if len(line) >= 2:
        pts = " ".join(f"{_n(sx(a))},{_n(sy(b))}" for a, b in line)
        body.append(
            f'<polyline class="front-line" points="{pts}" fill="none" stroke="{_FRONT_LINE}" '
            'stroke-width="2" stroke-linejoin="round"/>'
        )

    order = {"infeasible": 0, "dominated": 1, "front": 2, "baseline": 3, "promoted": 4}
    for p, vx, vy in sorted(shown, key=lambda s: (order[s[0].role], s[0].trial)):
        body.append(_marker(p, sx(vx), sy(vy), x_name, y_name, vx, vy))
    body += _point_labels(shown, sx, sy, left, right, top, bottom)
    body += _pareto_legend(shown, single, right + 24, top)
    body += [_text(24, 500 + 18 * i, line, cls="note", fill=_AXIS) for i, line in enumerate(lines)]
    return _svg(width, height, body, heading)


def _directed(name: str, better: Better) -> str:
    return f"{metric_label(name)}, {'higher' if better == 'max' else 'lower'} is better"


def _axes(
    sx: _Scale, sy: _Scale, left: float, right: float, top: float, bottom: float
) -> list[str]:
    out = [f'<g class="grid" stroke="{_GRID}" stroke-width="1">']
    for t in sx.ticks:
        out.append(f"<line {_attrs(x1=sx(t), y1=top, x2=sx(t), y2=bottom)}/>")
    for t in sy.ticks:
        out.append(f"<line {_attrs(x1=left, y1=sy(t), x2=right, y2=sy(t))}/>")
    out.append("</g>")
    out.append(
        f"<rect {_attrs(x=left, y=top, width=right - left, height=bottom - top)} "
        f'fill="none" stroke="{_AXIS}"/>'
    )
    for t in sx.ticks:
        out.append(_line(sx(t), bottom, sx(t), bottom + 5, _AXIS))
        out.append(_text(sx(t), bottom + 18, sx.label(t), anchor="middle", size=11, cls="tick"))
    for t in sy.ticks:
        out.append(_line(left - 5, sy(t), left, sy(t), _AXIS))
        out.append(_text(left - 8, sy(t) + 4, sy.label(t), anchor="end", size=11, cls="tick"))
    return out


def _staircase(
    shown: Sequence[tuple[Point, float, float]], xb: Better, yb: Better
) -> list[tuple[float, float]]:
    """The front's attainment line: between two neighbours, the corner takes the worse of each."""
    front = sorted((vx, vy) for p, vx, vy in shown if p.on_front and p.feasible)
    out: list[tuple[float, float]] = []
    for i, (vx, vy) in enumerate(front):
        if i:
            px, py = front[i - 1]
            corner_x = min(px, vx) if xb == "max" else max(px, vx)
            corner_y = max(py, vy) if yb == "min" else min(py, vy)
            out.append((corner_x, corner_y))
        out.append((vx, vy))
    return out


def _best_so_far(
    shown: Sequence[tuple[Point, float, float]], better: Better
) -> list[tuple[float, float]]:
    """A step line of the best feasible value over the trials, to the last trial."""
    out: list[tuple[float, float]] = []
    best: float | None = None
    ordered = sorted(shown, key=lambda s: s[1])
    for p, trial, value in ordered:
        if p.feasible and (best is None or _better(value, best, better)):
            if best is not None:
                out.append((trial, best))
            best = value
            out.append((trial, value))
    if out and ordered and ordered[-1][1] > out[-1][0]:
        out.append((ordered[-1][1], out[-1][1]))
    return out


def _marker(p: Point, px: float, py: float, x: str, y: str, vx: float, vy: float) -> str:
    tip = f"trial {p.trial} ({p.role}): {metric_name(y)} {format_value(y, vy)}"
    if x != "trial":
        tip += f", {metric_name(x)} {format_value(x, vx)}"
    tip += f" ({p.basis})"
    if p.params:
        tip += "\n" + ", ".join(f"{k}={v}" for k, v in p.params.items())
    parts = [f'<g class="point {p.role}" data-trial="{p.trial}">', f"<title>{escape(tip)}</title>"]
    if p.baseline:
        parts.append(_box(px, py))
    if not p.feasible:
        parts.append(_cross(px, py, _PROMOTED if p.promoted else _INFEASIBLE))
    elif p.promoted:
        parts.append(_ring(px, py))
    elif p.on_front:
        parts.append(_front_dot(px, py))
    else:
        parts.append(_dot(px, py))
    parts.append("</g>")
    return "".join(parts)


def _point_labels(
    shown: Sequence[tuple[Point, float, float]],
    sx: _Scale,
    sy: _Scale,
    left: float,
    right: float,
    top: float,
    bottom: float,
) -> list[str]:
    out: list[str] = []
    placed: list[float] = []
    for p, vx, vy in sorted(shown, key=lambda s: not s[0].promoted):
        if not (p.promoted or p.baseline):
            continue
        px, py = sx(vx), sy(vy)
        if p.promoted and p.baseline:
            text = f"promoted = baseline (trial {p.trial})"
        else:
            text = f"{'promoted' if p.promoted else 'baseline'} (trial {p.trial})"
        on_left = px > (left + right) / 2
        lx = px - 14 if on_left else px + 14
        ly = py - 12 if p.promoted else py + 22
        ly = min(max(ly, top + 14), bottom - 6)
        for other in placed:  # keep the two labels from overprinting each other
            if abs(ly - other) < 15:
                ly = other + 16 if ly >= other else other - 16
        placed.append(ly)
        out.append(
            _text(
                lx,
                ly,
                text,
                anchor="end" if on_left else "start",
                weight="bold" if p.promoted else None,
                fill=_PROMOTED if p.promoted else _INK,
                cls="label",
                halo=True,
            )
        )
    return out


def _dot(cx: float, cy: float) -> str:
    return f'<circle {_attrs(cx=cx, cy=cy, r=4.5)} fill="{_FEASIBLE}" fill-opacity="0.55"/>'


def _front_dot(cx: float, cy: float) -> str:
    return f'<circle {_attrs(cx=cx, cy=cy, r=5.5)} fill="{_FRONT}" stroke="#ffffff"/>'


def _cross(cx: float, cy: float, color: str = _INFEASIBLE) -> str:
    r = 4.5
    return _line(cx - r, cy - r, cx + r, cy + r, color, 2) + _line(
        cx - r, cy + r, cx + r, cy - r, color, 2
    )


def _ring(cx: float, cy: float) -> str:
    return (
        f'<circle {_attrs(cx=cx, cy=cy, r=11)} fill="none" stroke="{_PROMOTED}" '
        'stroke-width="2"/>'
        f'<circle {_attrs(cx=cx, cy=cy, r=6)} fill="{_PROMOTED}"/>'
    )


def _box(cx: float, cy: float) -> str:
    return (
        f'<rect {_attrs(x=cx - 9, y=cy - 9, width=18, height=18)} fill="none" '
        f'stroke="{_INK}" stroke-width="1.5"/>'
    )


def _stroke(cx: float, cy: float) -> str:
    return _line(cx - 11, cy, cx + 11, cy, _FRONT_LINE, 2)


def _pareto_legend(
    shown: Sequence[tuple[Point, float, float]], single: bool, x: float, y: float
) -> list[str]:
    feasible = sum(p.feasible for p, _, _ in shown)
    entries: list[tuple[str, Callable[[float, float], str]]] = [
        (f"feasible ({feasible})", _dot),
        (f"infeasible ({len(shown) - feasible})", _cross),
    ]
    if single:
        entries.append(("best feasible so far", _stroke))
    else:
        entries.append(("Pareto front", lambda cx, cy: _stroke(cx, cy) + _front_dot(cx, cy)))
    if any(p.promoted for p, _, _ in shown):
        entries.append(("promoted", _ring))
    if any(p.baseline for p, _, _ in shown):
        entries.append(("baseline (engine defaults)", _box))
    out = ['<g class="legend">']
    for i, (label, draw) in enumerate(entries):
        cy = y + 12 + i * 26
        out.append(draw(x + 11, cy))
        out.append(_text(x + 30, cy + 4, label))
    out.append("</g>")
    return out


# ---------------------------------------------------------------------------------------------
# Latency breakdown

_LATENCY_ORDER = ("ttft", "tpot", "itl", "e2e")
_LATENCY_NAMES = {
    "ttft": "TTFT: time to first token",
    "tpot": "TPOT: time per output token",
    "itl": "ITL: inter-token latency",
    "e2e": "E2E: end-to-end request latency",
}
_PHASE_ORDER = ("queue", "prefill", "decode")


def _percentile_key(name: str) -> tuple[float, str]:
    match = re.fullmatch(r"p(\d+(?:\.\d+)?)", name)
    return (float(match[1]) if match else -1.0, name)


def sla_limits(constraints: Sequence[tuple[str, float]]) -> dict[str, dict[str, float]]:
    """The latency limits among an SLA's (metric, limit) pairs, as the latency breakdown draws
    them: ``[("p90_ttft_ms", 100.0)]`` -> ``{"ttft": {"p90": 100.0}}``; other metrics left out."""
    out: dict[str, dict[str, float]] = {}
    for metric, limit in constraints:
        m = _LATENCY.match(metric)
        if m is not None and math.isfinite(limit):
            out.setdefault(m["m"], {})[m["kind"]] = float(limit)
    return out


def latency_breakdown_svg(
    profiles: Sequence[LatencyProfile],
    *,
    title: str | None = None,
    kernels: Sequence[tuple[str, KernelBreakdown]] = (),
    limits: Mapping[str, Mapping[str, float]] | None = None,
) -> str:
    """Grouped horizontal bars of each latency's percentiles, a colour per profile.

    One panel per latency metric (TTFT, TPOT, E2E, ...; each with its own ms axis, since
    they differ by orders of magnitude), a group per percentile, a bar per profile. Profiles
    with engine phase times get a panel of stacked bars: mean queue / prefill / decode
    time per request. ``kernels`` (label, profiled window) add a last panel: the share of
    time per kernel class (:mod:`autotuner.bundle.kernel_chart`). ``limits`` (metric ->
    percentile -> ms, :func:`sla_limits`): the SLA's limits, a dashed line each across their
    metric's panel, labelled ``SLA p90 <= 100 ms``.
    """
    width = 780.0
    x0, x1 = 190.0, 650.0
    bar_h, bar_gap, group_gap = 14.0, 3.0, 10.0
    heading = title or "Latency breakdown"
    body = [_text(24, 28, heading, size=16, weight="bold")]

    colors = {i: _PROFILE_COLORS[i % len(_PROFILE_COLORS)] for i in range(len(profiles))}
    lx = 24.0
    for i, prof in enumerate(profiles):  # the profile legend, one row
        body.append(f'<rect {_attrs(x=lx, y=40, width=12, height=12)} fill="{colors[i]}"/>')
        body.append(_text(lx + 17, 50, prof.label, cls="legend"))
        lx += 17 + 7.2 * len(prof.label) + 22

    metrics = [m for m in _LATENCY_ORDER if any(m in p.percentiles for p in profiles)]
    metrics += sorted({m for p in profiles for m in p.percentiles} - set(metrics))
    y = 72.0
    if not profiles or not metrics:
        body.append(_text(24, y + 20, "no latency data", cls="empty"))
        y += 40
    for metric in metrics:
        qs = sorted(
            {q for p in profiles for q in p.percentiles.get(metric, {})}, key=_percentile_key
        )
        values = [
            v
            for p in profiles
            for q in qs
            if (v := _finite(p.percentiles.get(metric, {}).get(q))) is not None
        ]
        limited = {
            q: v for q, v in (limits or {}).get(metric, {}).items() if _finite(v) is not None
        }
        values += list(limited.values())  # the axis reaches the limit
        body.append(_text(24, y + 14, _LATENCY_NAMES.get(metric, metric.upper()), weight="bold"))
        y += 24 + (14 if limited else 0)  # a row for the limits' labels
        group_h = len(profiles) * (bar_h + bar_gap) - bar_gap
        panel_top = y
        panel_h = len(qs) * (group_h + group_gap) - group_gap
        scale = _scale(values, x0, x1, zero=True, n=6)
        body += _bar_grid(scale, panel_top, panel_top + panel_h)
        for q in qs:
            body.append(_text(x0 - 10, y + group_h / 2 + 4, q, anchor="end", cls="group"))
            for i, prof in enumerate(profiles):
                v = _finite(prof.percentiles.get(metric, {}).get(q))
                by = y + i * (bar_h + bar_gap)
                tip = f"{prof.label}: {q} {metric.upper()} {_ms(v)}"
                if v is None:
                    body.append(_text(x0 + 4, by + bar_h - 3, "n/a", size=10, fill=_AXIS))
                    continue
                w = max(scale(v) - x0, 0.5)
                body.append(
                    f'<rect class="bar" data-metric="{escape(metric)}" '
                    f'data-percentile="{escape(q)}" data-profile="{i}" '
                    f"{_attrs(x=x0, y=by, width=w, height=bar_h)} "
                    f'fill="{colors[i]}"><title>{escape(tip)}</title></rect>'
                )
                body.append(_text(x0 + w + 5, by + bar_h - 3, _ms(v), size=10))
            y += group_h + group_gap
        y = panel_top + panel_h
        body += _limit_lines(metric, limited, scale, panel_top, y)
        body += _bar_axis(scale, y)
        y += 42

    phased = [(i, p) for i, p in enumerate(profiles) if p.phases_ms]
    if phased:
        body.append(
            _text(24, y + 14, "Mean time per request by phase (engine metrics)", weight="bold")
        )
        phases = [ph for ph in _PHASE_ORDER if any(ph in p.phases_ms for _, p in phased)]
        phases += sorted({ph for _, p in phased for ph in p.phases_ms} - set(phases))
        phase_colors = {
            ph: _PHASE_COLORS.get(ph, _OTHER_PHASE_COLORS[k % len(_OTHER_PHASE_COLORS)])
            for k, ph in enumerate(phases)
        }
        lx = 24.0
        y += 24
        for ph in phases:
            body.append(
                f'<rect {_attrs(x=lx, y=y, width=12, height=12)} fill="{phase_colors[ph]}"/>'
            )
            body.append(_text(lx + 17, y + 10, ph, cls="legend"))
            lx += 17 + 7.2 * len(ph) + 22
        y += 24
        totals = [
            sum(max(0.0, v) for v in p.phases_ms.values() if math.isfinite(v)) for _, p in phased
        ]
        scale = _scale(totals, x0, x1, zero=True, n=6)
        stack_h = 20.0
        panel_top = y
        panel_h = len(phased) * (stack_h + group_gap) - group_gap
        body += _bar_grid(scale, panel_top, panel_top + panel_h)
        for (_, prof), total in zip(phased, totals, strict=True):
            body.append(_text(x0 - 10, y + stack_h / 2 + 4, _clip(prof.label, 24), anchor="end"))
            cx = x0
            for ph in phases:
                v = prof.phases_ms.get(ph)
                if v is None or not math.isfinite(v) or v <= 0:
                    continue
                w = scale(v) - scale(0)
                tip = f"{prof.label}: mean {ph} {_ms(v)}"
                body.append(
                    f'<rect class="phase" data-phase="{escape(ph)}" '
                    f'{_attrs(x=cx, y=y, width=w, height=stack_h)} fill="{phase_colors[ph]}" '
                    f'stroke="#ffffff" stroke-width="0.5"><title>{escape(tip)}</title></rect>'
                )
                if w > 46:
                    body.append(
                        _text(
                            cx + w / 2,
                            y + stack_h - 6,
                            f"{v:,.0f}" if v >= 10 else f"{v:.1f}",
                            anchor="middle",
                            size=10,
                            fill="#ffffff" if ph != "queue" else _INK,
                        )
                    )
                cx += w
            body.append(_text(cx + 5, y + stack_h - 6, _ms(total), size=10))
            y += stack_h + group_gap
        y = panel_top + panel_h
        body += _bar_axis(scale, y)
        y += 42
    if any(p.cache for p in profiles):
        from autotuner.bundle.cache_panel import cache_panel  # it draws with this module

        panel, y = cache_panel(profiles, y)
        body += panel
    if kernels:
        from autotuner.bundle.kernel_chart import kernel_panel  # it draws with this module

        panel, y = kernel_panel(kernels, y)
        body += panel
    return _svg(width, y, body, heading)


def _limit_lines(
    metric: str, limited: Mapping[str, float], scale: _Scale, top: float, bottom: float
) -> list[str]:
    """A dashed line per SLA limit of ``metric`` across its panel, labelled just above it
    (to the line's left where the label would run past the chart's right edge)."""
    out = []
    for q, limit in sorted(limited.items(), key=lambda kv: _percentile_key(kv[0])):
        x = scale(limit)
        label = f"SLA {q} <= {_ms(limit)}"
        words = f"SLA limit: {q} {metric.upper()} <= {_ms(limit)}"
        out.append(
            f'<line class="sla-limit" data-metric="{escape(metric)}" '
            f'data-percentile="{escape(q)}" data-limit="{limit:g}" '
            f"{_attrs(x1=x, y1=top - 6, x2=x, y2=bottom + 4)} "
            f'stroke="{_INK}" stroke-width="1.5" stroke-dasharray="5 3">'
            f"<title>{escape(words)}</title></line>"
        )
        right = x + 4 + 6.0 * len(label) <= 770
        out.append(
            _text(
                x + 4 if right else x - 4,
                top - 9,
                label,
                anchor="start" if right else "end",
                size=10,
                cls="sla-limit-label",
            )
        )
    return out


def _ms(value: float | None) -> str:
    return format_value("latency_ms", value)


def _bar_grid(scale: _Scale, top: float, bottom: float) -> list[str]:
    out = [f'<g class="grid" stroke="{_GRID}" stroke-width="1">']
    out += [
        f"<line {_attrs(x1=scale(t), y1=top - 4, x2=scale(t), y2=bottom + 4)}/>"
        for t in scale.ticks
    ]
    out.append("</g>")
    return out


def _bar_axis(scale: _Scale, y: float) -> list[str]:
    out = [_line(scale.a, y + 4, scale.b, y + 4, _AXIS)]
    for t in scale.ticks:
        out.append(_line(scale(t), y + 4, scale(t), y + 8, _AXIS))
        out.append(_text(scale(t), y + 20, scale.label(t), anchor="middle", size=10, cls="tick"))
    # After the last tick's label, which is centred on the axis end.
    last = scale.label(scale.ticks[-1])
    out.append(_text(scale.b + 3.2 * len(last) + 6, y + 20, "ms", size=10, fill=_AXIS))
    return out


# ---------------------------------------------------------------------------------------------
# Fallback plan


def _cell(name: str, value: float | None, basis: Mapping[str, str]) -> str:
    """A table cell: the value, and where it comes from when that is known."""
    text = format_value(name, value)
    return f"{text} ({basis[name]})" if name in basis and value is not None else text


def fallback_plan_md(
    study: str,
    promoted_label: str,
    promoted_metrics: Mapping[str, float | None],
    fallbacks: Sequence[Fallback],
    notes: Sequence[str],
    promoted_basis: Mapping[str, str] | None = None,
) -> str:
    """A runbook in Markdown: what is promoted, then each fallback by rank with when to switch
    to it, what it costs against the promoted config, and the exact command that serves it.

    ``promoted_basis`` and each fallback's ``basis`` say per metric where a figure comes from
    (confirmation replicates or a single run of the search); they are shown beside it."""
    pb = promoted_basis or {}
    out = [f"# Fallback plan: {study}", "", f"Promoted: **{promoted_label}**", ""]
    if promoted_metrics:
        out += ["| metric | measured |", "|---|---|"]
        out += [f"| {metric_name(k)} | {_cell(k, v, pb)} |" for k, v in promoted_metrics.items()]
        out.append("")
    if not fallbacks:
        out += [
            "No fallback was measured: re-run `autotuner tune` if the promoted config fails.",
            "",
        ]
    else:
        out += [
            "If the promoted config cannot run or stops meeting the SLA, go down this list and use",
            "the first fallback whose trigger matches. Each was measured in the same study, on the",
            "same workload; costs are relative to the promoted config.",
            "",
        ]
    for fb in sorted(fallbacks, key=lambda f: f.rank):
        out += [f"## {fb.rank}. {fb.label}", "", "**Switch to it when**", ""]
        out += [f"- {t}" for t in fb.triggers] or ["- (no trigger derived: a manual choice)"]
        out.append("")
        keys = list(fb.metrics) + [k for k in fb.cost if k not in fb.metrics]
        if keys:
            out += ["**Measured, against the promoted config**", ""]
            out += ["| metric | this config | promoted | change |", "|---|---|---|---|"]
            for k in keys:
                change = fb.change_text.get(k) or format_change(k, fb.cost.get(k))
                out.append(
                    f"| {metric_name(k)} | {_cell(k, fb.metrics.get(k), fb.basis)} "
                    f"| {_cell(k, promoted_metrics.get(k), pb)} "
                    f"| {change} |"
                )
            out.append("")
        if fb.params:
            shown = ", ".join(f"`{k}={json.dumps(v, default=str)}`" for k, v in fb.params.items())
            out += [f"**Parameters**: {shown}", ""]
        else:
            out += ["**Parameters**: engine defaults", ""]
        out += ["**Run it**", "", "```bash", format_command(argv_lines(fb.argv)), "```", ""]
    if notes:
        out += ["## Notes", ""]
        out += [f"- {n}" for n in notes]
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Triggers

_MARGIN = 0.02  # differences below 2 % are measurement noise, not a reason to switch


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _memory_options(roles: OptionRoles) -> list[str]:
    """The engine's options where a lower value needs less memory, in the order a trigger
    names them: memory fraction, slots, context length, step token budget."""
    wanted = (roles.memory_fraction, roles.slots, roles.context_length, roles.step_tokens)
    return [name for name in wanted if name is not None]


def _uses_fp8(params: Mapping[str, object], roles: OptionRoles) -> bool:
    keys = [k for k in (roles.weight_quantization, roles.kv_dtype) if k is not None]
    return any("fp8" in str(params.get(k, "")).lower() for k in keys)


def _gpus(params: Mapping[str, object], roles: OptionRoles) -> int:
    n = 1
    for key in (roles.tensor_parallel, roles.pipeline_parallel):
        v = _number(params.get(key, 1)) if key is not None else None
        n *= int(v) if v else 1
    return n


def _fmt_param(value: float) -> str:
    return f"{value:g}"


def trigger_sentences(
    params: Mapping[str, object],
    metrics: Mapping[str, float | None],
    *,
    promoted_params: Mapping[str, object],
    promoted_metrics: Mapping[str, float | None],
    is_baseline: bool,
    roles: OptionRoles,
    rate_margin: float = 0.02,
    rate_settled: bool = False,
    rate_basis: str | None = None,
) -> list[str]:
    """When to switch from the promoted config to this one, from how the two differ.
    ``roles``: the engine's option roles, which name the options the triggers watch.

    The load trigger compares ``capacity`` when both configs have one (else goodput, else the
    request rate) and needs a lead above ``rate_margin`` (the capacity resolution: less is
    inside one measurement). ``rate_settled``: confirmation compared the two and promoted the
    other one, so no load trigger (it would contradict the decision). ``rate_basis`` (e.g.
    "single runs") is added to the load trigger's sentence.

    Less memory (a lower memory fraction / slots / context length / step token budget, e.g.
    vLLM's ``gpu_memory_utilization`` / ``max_num_seqs`` / ``max_model_len`` /
    ``max_num_batched_tokens``, or a measured peak lower by more than 2 %) -> out-of-memory at
    start-up; no fp8 (weights or KV cache) where the promoted uses it -> a GPU without fp8;
    fewer GPUs (tensor x pipeline parallel); eager mode ->
    CUDA graph capture failing; a higher goodput -> load above the promoted's goodput; lower
    latencies -> the load stays low and latency matters more. The baseline (engine defaults)
    is the last resort: after an engine upgrade, and when anything else fails. Parameters are
    compared only where both configs set them (a default is unknown here).
    """
    out: list[str] = []
    if is_baseline:
        out.append(
            "after an engine version change, until re-tuned: the engine defaults are the "
            "safest configuration (tuned flags may have changed meaning or been removed)"
        )

    less: list[str] = []
    for key in _memory_options(roles):
        mine, theirs = _number(params.get(key)), _number(promoted_params.get(key))
        if mine is not None and theirs is not None and mine < theirs:
            less.append(f"{key} {_fmt_param(mine)} instead of {_fmt_param(theirs)}")
    mine_mem, theirs_mem = (
        _finite(metrics.get("peak_memory_gib")),
        _finite(promoted_metrics.get("peak_memory_gib")),
    )
    if mine_mem is not None and theirs_mem is not None and mine_mem < theirs_mem * (1 - _MARGIN):
        less.append(f"measured peak memory {mine_mem:.1f} GiB instead of {theirs_mem:.1f} GiB")
    if less:
        out.append(
            "the promoted config fails to start with out of memory (less free memory than when "
            "tuned, e.g. another process on the GPU): this one needs less (" + "; ".join(less) + ")"
        )

    if _uses_fp8(promoted_params, roles) and not _uses_fp8(params, roles):
        out.append(
            "the GPU has no fp8 support (compute capability < 8.9, i.e. older than Ada/Hopper): "
            "this one does not use fp8"
        )
    if _gpus(params, roles) < _gpus(promoted_params, roles):
        out.append(
            f"fewer than {_gpus(promoted_params, roles)} GPUs are available: this one needs "
            f"{_gpus(params, roles)}"
        )
    eager = roles.eager
    if eager is not None and params.get(eager) is True and promoted_params.get(eager) is not True:
        out.append(
            "CUDA graph capture fails or start-up takes too long: this one runs in eager mode"
        )

    rate_key = "goodput" if "goodput" in metrics else "request_rate"
    if _finite(metrics.get("capacity")) and _finite(promoted_metrics.get("capacity")):
        rate_key = "capacity"
    mine_rate, theirs_rate = _finite(metrics.get(rate_key)), _finite(promoted_metrics.get(rate_key))
    if (
        not rate_settled
        and mine_rate is not None
        and theirs_rate is not None
        and mine_rate > theirs_rate * (1 + max(rate_margin, _MARGIN))
    ):
        out.append(
            f"the SLA is violated above {theirs_rate:.2f} req/s (the promoted config's measured "
            f"{metric_name(rate_key)}): this one kept it up to {mine_rate:.2f} req/s"
            + (f" ({rate_basis})" if rate_basis else "")
        )
    faster = []
    for key, value in promoted_metrics.items():
        mine, theirs = _finite(metrics.get(key)), _finite(value)
        if not _LATENCY.match(key) or mine is None or theirs is None:
            continue
        if mine < theirs * (1 - _MARGIN):
            faster.append(
                f"{metric_name(key)} {format_value(key, mine)} "
                f"instead of {format_value(key, theirs)}"
            )
    if faster:
        if mine_rate is not None and theirs_rate is not None and mine_rate < theirs_rate:
            lead = (
                f"the load stays below {mine_rate:.2f} req/s (its measured "
                f"{metric_name(rate_key)}; the promoted config's higher rate is not needed) "
                "and lower latency is wanted"
            )
        else:
            lead = "lower latency is wanted"
        out.append(f"{lead}: " + ", ".join(faster))

    if is_baseline:
        out.append("anything else fails: the engine defaults need no tuned flag")
    elif not out:
        out.append(
            "the promoted config fails or misses the SLA for another reason: this is the "
            "next best measured feasible config"
        )
    return out
