"""SVG building blocks shared by the bundle's charts (the Pareto plot, the latency breakdown
and its panels, the capacity-search pictures of :mod:`autotuner.bundle.capacity_chart`):
coordinates, attributes and text escaped for XML, axes scales with nice ticks, and the
document wrapper.

Pure string building; every text and attribute value goes through :func:`html.escape`, so a
label that came from a user or an engine renders as text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
INK = "#222222"
GRID = "#e6e6e6"
AXIS = "#555555"


def n(v: float) -> str:
    """A coordinate: two decimals at most, no trailing zeros."""
    text = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def attrs(**kw: str | float | None) -> str:
    parts = []
    for key, value in kw.items():
        if value is None:
            continue
        name = key.rstrip("_").replace("_", "-")
        text = n(value) if isinstance(value, float | int) else value
        parts.append(f'{name}="{escape(text, quote=True)}"')
    return " ".join(parts)


def text(
    x: float,
    y: float,
    s: str,
    *,
    anchor: str = "start",
    size: float = 12,
    weight: str | None = None,
    fill: str = INK,
    cls: str | None = None,
    rotate: bool = False,
    halo: bool = False,
) -> str:
    transform = f"rotate(-90 {n(x)} {n(y)})" if rotate else None
    # A white outline drawn under the glyphs keeps labels legible over markers and lines.
    outline = {"stroke": "#ffffff", "stroke_width": "3", "paint_order": "stroke"} if halo else {}
    a = attrs(
        x=x,
        y=y,
        text_anchor=anchor,
        font_size=size,
        font_weight=weight,
        fill=fill,
        class_=cls,
        transform=transform,
        **outline,
    )
    return f"<text {a}>{escape(s, quote=False)}</text>"


def line(x1: float, y1: float, x2: float, y2: float, stroke: str, width: float = 1) -> str:
    return f"<line {attrs(x1=x1, y1=y1, x2=x2, y2=y2, stroke=stroke, stroke_width=width)}/>"


def document(width: float, height: float, body: Sequence[str], title: str) -> str:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{n(width)}" '
        f'height="{n(height)}" viewBox="0 0 {n(width)} {n(height)}" '
        f'font-family="{FONT}">'
    )
    return "\n".join(
        [
            '<?xml version="1.0" encoding="UTF-8"?>',
            head,
            f"<title>{escape(title, quote=False)}</title>",
            f'<rect width="{n(width)}" height="{n(height)}" fill="#ffffff"/>',
            *body,
            "</svg>",
            "",
        ]
    )


@dataclass(frozen=True)
class Scale:
    """A linear map from data [lo, hi] to pixels [a, b], with its tick values."""

    lo: float
    hi: float
    a: float
    b: float
    ticks: tuple[float, ...]
    decimals: int

    def __call__(self, v: float) -> float:
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)

    def label(self, v: float) -> str:
        text = f"{v:,.{self.decimals}f}"
        return "0" if re.fullmatch(r"-0(\.0*)?", text) else text


def scale(
    values: Sequence[float],
    a: float,
    b: float,
    *,
    integer: bool = False,
    zero: bool = False,
    n: int = 5,
) -> Scale:
    """Nice ticks (1, 2, 2.5, 5 x 10^k) spanning ``values``; the axis runs from the first
    tick to the last, a little further where a value would sit on the frame.

    Identical values get a window around them (no division by zero; not below 0 for
    non-negative data); ``zero`` starts the axis at 0 (bar charts).
    """
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if zero:
        lo = min(lo, 0.0)
    if hi - lo <= 0:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
        if values and min(values) >= 0:
            lo = max(lo, 0.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    if integer:
        step = max(1.0, math.ceil(step))
    start = math.floor(lo / step + 1e-9) * step
    end = math.ceil(hi / step - 1e-9) * step
    count = round((end - start) / step)
    ticks = tuple(start + i * step for i in range(count + 1))
    decimals = 0 if integer else max(0, -math.floor(math.log10(step) + 1e-9))
    if not integer and abs(step / 10**-decimals - round(step / 10**-decimals)) > 1e-9:
        decimals += 1  # 2.5 x 10^k needs one more digit
    axis_lo, axis_hi = start, end
    if not zero:  # markers on the frame are hard to see
        margin = (hi - lo) * 0.03
        axis_lo, axis_hi = min(start, lo - margin), max(end, hi + margin)
    return Scale(axis_lo, axis_hi, a, b, ticks, decimals)


def clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
