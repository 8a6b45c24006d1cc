"""The latency breakdown of a bundle (``latency_breakdown.svg``): each config's latency
percentiles against the SLA's limits, its mean time per phase, and its kernel time when it was
profiled. Pure, like :mod:`autotuner.bundle.report`: profiles in, the SVG document out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING

from autotuner.bundle.cache_panel import cache_panel
from autotuner.bundle.kernel_chart import kernel_panel
from autotuner.bundle.metric_names import LATENCY_METRIC, finite, format_value
from autotuner.bundle.svg import AXIS as _AXIS
from autotuner.bundle.svg import GRID as _GRID
from autotuner.bundle.svg import INK as _INK
from autotuner.bundle.svg import Scale as _Scale
from autotuner.bundle.svg import attrs as _attrs
from autotuner.bundle.svg import clip as _clip
from autotuner.bundle.svg import document as _svg
from autotuner.bundle.svg import line as _line
from autotuner.bundle.svg import scale as _scale
from autotuner.bundle.svg import text as _text

if TYPE_CHECKING:
    from autotuner.measure.kernels import KernelBreakdown
    from autotuner.records.trial import TrialFile


@dataclass(frozen=True)
class LatencyProfile:
    """One config's latency summary, for the latency breakdown."""

    label: str  # "promoted (trial 7)"
    percentiles: dict[str, dict[str, float | None]]  # {"ttft": {"p50": ms, ...}, "tpot": ...}
    phases_ms: dict[str, float] = field(default_factory=dict)  # mean "queue"/"prefill"/"decode"
    # The engine's prefix cache: "prompt_cached_share", "prefix_cache_hit_rate" (0 to 1).
    cache: dict[str, float] = field(default_factory=dict)


def launch_profile(tf: TrialFile | None, title: str) -> LatencyProfile | None:
    """A launch's latencies at the SLA's own load (its first level), as the bundle and the
    study page draw them; a value that is not a number is left out (the file is input)."""
    if tf is None or not tf.levels:
        return None
    m = tf.levels[0].metrics
    pct = {
        metric: {q: m.get(f"{q}_{metric}_ms") for q in ("p50", "p90", "p99")}
        for metric in ("ttft", "tpot", "e2e")
    }
    eng = tf.levels[0].engine
    phases = {
        k: float(eng[f"mean_{k}_ms"])
        for k in ("queue", "prefill", "decode")
        if isinstance(eng.get(f"mean_{k}_ms"), int | float)
    }
    cache = {
        k: float(eng[k])
        for k in ("prompt_cached_share", "prefix_cache_hit_rate")
        if isinstance(eng.get(k), int | float)
    }
    return LatencyProfile(title, pct, phases, cache)


_PROFILE_COLORS = ("#d62728", "#7f7f7f", "#4c78a8", "#54a24b", "#b279a2", "#9d755d")
_PHASE_COLORS = {"queue": "#bab0ac", "prefill": "#f58518", "decode": "#54a24b"}
_OTHER_PHASE_COLORS = ("#72b7b2", "#b279a2", "#9d755d")

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
        m = LATENCY_METRIC.match(metric)
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
            if (v := finite(p.percentiles.get(metric, {}).get(q))) is not None
        ]
        limited = {q: v for q, v in (limits or {}).get(metric, {}).items() if finite(v) is not None}
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
                v = finite(prof.percentiles.get(metric, {}).get(q))
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
        panel, y = cache_panel(profiles, y)
        body += panel
    if kernels:
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
