"""The Pareto plot (``pareto.svg``) and table (``pareto.csv``) of a bundle: every trial on the
objective plane, the front, the promoted config and the baseline. Pure, like
:mod:`autotuner.bundle.report`: points in, the file's content out.
"""

from __future__ import annotations

import csv
import io
import json
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

from autotuner.bundle.metric_names import Better, finite, format_value, metric_label, metric_name
from autotuner.bundle.svg import AXIS as _AXIS
from autotuner.bundle.svg import GRID as _GRID
from autotuner.bundle.svg import INK as _INK
from autotuner.bundle.svg import Scale as _Scale
from autotuner.bundle.svg import attrs as _attrs
from autotuner.bundle.svg import document as _svg
from autotuner.bundle.svg import line as _line
from autotuner.bundle.svg import n as _n
from autotuner.bundle.svg import scale as _scale
from autotuner.bundle.svg import text as _text


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


_PROMOTED = "#d62728"
_FEASIBLE = "#4c78a8"
_FRONT = "#1f4e89"
_FRONT_LINE = "#f58518"
_INFEASIBLE = "#9a9a9a"


# ---------------------------------------------------------------------------------------------
# Pareto plot


def _value(p: Point, name: str) -> float | None:
    if name == "trial":
        return float(p.trial)
    return finite(p.values.get(name))


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
