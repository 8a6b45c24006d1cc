"""The lever table: the vLLM file reads, bad tables are refused, ranking per limit and load."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.engines import registry
from autotuner.search.levers import LeverTableError, load_levers, parse_levers, rank
from autotuner.sla.tuning import DEFAULT_GPU_MINUTES, TuneSpec
from autotuner.space import ParamOverride, load_space


def _space(allow_lossy: bool = False):  # type: ignore[no-untyped-def]
    return load_space(
        "vllm",
        "0.11.0",
        device="gpu",
        gpu_count=1,
        compute_capability=(9, 0),
        allow_lossy=allow_lossy,
        overrides={},
    )


def _table():  # type: ignore[no-untyped-def]
    path = registry.get("vllm").levers_file
    assert isinstance(path, Path)
    table = load_levers(path)
    assert table is not None
    return table


def test_vllm_table_reads_and_marks_unmeasured_rows() -> None:
    table = _table()
    rows = {(r.name, r.limit) for r in table.rows}
    for lever in ("max_num_batched_tokens", "long_prefill_token_threshold", "gpus"):
        assert (lever, "tpot") in rows
    unmeasured = [r for r in table.rows if r.measured is None]
    assert unmeasured and all(r.evidence() == "expected, not yet measured" for r in unmeasured)
    trade = next(r for r in table.rows if r.name == "max_num_seqs" and r.limit == "tpot")
    assert trade.effect == "trades" and trade.costs == ("ttft",) and trade.measured is not None


def test_tpot_under_long_prompts_ranks_prefill_levers_before_the_trade() -> None:
    ranked = rank(_table(), "tpot", _space(), long_prompts=True, prior_values={})
    status = {r.lever.name: r.status for r in ranked}
    assert status["max_num_batched_tokens"] == "try"
    assert status["long_prefill_token_threshold"] == "try"
    assert status["max_num_seqs"] == "trade"
    assert status["kv_cache_dtype"] == "lossy"  # fp8 is not in a lossless space
    assert status["gpus"] == "outside"
    assert status["gpu_memory_utilization"] == "none"
    order = [r.status for r in ranked]
    assert order == sorted(order, key=["try", "trade", "lossy", "outside", "none"].index)
    budget = next(r for r in ranked if r.lever.name == "max_num_batched_tokens")
    assert all(v < 4096 for v in budget.values)  # type: ignore[operator]


def test_short_prompts_skip_the_long_prompt_rows() -> None:
    ranked = rank(_table(), "tpot", _space(), long_prompts=False, prior_values={})
    names = {r.lever.name for r in ranked}
    assert "long_prefill_token_threshold" not in names and "max_num_seqs" in names


def test_lossy_levers_are_tried_where_allowed() -> None:
    ranked = rank(_table(), "tpot", _space(allow_lossy=True), long_prompts=True)
    assert next(r for r in ranked if r.lever.name == "kv_cache_dtype").status == "try"


def test_a_lever_excluded_from_the_space_is_not_tried() -> None:
    space = load_space(
        "vllm",
        "0.11.0",
        device="gpu",
        gpu_count=1,
        compute_capability=(9, 0),
        allow_lossy=False,
        overrides={"long_prefill_token_threshold": ParamOverride(exclude=True)},
    )
    ranked = rank(_table(), "tpot", space, long_prompts=True)
    assert next(r for r in ranked if r.lever.name == "long_prefill_token_threshold").status == (
        "outside"
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("format: 2\nlevers: {}", "format: 1"),
        ("format: 1\nlevers: {a: [{limit: speed, effect: moves, why: x}]}", "limit must be"),
        ("format: 1\nlevers: {a: [{limit: tpot, effect: helps, why: x}]}", "effect must be"),
        ("format: 1\nlevers: {a: [{limit: tpot, effect: moves}]}", "why is required"),
        ("format: 1\nlevers: {a: [{limit: tpot, effect: trades, why: x}]}", "costs:"),
        (
            "format: 1\nlevers: {a: [{limit: tpot, effect: moves, why: x, measured: {where: y}}]}",
            "measured.result",
        ),
        ("format: 1\nlevers: {a: [{limit: tpot, effect: moves, why: x, size: 3}]}", "unknown"),
        ("format: 1\nlevers: [", "not YAML"),
    ],
)
def test_bad_tables_are_refused_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(LeverTableError, match=says):
        parse_levers(text, "t.yaml")


def test_no_table_is_none() -> None:
    assert load_levers(None) is None


def test_gpu_minute_budget_defaults_on_gpu_targets_only() -> None:
    assert TuneSpec().gpu_minutes("gpu") == DEFAULT_GPU_MINUTES
    assert TuneSpec().gpu_minutes("cpu") is None
    assert TuneSpec(budget_gpu_minutes=15).gpu_minutes("cpu") == 15
    with pytest.raises(ValueError):
        TuneSpec(budget_gpu_minutes=0)
