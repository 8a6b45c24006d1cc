"""One launch's capacity search as a small picture: each load level the search measured (its
offered load on x, in the order measured), its verdict, and the deciding percentile against
the SLA's limit (y: the percentile as a share of its limit, with its confidence interval
where the level's requests were kept), over the capacity's bracket.

Pure like :mod:`autotuner.bundle.report`: level views in, an SVG element out (no XML
declaration: it is meant to sit inline in the study's page, :mod:`autotuner.bundle.page`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from autotuner.bundle import svg

# A level's verdict: the SLA's ("meets", "misses", "undecided"), or "behind" where the load
# generator fell behind its schedule (the level tells nothing).
VERDICT_COLORS = {
    "meets": "#2e7d32",
    "misses": "#c62828",
    "undecided": "#ef8f00",
    "behind": "#8a8a8a",
}
_TOP = 2.5  # y axis: up to 250 % of the limit; points above sit on the top edge


@dataclass(frozen=True)
class LevelPoint:
    """One measured load level, as the capacity picture draws it."""

    index: int  # order measured, from 1
    load: float
    verdict: str  # meets / misses / undecided / behind
    deciding: str | None  # the constraint key closest to (or past) its limit
    value: float | None  # that constraint's measured value
    limit: float | None
    lower: float | None = None  # the percentile's confidence bounds (None: not known)
    upper: float | None = None
    note: str = ""  # more words for the hover text


def capacity_svg(
    levels: Sequence[LevelPoint],
    *,
    unit: str,
    low: float | None,
    high: float | None,
    value: float | None,
    title: str,
    race: tuple[float, str] | None = None,
) -> str:
    """The picture, 420 x 180 pixels (an ``<svg>`` element). ``race``: the load a candidate
    raced at (the incumbent's capacity) and its label, drawn as a dashed line."""
    width, height = 420.0, 180.0
    left, right, top, bottom = 46.0, 404.0, 26.0, 142.0
    loads = [lv.load for lv in levels] + [v for v in (low, high, value) if v]
    loads += [race[0]] if race else []
    sx = svg.scale(loads, left, right)
    sy = svg.scale([0.0, _TOP], bottom, top, zero=True, n=5)
    body = [svg.text(left, 16, title, size=12, weight="bold")]
    if low and low > 0:  # the bracket: met at its low edge, not at its high one
        hi = high if high is not None else sx.hi
        x0, x1 = sx(low), sx(hi)
        body.append(
            f'<rect class="bracket" {svg.attrs(x=x0, y=top, width=max(x1 - x0, 1.5))} '
            f'height="{svg.n(bottom - top)}" fill="#2e7d32" fill-opacity="0.12">'
            f"<title>{escape(_bracket_tip(low, high, value, unit))}</title></rect>"
        )
    body.append(f'<g class="grid" stroke="{svg.GRID}" stroke-width="1">')
    body += [f"<line {svg.attrs(x1=left, y1=sy(t), x2=right, y2=sy(t))}/>" for t in sy.ticks]
    body.append("</g>")
    body.append(
        f"<rect {svg.attrs(x=left, y=top, width=right - left, height=bottom - top)} "
        f'fill="none" stroke="{svg.AXIS}"/>'
    )
    for t in sy.ticks:
        body.append(svg.text(left - 5, sy(t) + 4, f"{t:.0%}", anchor="end", size=9, cls="tick"))
    for t in sx.ticks:
        body.append(svg.line(sx(t), bottom, sx(t), bottom + 4, svg.AXIS))
        body.append(svg.text(sx(t), bottom + 15, sx.label(t), anchor="middle", size=9))
    body.append(
        svg.text(
            (left + right) / 2, bottom + 32, f"offered load ({unit})", anchor="middle", size=10
        )
    )
    body.append(svg.line(left, sy(1.0), right, sy(1.0), "#c62828", 1.2))
    if race is not None:
        x = sx(race[0])
        # The label on the side of the line with more room, low in the plot (clear of the
        # limit line and of a point past the limit on the top edge).
        side, anchor = (4.0, "start") if x < (left + right) / 2 else (-4.0, "end")
        body.append(
            f'<g class="race"><line {svg.attrs(x1=x, y1=top, x2=x, y2=bottom)} '
            f'stroke="{svg.AXIS}" stroke-width="1" stroke-dasharray="4 3"/>'
            + svg.text(x + side, bottom - 6, race[1], anchor=anchor, size=9, fill=svg.AXIS)
            + "</g>"
        )
    body.append(svg.text(right - 2, sy(1.0) - 4, "limit", anchor="end", size=9, fill="#c62828"))
    if not levels:
        body.append(
            svg.text(
                (left + right) / 2,
                (top + bottom) / 2,
                "no level measured",
                anchor="middle",
                size=11,
            )
        )
    for lv in levels:
        body.append(_level(lv, sx(lv.load), sy, unit))
    return svg.document(width, height, body, title).split("\n", 1)[1]


def _ratio(v: float | None, limit: float | None) -> float | None:
    if v is None or limit is None:
        return None
    if limit == 0:  # a limit of 0 (no errors allowed): any value above it is past the limit
        return 0.0 if v <= 0 else _TOP
    return max(0.0, min(v / limit, _TOP))


def _level(lv: LevelPoint, px: float, sy: svg.Scale, unit: str) -> str:
    color = VERDICT_COLORS.get(lv.verdict, "#8a8a8a")
    tip = f"level {lv.index}: {lv.load:.3g} {unit}, {lv.verdict}"
    if lv.deciding and lv.value is not None and lv.limit is not None:
        tip += f"; {lv.deciding} {lv.value:.4g} against the limit {lv.limit:.4g}"
        if lv.lower is not None or lv.upper is not None:
            below = "-" if lv.lower is None else f"{lv.lower:.4g}"
            above = "none (too few requests)" if lv.upper is None else f"{lv.upper:.4g}"
            tip += f" (interval {below} to {above})"
    if lv.note:
        tip += f"; {lv.note}"
    parts = [
        f'<g class="level {escape(lv.verdict)}" data-load="{lv.load:.6g}">',
        f"<title>{escape(tip)}</title>",
    ]
    ratio = _ratio(lv.value, lv.limit)
    y = sy(ratio) if ratio is not None else sy(0) - 6
    lo, hi = _ratio(lv.lower, lv.limit), _ratio(lv.upper, lv.limit)
    if lo is not None or hi is not None:
        y0 = sy(lo if lo is not None else (ratio or 0.0))
        y1 = sy(hi if hi is not None else _TOP)
        parts.append(svg.line(px, y0, px, y1, color, 2))
        parts.append(svg.line(px - 3, y0, px + 3, y0, color, 1.5))
        if hi is not None:
            parts.append(svg.line(px - 3, y1, px + 3, y1, color, 1.5))
    if lv.verdict == "behind":
        parts.append(
            f'<circle {svg.attrs(cx=px, cy=y, r=4.5)} fill="#ffffff" stroke="{color}" '
            'stroke-width="1.5"/>'
        )
    else:
        parts.append(f'<circle {svg.attrs(cx=px, cy=y, r=4.5)} fill="{color}"/>')
    parts.append(svg.text(px, y - 8, str(lv.index), anchor="middle", size=8, fill=svg.AXIS))
    parts.append("</g>")
    return "".join(parts)


def _bracket_tip(low: float, high: float | None, value: float | None, unit: str) -> str:
    top = "open (nothing above it missed)" if high is None else f"{high:.3g}"
    est = "" if value is None else f", estimate {value:.3g}"
    return f"capacity bracket: met at {low:.3g} {unit}, not shown met at {top}{est}"
