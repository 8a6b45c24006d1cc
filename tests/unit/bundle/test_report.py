"""Bundle reports: Pareto SVG and CSV, latency breakdown SVG, fallback runbook, triggers."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import shlex
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from autotuner.bundle.report import (
    Fallback,
    LatencyProfile,
    Point,
    fallback_plan_md,
    format_change,
    latency_breakdown_svg,
    metric_better,
    metric_label,
    pareto_csv,
    pareto_svg,
    trigger_sentences,
)
from autotuner.engines import registry

ROLES = registry.get("vllm").roles  # the options the triggers watch

SVG = "{http://www.w3.org/2000/svg}"


def pt(
    trial: int,
    goodput: float | None,
    ttft: float | None,
    *,
    feasible: bool = True,
    front: bool = False,
    promoted: bool = False,
    baseline: bool = False,
    params: dict[str, object] | None = None,
) -> Point:
    return Point(
        trial,
        {"goodput": goodput, "p99_ttft_ms": ttft},
        feasible,
        front,
        promoted,
        baseline,
        params if params is not None else {"max_num_seqs": 8 * (trial + 1)},
    )


POINTS = [
    pt(0, 8.0, 210.0, baseline=True, params={}),
    pt(1, 12.0, 110.0, front=True),
    pt(2, 20.0, 170.0, front=True),
    pt(3, 28.0, 290.0, front=True, promoted=True),
    pt(4, 15.0, 260.0),
    pt(5, 30.0, 400.0, feasible=False),
    pt(6, None, None, feasible=False),
]


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg.encode())


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def with_class(root: ET.Element, prefix: str) -> list[ET.Element]:
    return [e for e in root.iter() if (e.get("class") or "").split(" ")[:1] == [prefix]]


def assert_finite_numbers(svg: str) -> None:
    assert not re.search(r"\b(nan|inf)\b", svg, re.I)


@pytest.mark.parametrize(
    ("name", "label", "better"),
    [
        ("p99_ttft_ms", "p99 TTFT (ms)", "min"),
        ("mean_tpot_ms", "mean TPOT (ms)", "min"),
        ("goodput", "goodput (req/s)", "max"),
        ("request_rate", "request rate (req/s)", "max"),
        ("output_tokens_per_s", "output tokens (tok/s)", "max"),
        ("peak_memory_gib", "peak memory (GiB)", "min"),
        ("error_rate", "error rate", "min"),
        ("something_else", "something else", None),
    ],
)
def test_metric_names_units_and_directions(name: str, label: str, better: str | None) -> None:
    assert metric_label(name) == label
    assert metric_better(name) == better


def test_format_change_says_better_or_worse() -> None:
    assert format_change("goodput", -0.12) == "-12.0 % (worse)"
    assert format_change("p99_ttft_ms", -0.12) == "-12.0 % (better)"
    assert format_change("p99_ttft_ms", 0.05) == "+5.0 % (worse)"
    assert format_change("goodput", None) == "n/a"


def test_pareto_svg_markers_front_and_labels() -> None:
    svg = pareto_svg(POINTS, "goodput", "p99_ttft_ms", x_better="max", y_better="min")
    root = parse(svg)
    markers = with_class(root, "point")
    assert len(markers) == 6  # trial 6 has no values
    roles = {m.get("data-trial"): m.get("class") for m in markers}
    assert roles["3"] == "point promoted"
    assert roles["0"] == "point baseline"
    assert roles["5"] == "point infeasible"
    assert roles["4"] == "point dominated"
    assert roles["1"] == roles["2"] == "point front"
    all_text = texts(root)
    assert "promoted (trial 3)" in all_text
    assert "baseline (trial 0)" in all_text
    assert any("goodput (req/s)" in t for t in all_text)
    assert any("p99 TTFT (ms)" in t for t in all_text)
    assert any("1 without a value" in t for t in all_text)
    assert any(t.startswith("Pareto front") for t in all_text)
    # Three front points: three vertices and two corners of the staircase.
    (line,) = with_class(root, "front-line")
    assert len((line.get("points") or "").split()) == 5
    assert_finite_numbers(svg)


def test_pareto_svg_staircase_corners_take_the_worse_of_each() -> None:
    points = [pt(1, 10.0, 100.0, front=True), pt(2, 20.0, 200.0, front=True)]
    root = parse(pareto_svg(points, "goodput", "p99_ttft_ms"))
    (line,) = with_class(root, "front-line")
    (a, corner, b) = [tuple(map(float, p.split(","))) for p in (line.get("points") or "").split()]
    assert corner[0] == a[0]  # x of the lower goodput
    assert corner[1] == b[1]  # y of the higher TTFT


@pytest.mark.parametrize(
    "points",
    [
        [pt(0, 5.0, 100.0, baseline=True, promoted=True, front=True)],
        [pt(1, 5.0, 100.0, front=True), pt(2, 5.0, 100.0, front=True)],
        [pt(1, 0.0, 0.0), pt(2, 0.0, 0.0)],
        [pt(1, None, 100.0), pt(2, 3.0, None)],
        [],
    ],
    ids=["one-point", "identical", "zeros", "all-missing", "empty"],
)
def test_pareto_svg_degenerate_inputs(points: list[Point]) -> None:
    svg = pareto_svg(points, "goodput", "p99_ttft_ms")
    root = parse(svg)
    shown = [p for p in points if None not in p.values.values()]
    assert len(with_class(root, "point")) == len(shown)
    assert_finite_numbers(svg)
    if not shown:
        assert "no measured points" in texts(root)


def test_pareto_svg_one_objective_is_plotted_by_trial() -> None:
    root = parse(pareto_svg(POINTS, "goodput", x_better="max"))
    all_text = texts(root)
    assert "trial" in all_text
    assert any(t.startswith("goodput (req/s)") for t in all_text)
    assert "best feasible so far" in all_text
    assert len(with_class(root, "point")) == 6
    # Best feasible so far: 8 (t0), 12 (t1), 20 (t2), 28 (t3), held to trial 5.
    (line,) = with_class(root, "front-line")
    assert len((line.get("points") or "").split()) == 4 + 3 + 1


def test_pareto_svg_escapes_text() -> None:
    points = [pt(1, 5.0, 100.0, params={"chat_template": "<&\"'>"}, promoted=True)]
    root = parse(pareto_svg(points, "goodput", "p99_ttft_ms", title="a < b & c"))
    assert texts(root)[0] == "a < b & c"
    (marker,) = with_class(root, "point")
    title = marker.find(f"{SVG}title")
    assert title is not None and "<&\"'>" in (title.text or "")


def test_pareto_csv_round_trips() -> None:
    text = pareto_csv(POINTS, ["goodput", "p99_ttft_ms"])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == ["trial", "role", "feasible", "goodput", "p99_ttft_ms", "params"]
    by_trial = {int(r["trial"]): r for r in rows}
    assert [by_trial[i]["role"] for i in range(7)] == [
        "baseline",
        "front",
        "front",
        "promoted",
        "dominated",
        "infeasible",
        "infeasible",
    ]
    assert by_trial[3]["feasible"] == "true" and by_trial[5]["feasible"] == "false"
    assert float(by_trial[2]["goodput"]) == 20.0
    assert by_trial[6]["goodput"] == "" and by_trial[6]["p99_ttft_ms"] == ""
    assert json.loads(by_trial[1]["params"]) == {"max_num_seqs": 16}
    assert json.loads(by_trial[0]["params"]) == {}


def profile(label: str, scale: float, phases: dict[str, float]) -> LatencyProfile:
    return LatencyProfile(
        label,
        {
            "ttft": {"p50": 40 * scale, "p90": 80 * scale, "p99": 250 * scale},
            "tpot": {"p99": 33 * scale, "p50": 11 * scale, "p90": None},
            "e2e": {"p50": 400 * scale, "p90": 550 * scale, "p99": 1080 * scale},
        },
        phases,
    )


def test_latency_breakdown_bars_and_phases() -> None:
    profiles = [
        profile("promoted (trial 7)", 1.0, {"queue": 5.0, "prefill": 40.0, "decode": 350.0}),
        profile("baseline (trial 0)", 1.5, {}),
    ]
    svg = latency_breakdown_svg(profiles)
    root = parse(svg)
    bars = with_class(root, "bar")
    assert len(bars) == 2 * (3 + 2 + 3)  # one TPOT p90 is missing in each
    assert {b.get("data-metric") for b in bars} == {"ttft", "tpot", "e2e"}
    assert sum(b.get("data-profile") == "1" for b in bars) == 8
    phases = with_class(root, "phase")
    assert [p.get("data-phase") for p in phases] == ["queue", "prefill", "decode"]
    all_text = texts(root)
    for label in ("promoted (trial 7)", "baseline (trial 0)", "p50", "p90", "p99", "ms"):
        assert label in all_text
    assert "n/a" in all_text
    assert any(t.startswith("TTFT") for t in all_text)
    assert any(t.startswith("Mean time per request by phase") for t in all_text)
    assert_finite_numbers(svg)
    # Percentiles in numeric order, whatever the input order.
    tpot = [b.get("data-percentile") for b in bars if b.get("data-metric") == "tpot"]
    assert tpot == ["p50", "p50", "p99", "p99"]


def test_latency_breakdown_without_phases_or_data() -> None:
    root = parse(latency_breakdown_svg([profile("a", 1.0, {})]))
    assert not with_class(root, "phase")
    empty = parse(latency_breakdown_svg([]))
    assert "no latency data" in texts(empty)


PROMOTED_PARAMS: dict[str, object] = {
    "gpu_memory_utilization": 0.95,
    "max_num_seqs": 256,
    "kv_cache_dtype": "fp8",
}
PROMOTED_METRICS: dict[str, float | None] = {
    "goodput": 24.0,
    "p99_ttft_ms": 250.0,
    "p99_tpot_ms": 18.0,
    "peak_memory_gib": 128.0,
}


def test_triggers_for_a_smaller_config_without_fp8() -> None:
    out = trigger_sentences(
        {"gpu_memory_utilization": 0.85, "max_num_seqs": 128, "kv_cache_dtype": "auto"},
        {"goodput": 20.0, "p99_ttft_ms": 180.0, "p99_tpot_ms": 18.1, "peak_memory_gib": 115.0},
        promoted_params=PROMOTED_PARAMS,
        promoted_metrics=PROMOTED_METRICS,
        is_baseline=False,
        roles=ROLES,
    )
    assert len(out) == 3
    assert "out of memory" in out[0] and "max_num_seqs 128 instead of 256" in out[0]
    assert "fp8" in out[1] and "compute capability < 8.9" in out[1]
    assert "below 20.00 req/s" in out[2] and "p99 TTFT" in out[2]
    assert "TPOT" not in out[2]  # within noise


def test_triggers_for_a_faster_config_and_parallelism() -> None:
    out = trigger_sentences(
        {**PROMOTED_PARAMS, "tensor_parallel_size": 1, "enforce_eager": True},
        {"goodput": 30.0, "p99_ttft_ms": 260.0},
        promoted_params={**PROMOTED_PARAMS, "tensor_parallel_size": 2},
        promoted_metrics=PROMOTED_METRICS,
        is_baseline=False,
        roles=ROLES,
    )
    text = "\n".join(out)
    assert "fewer than 2 GPUs" in text
    assert "eager" in text
    assert "SLA is violated above 24.00 req/s" in text and "30.00 req/s" in text
    assert "out of memory" not in text


def test_triggers_baseline_and_fallthrough() -> None:
    out = trigger_sentences(
        {},
        {"goodput": 10.0},
        promoted_params=PROMOTED_PARAMS,
        promoted_metrics=PROMOTED_METRICS,
        is_baseline=True,
        roles=ROLES,
    )
    assert out[0].startswith("after an engine version change")
    assert any("fp8" in t for t in out)
    assert out[-1].startswith("anything else fails")
    same = trigger_sentences(
        PROMOTED_PARAMS,
        PROMOTED_METRICS,
        promoted_params=PROMOTED_PARAMS,
        promoted_metrics=PROMOTED_METRICS,
        is_baseline=False,
        roles=ROLES,
    )
    assert len(same) == 1 and "another reason" in same[0]


def test_fallback_plan_lists_each_fallback_with_triggers_cost_and_command() -> None:
    argv1 = ["vllm", "serve", "/models/my model", "--max-num-seqs", "128", "--x", 'it\'s "q"']
    argv2 = ["vllm", "serve", "/models/my model", "--load-format", "dummy"]
    fallbacks = [
        Fallback(
            2,
            "baseline (engine defaults)",
            {},
            argv2,
            {"goodput": 10.0},
            {"goodput": -0.5833},
            ["anything else fails"],
        ),
        Fallback(
            1,
            "trial 4 (next Pareto point)",
            {"max_num_seqs": 128},
            argv1,
            {"goodput": 21.0, "p99_ttft_ms": 262.5},
            {"goodput": -0.125, "p99_ttft_ms": 0.05, "peak_memory_gib": -0.3},
            [
                "the promoted config fails to start with out of memory",
                "SLA violated above 24 req/s",
            ],
        ),
    ]
    md = fallback_plan_md(
        "llama3-8b-h200", "trial 7", PROMOTED_METRICS, fallbacks, ["Measured on vllm 0.32.0."]
    )
    assert md.startswith("# Fallback plan: llama3-8b-h200")
    assert "**trial 7**" in md
    first, second = md.index("## 1. trial 4 (next Pareto point)"), md.index("## 2. baseline")
    assert first < second
    for fb in fallbacks:
        for trigger in fb.triggers:
            assert f"- {trigger}" in md
    assert "-12.5 % (worse)" in md and "+5.0 % (worse)" in md and "-30.0 % (better)" in md
    assert "| goodput | 21.00 req/s | 24.00 req/s |" in md
    assert "Measured on vllm 0.32.0." in md
    blocks = re.findall(r"```bash\n(.*?)\n```", md, re.S)
    assert [shlex.split(b.replace("\\\n", "")) for b in blocks] == [argv1, argv2]


def test_fallback_plan_without_fallbacks() -> None:
    md = fallback_plan_md("s", "trial 1", {}, [], [])
    assert "No fallback" in md


def test_pareto_csv_and_svg_say_which_figures_were_confirmed() -> None:
    confirmed = [dataclasses.replace(p, basis="confirmed, 3 replicates") for p in POINTS[:2]]
    points = [*confirmed, *POINTS[2:]]
    rows = list(csv.DictReader(io.StringIO(pareto_csv(points, ["goodput"], figures=True))))
    assert list(rows[0]) == ["trial", "role", "feasible", "figures", "goodput", "params"]
    assert [r["figures"] for r in rows[:3]] == ["confirmed, 3 replicates"] * 2 + ["single run"]
    root = parse(pareto_svg(points, "goodput", "p99_ttft_ms"))
    sub = "confirmed in replicates: trial 0, trial 1, others single runs"
    assert any(sub in t for t in texts(root))
    tips = [m.find(f"{SVG}title") for m in with_class(root, "point")]
    assert any(t is not None and "(single run)" in (t.text or "") for t in tips)


def test_no_load_trigger_where_confirmation_already_decided() -> None:
    faster = {"capacity": 30.0, "goodput": 30.0, "p99_ttft_ms": 260.0}
    promoted = {**PROMOTED_METRICS, "capacity": 24.0}
    args: dict[str, Any] = {
        "promoted_params": PROMOTED_PARAMS,
        "promoted_metrics": promoted,
        "is_baseline": False,
        "roles": ROLES,
    }
    text = "\n".join(trigger_sentences(PROMOTED_PARAMS, faster, **args))
    assert "SLA is violated above 24.00 req/s (the promoted config's measured capacity)" in text
    settled = "\n".join(trigger_sentences(PROMOTED_PARAMS, faster, **args, rate_settled=True))
    assert "violated above" not in settled
    # A lead inside the capacity resolution is no trigger; a single run's lead is marked.
    close = {**faster, "capacity": 24.5}
    inside = trigger_sentences(PROMOTED_PARAMS, close, **args, rate_margin=0.03)
    assert "violated" not in "".join(inside)
    marked = trigger_sentences(PROMOTED_PARAMS, faster, **args, rate_basis="single runs")
    assert any(t.endswith("up to 30.00 req/s (single runs)") for t in marked)


def test_fallback_plan_marks_where_each_figure_comes_from() -> None:
    fb = Fallback(
        1,
        "baseline (engine defaults)",
        {},
        ["vllm", "serve", "m"],
        {"capacity": 20.0, "p99_ttft_ms": 200.0},
        {"capacity": -0.1667, "p99_ttft_ms": -0.2},
        ["anything else fails"],
        basis={"capacity": "mean of 3 replicates", "p99_ttft_ms": "single run"},
        change_text={"capacity": "-16.7 % [-20.1, -13.0] (confirmed: lower)"},
    )
    md = fallback_plan_md(
        "s",
        "trial 7",
        {"capacity": 24.0, "p99_ttft_ms": 250.0},
        [fb],
        [],
        promoted_basis={"capacity": "mean of 3 replicates", "p99_ttft_ms": "single run"},
    )
    assert "| capacity | 24.00 req/s (mean of 3 replicates) |" in md
    assert (
        "| capacity | 20.00 req/s (mean of 3 replicates) | 24.00 req/s (mean of 3 replicates) "
        "| -16.7 % [-20.1, -13.0] (confirmed: lower) |"
    ) in md
    assert "| p99 TTFT | 200.0 ms (single run) | 250.0 ms (single run) | -20.0 % (better) |" in md
