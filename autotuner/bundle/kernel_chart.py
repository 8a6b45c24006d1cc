"""The kernel-class panel of ``latency_breakdown.svg``: where a profiled window's device time
went (on a CPU engine: operator time), as 100 % stacked bars, one per config and per phase.

Pure like :mod:`autotuner.bundle.report`, drawn with :mod:`autotuner.bundle.svg`: breakdowns in,
SVG elements and the next free y out.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from autotuner.bundle import svg
from autotuner.measure.kernels import ALL, CLASS_LABELS, CLASSES, KernelBreakdown

COLORS = {
    "attention": "#4c78a8",
    "gemm": "#f58518",
    "norm_activation": "#54a24b",
    "sampling": "#b279a2",
    "communication": "#e45756",
    "memory_copy": "#72b7b2",
    "other": "#bab0ac",
}
_X0, _X1 = 190.0, 650.0
_BAR_H, _GAP = 18.0, 8.0


def _rows(named: Sequence[tuple[str, KernelBreakdown]]) -> list[tuple[str, KernelBreakdown, str]]:
    """(row label, breakdown, phase): each config's whole window, then its phases."""
    out = []
    for label, b in named:
        out.append((label, b, ALL))
        out += [(f"  {phase}", b, phase) for phase in b.phases()]
    return out


def kernel_panel(named: Sequence[tuple[str, KernelBreakdown]], y: float) -> tuple[list[str], float]:
    """The panel's SVG elements starting at ``y``, and the y below it (no panel: unchanged)."""
    if not named:
        return [], y
    timed = sorted({b.timed for _, b in named})
    body = [
        svg.text(24, y + 14, f"Time by kernel class ({', '.join(timed)}, profiled)", weight="bold")
    ]
    y += 24
    present = [c for c in CLASSES if any(b.time_us(c) > 0 for _, b in named)]
    lx = 24.0
    for cls in present:  # the class legend, wrapped at the panel's width
        text = CLASS_LABELS[cls]
        need = 17 + 7.2 * len(text) + 22
        if lx + need > 760:
            lx, y = 24.0, y + 18
        body.append(f'<rect {svg.attrs(x=lx, y=y, width=12, height=12)} fill="{COLORS[cls]}"/>')
        body.append(svg.text(lx + 17, y + 10, text, cls="legend"))
        lx += need
    y += 24
    top = y
    for label, b, phase in _rows(named):
        total = b.total_us(phase)
        body.append(svg.text(_X0 - 10, y + _BAR_H / 2 + 4, svg.clip(label, 26), anchor="end"))
        x = _X0
        for cls in CLASSES:
            share = b.share(cls, phase)
            if share <= 0:
                continue
            w = share * (_X1 - _X0)
            ms = b.time_us(cls, phase) / 1000
            tip = f"{label.strip()}: {CLASS_LABELS[cls]} {share * 100:.1f} % ({ms:,.2f} ms)"
            body.append(
                f'<rect class="kernel" data-class="{escape(cls)}" data-phase="{escape(phase)}" '
                f'{svg.attrs(x=x, y=y, width=w, height=_BAR_H)} fill="{COLORS[cls]}" '
                f'stroke="#ffffff" stroke-width="0.5"><title>{escape(tip)}</title></rect>'
            )
            if w > 34:
                body.append(
                    svg.text(
                        x + w / 2, y + _BAR_H - 5, f"{share * 100:.0f}%", anchor="middle", size=10
                    )
                )
            x += w
        steps = b.steps.get(phase) if phase != ALL else sum(b.steps.values())
        note = f"{total / 1000:,.1f} ms" + (f", {steps} steps" if steps else "")
        body.append(svg.text(_X1 + 6, y + _BAR_H - 5, note, size=10))
        y += _BAR_H + _GAP
    body.append(svg.line(_X0, top - 4, _X0, y - _GAP + 4, svg.AXIS))
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = _X0 + frac * (_X1 - _X0)
        body.append(svg.text(x, y + 10, f"{frac * 100:.0f}%", anchor="middle", size=10, cls="tick"))
    windows = ", ".join(
        f"{label}: {b.window_s:.1f} s window, {b.traces} trace{'s' if b.traces != 1 else ''}"
        for label, b in named
    )
    body.append(svg.text(24, y + 28, f"share of profiled time; {windows}", size=10, fill=svg.AXIS))
    return body, y + 46
