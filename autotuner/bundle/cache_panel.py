"""The prefix-cache panel of ``latency_breakdown.svg``: per config, the share of prompt tokens
the engine served from its prefix cache at the SLA's load, with the cache hit rate
(:mod:`autotuner.measure.cache`). Drawn with the SVG helpers of :mod:`autotuner.bundle.svg`."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from autotuner.bundle import svg

if TYPE_CHECKING:
    from autotuner.bundle.latency_chart import LatencyProfile

_X0, _X1 = 190.0, 650.0
_BAR_H, _GAP = 14.0, 6.0
_WORDS_H = 14.0  # the row under each bar for its words (to the bar's right they ran off the
# chart's 780 px: "100% of prompt tokens, hit rate 100%" is some 200 px at size 10)
_CACHED = "#4c78a8"


def cache_panel(profiles: Sequence[LatencyProfile], y: float) -> tuple[list[str], float]:
    """The panel's SVG elements starting at ``y``, and the ``y`` below it."""
    shown = [(i, p) for i, p in enumerate(profiles) if p.cache]
    if not shown:
        return [], y
    body = [
        svg.text(
            24, y + 14, "Prompt tokens served from the prefix cache (engine metrics)", weight="bold"
        )
    ]
    y += 26
    for _, prof in shown:
        share = prof.cache.get("prompt_cached_share")
        rate = prof.cache.get("prefix_cache_hit_rate")
        body.append(svg.text(_X0 - 10, y + _BAR_H - 3, svg.clip(prof.label, 24), anchor="end"))
        body.append(
            f'<rect {svg.attrs(x=_X0, y=y, width=_X1 - _X0, height=_BAR_H)} fill="{svg.GRID}"/>'
        )
        words = "n/a" if share is None else f"{share:.0%} of prompt tokens"
        if rate is not None:
            words += f", hit rate {rate:.0%}"
        if share is not None:
            w = max(0.5, (_X1 - _X0) * max(0.0, min(1.0, share)))
            tip = f"{prof.label}: {words}"
            body.append(
                f'<rect class="cache" data-share="{share:.4f}" '
                f"{svg.attrs(x=_X0, y=y, width=w, height=_BAR_H)} "
                f'fill="{_CACHED}"><title>{escape(tip)}</title></rect>'
            )
        body.append(svg.text(_X0, y + _BAR_H + 11, words, size=10, cls="cache-words"))
        y += _BAR_H + _WORDS_H + _GAP
    return body, y + 24
