"""latency_breakdown.svg draws the SLA's limits, and its prefix-cache words stay inside the
chart (issue 29)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from autotuner.bundle.report import LatencyProfile, latency_breakdown_svg, sla_limits
from tests.unit.bundle.test_report import parse, profile, texts, with_class

SVG = "{http://www.w3.org/2000/svg}"


def _x(el: ET.Element, key: str) -> float:
    return float(el.get(key) or "nan")


def test_the_limits_the_sla_sets_are_drawn_on_their_metrics_panels() -> None:
    limits = sla_limits([("p90_ttft_ms", 300.0), ("p99_tpot_ms", 25.0), ("goodput", 2.0)])
    assert limits == {"ttft": {"p90": 300.0}, "tpot": {"p99": 25.0}}
    root = parse(latency_breakdown_svg([profile("promoted", 1.0, {})], limits=limits))
    lines = with_class(root, "sla-limit")
    assert {(e.get("data-metric"), e.get("data-percentile")) for e in lines} == {
        ("ttft", "p90"),
        ("tpot", "p99"),
    }
    assert "SLA p90 <= 300.0 ms" in texts(root) and "SLA p99 <= 25.0 ms" in texts(root)
    # The TTFT limit (300 ms) lies right of the p90 bar (80 ms) and left of the p99 (250 ms
    # is shorter too): the line sits where 300 ms is on the axis, inside the chart.
    width = float(root.get("width") or root.get("viewBox", "0 0 0 0").split()[2])
    ttft = next(e for e in lines if e.get("data-metric") == "ttft")
    bars = [b for b in with_class(root, "bar") if b.get("data-metric") == "ttft"]
    p99 = next(b for b in bars if b.get("data-percentile") == "p99")
    assert _x(p99, "x") + _x(p99, "width") < _x(ttft, "x1") < width


def test_without_limits_no_line_is_drawn() -> None:
    root = parse(latency_breakdown_svg([profile("promoted", 1.0, {})]))
    assert with_class(root, "sla-limit") == []


def test_the_prefix_cache_words_fit_in_the_chart() -> None:
    cached = LatencyProfile(
        "promoted (trial 12)",
        {"ttft": {"p99": 10.0}},
        cache={"prompt_cached_share": 1.0, "prefix_cache_hit_rate": 1.0},
    )
    svg = latency_breakdown_svg([cached])
    root = parse(svg)
    width = float(root.get("width") or "0")
    words = [t for t in root.iter(f"{SVG}text") if "of prompt tokens" in "".join(t.itertext())]
    assert words, svg
    for t in words:
        said = "".join(t.itertext())
        size = float(t.get("font-size") or 10)
        # A generous width per character (0.6 em): the text must end inside the chart.
        assert float(t.get("x") or 0) + 0.6 * size * len(said) <= width, said
