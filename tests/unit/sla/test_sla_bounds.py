"""Values that `check` used to accept and `tune` then tripped over: each is exit 2 with file:line.

Every case here was accepted by `autotuner check` before (issue: bad input that check passes),
and later hung a run (`.inf` durations), raised a traceback (NaN limits, bad storage URLs,
unknown archs, non-JSONL datasets) or asked the engine for more than its context.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autotuner.cli.main import main
from autotuner.measure.levels import level_size
from autotuner.measure.quantile import requests_needed
from autotuner.sla.spec import (
    MAX_GRID_POINTS,
    SlaError,
    grid_points,
    is_known_metric,
    level_requests,
    parse_percentile_metric,
    parse_sla,
    percentile_requests,
)
from autotuner.space import SearchSpec

BASE = """\
model: {synth: tiny-llama}
workload:
  input_tokens: 64
  output_tokens: 16
  arrival: {process: poisson, rate: 2}
  requests: 20
constraints:
  p99_ttft_ms: 500
"""


def _sla(tmp_path: Path, old: str, new: str) -> Path:
    assert old in BASE
    path = tmp_path / "sla.yaml"
    path.write_text(BASE.replace(old, new))
    return path


@pytest.mark.parametrize(
    ("old", "new", "line", "phrase"),
    [
        ("requests: 20", "duration_s: .inf", 6, "workload.duration_s: Input should be a finite"),
        ("p99_ttft_ms: 500", "p99_ttft_ms: .nan", 8, "finite number"),
        ("rate: 2}", "rate: .inf}", 5, "finite number"),
        ("input_tokens: 64", "input_tokens: 100000000000000000000000000", 3, "must be <= 10000000"),
        ("requests: 20", "requests: 20\n  seed: -1", 7, "workload.seed"),
        ("{synth: tiny-llama}", "{synth: llama-9000}", 1, "unknown architecture"),
        ("p99_ttft_ms: 500", "p99_ttft_ms: 500\ntune: {storage: not a url}", 9, "database URL"),
        ("input_tokens: 64", "input_tokens: 4090", 3, "does not fit the model's context"),
        (
            "model: {synth: tiny-llama}",
            "model: {synth: tiny-llama}\nengine:\n  params: {max_model_len: 70}",
            5,
            "context of 70 tokens",
        ),
        # Issue 27, 4: bounds that hung or exhausted a run. Each message names the cost.
        ("rate: 2}", "rate: 1.0e-300}", 5, "workload.arrival.rate: must be >= 0.001, got 1e-300"),
        (
            "rate: 2}",
            "rate: 0.001}",
            5,
            "workload.arrival.rate: a load level is planned to take 3.46 days (299,000 s): 299 "
            "requests at 0.001 req/s (p99_ttft_ms at 95% confidence needs 299); a level may "
            "take at most 1 h (3,600 s)",
        ),
        (
            "p99_ttft_ms: 500",
            "p99.99999999999_ttft_ms: 500",
            8,
            "percentile 99.99999999999 has 11 decimals; at most 3 (p50 to p99.999)",
        ),
        (
            "p99_ttft_ms: 500",
            "p99_ttft_ms: 500\nobjectives: [{minimize: p99.9999_e2e_ms}]",
            9,
            "objectives[0].minimize: percentile 99.9999 has 4 decimals",
        ),
        (
            "requests: 20",
            "duration_s: 7200",
            6,
            "workload.duration_s: a load level is planned to take 2 h (7,200 s): "
            "workload.duration_s 7200 s; a level may take at most 1 h (3,600 s)",
        ),
        (
            "rate: 2}",
            "rate: 2}\n  conversation: {turns: 3, think_time_s: 3000}",
            6,
            "workload.conversation.think_time_s: a load level is planned to take 1.71 h "
            "(6,150 s): 299 requests at 2 req/s (p99_ttft_ms at 95% confidence needs 299) in "
            "150 s, then 2 later turns x 3000 s of think time",
        ),
        (
            "rate: 2}\n  requests: 20\nconstraints:\n  p99_ttft_ms: 500",
            "rate: 0.005}\n  requests: 20\nconstraints:\n  p50_ttft_ms: 500",
            5,
            "planned to take 1.11 h (4,000 s): 20 requests at 0.005 req/s; a level may take at "
            "most 1 h (3,600 s): raise the rate or lower workload.requests",
        ),
        ("requests: 20", "requests: 1000000000", 6, "workload.requests: must be <= 100000"),
        ("requests: 20", "requests: 20\n  warmup_requests: 10000000", 7, "must be <= 1000,"),
        ("requests: 20", "requests: 20\n  request_timeout_s: 1000000", 7, "must be <= 3600"),
        ("requests: 20", "requests: 20\n  timeout_s: 1000000", 7, "must be <= 3600"),
        (
            "{process: poisson, rate: 2}",
            "{process: concurrency, concurrency: 1000000000}",
            5,
            "workload.arrival.concurrency: must be <= 10000",
        ),
        (
            "rate: 2}",
            "rate: 2}\n  conversation: {turns: 1000000}",
            6,
            "workload.conversation.turns: must be <= 1000",
        ),
        (
            "p99_ttft_ms: 500",
            "p99_ttft_ms: 500\ntune: {max_requests_per_level: 10000000}",
            9,
            "tune.max_requests_per_level: must be <= 100000",
        ),
        (
            "model: {synth: tiny-llama}",
            "model: {synth: tiny-llama}\nengine: {startup_timeout_s: 1000000}",
            2,
            "engine.startup_timeout_s: must be <= 21600",
        ),
    ],
)
def test_check_refuses(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    old: str,
    new: str,
    line: int,
    phrase: str,
) -> None:
    path = _sla(tmp_path, old, new)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}:" in err, err
    assert phrase in err, err


def test_dataset_that_is_not_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "hello"}\nthis is not json\n')
    path = _sla(tmp_path, "input_tokens: 64", f"dataset: {data}")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3: workload.dataset:" in err, err
    assert f"{data}:2: not JSON" in err, err


def test_the_base_file_is_valid(tmp_path: Path) -> None:
    assert main(["check", str(_sla(tmp_path, "requests: 20", "requests: 20"))]) == 0


def _grid(values: int, names: tuple[str, ...]) -> str:
    rows = "".join(
        f"    {name}: {{values: [{', '.join(str(1 + i) for i in range(values))}]}}\n"
        for name in names
    )
    return f"search:\n  params:\n{rows}tune: {{sampler: grid}}\n"


GRID_PARAMS = ("max_num_seqs", "max_num_batched_tokens", "block_size")


def test_a_grid_too_large_is_refused_with_its_point_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Three lists of 3000 values passed check, then tune listed 27e9 points and died at 3.8 GB.
    path = _sla(tmp_path, "p99_ttft_ms: 500\n", "p99_ttft_ms: 500\n" + _grid(3000, GRID_PARAMS))
    started = time.monotonic()
    assert main(["check", str(path)]) == 2
    assert time.monotonic() - started < 60  # a bound against a hang, not a speed claim
    err = capsys.readouterr().err
    assert f"{path}:14: tune.sampler: the grid has 27,000,000,000 points (3000 max_" in err
    assert "more than the 10,000 launches a grid study may make" in err, err


def test_a_grid_at_the_bound_passes_and_points_are_counted_not_listed() -> None:
    text = BASE + _grid(100, GRID_PARAMS[:2])
    assert grid_points(parse_sla(text).search) == MAX_GRID_POINTS
    huge = SearchSpec.model_validate(
        {"params": {f"p{i}": {"values": list(range(50))} for i in range(300)}}
    )
    started = time.monotonic()
    assert grid_points(huge) == 50**300
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "key", ["p50_ttft_ms", "p99.999_tpot_ms", "p99.9990_e2e_ms", "p0.001_itl_ms", "p100_ttft_ms"]
)
def test_percentiles_up_to_three_decimals_pass(key: str) -> None:
    sla = parse_sla(BASE.replace("p99_ttft_ms", key))
    assert sla.constraints[0].metric.startswith("p")


def test_percentile_names_with_more_decimals_are_not_metrics() -> None:
    assert is_known_metric("p99.999_ttft_ms")
    assert not is_known_metric("p99.9999_ttft_ms")
    assert parse_percentile_metric("p99.99999999999_ttft_ms") is None


@pytest.mark.parametrize(
    ("workload", "passes"),
    [
        ("rate: 0.001}\n  requests: 3", True),  # 3000 s
        ("rate: 0.001}\n  requests: 4", False),  # 4000 s
        ("rate: 0.001}\n  duration_s: 3600", True),  # the duration ends the level first
        ("rate: 0.001}\n  requests: 4\n  duration_s: 3600", True),
        ("rate: 0.001}\n  duration_s: 3601", False),
    ],
)
def test_the_level_bound_is_the_planned_duration(workload: str, passes: bool) -> None:
    text = BASE.replace("rate: 2}\n  requests: 20", workload).replace("p99_ttft_ms", "p100_ttft_ms")
    if passes:
        parse_sla(text)
    else:
        with pytest.raises(SlaError, match="a load level is planned to take"):
            parse_sla(text)


def test_a_trace_too_slow_to_replay_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,30,8\n60,30,8\n120,30,8\n")
    workload = f"trace: {trace}\n  arrival: {{process: trace, speed: 0.01}}"
    old = "input_tokens: 64\n  output_tokens: 16\n  arrival: {process: poisson, rate: 2}\n"
    path = _sla(tmp_path, old + "  requests: 20", workload)  # the trace once: 120 s at 1x
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:4: workload.arrival.speed: a load level is planned to take 3.33 h" in err, err
    assert "3 requests of the trace (3 records over 3 min (180 s)) replayed at 0.01x" in err
    path.write_text(path.read_text().replace("speed: 0.01", "speed: 0.1"))  # 1200 s
    assert main(["check", str(path)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("p", [0.001, 0.25, 0.5, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999, 0.99999])
@pytest.mark.parametrize("confidence", [0.5, 0.75, 0.9, 0.95, 0.99, 0.999])
def test_the_schema_sizes_levels_as_the_measurement_does(p: float, confidence: float) -> None:
    assert percentile_requests(p, confidence) == requests_needed(p, confidence)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"requests: 20": "requests: 2000"},
        {"p99_ttft_ms": "p99.9_ttft_ms"},
        {"p99_ttft_ms: 500": "p99_ttft_ms: 500\n  p90_e2e_ms: 900\ntune: {confidence: 0.99}"},
        {"p99_ttft_ms: 500": "p99_ttft_ms: 500\ntune: {max_requests_per_level: 100}"},
        {"p99_ttft_ms": "p100_ttft_ms"},
        {"requests: 20": "duration_s: 60"},
    ],
)
def test_the_schema_level_size_is_level_size(changes: dict[str, str]) -> None:
    text = BASE
    for old, new in changes.items():
        text = text.replace(old, new)
    sla = parse_sla(text)
    size = level_size(sla)
    assert level_requests(sla) == (size.requests, size.needed, size.hardest)
