"""A CPU target has no GPUs: what the tuner writes about its layout counts engine ranks
(issue 29: "TP=1 x DP=1 (1 GPU)" and "req/s per GPU" on a CPU target)."""

from __future__ import annotations

from pathlib import Path

import optuna

from autotuner.bundle.promote import promote
from autotuner.search import progress
from tests.unit.bundle.test_promote import DEFAULT_SEQS, Scenario, _study


def test_a_cpu_bundles_serve_script_counts_engine_ranks(tmp_path: Path) -> None:
    sc = Scenario(confirm={32: [30.0, 31.0, 29.0], DEFAULT_SEQS: [15.0, 15.5, 14.5]})
    ctx = _study(tmp_path, sc)
    assert ctx.hardware.device == "cpu"
    promote(ctx, sc.confirm_run, lambda s: None)
    serve = (ctx.study_dir / "promoted" / "deploy" / "serve.sh").read_text()
    (layout,) = [line for line in serve.splitlines() if "layout: " in line]
    assert "TP=1 x DP=1 (1 rank)" in layout and "GPU" not in layout


def test_capacity_per_gpu_reads_per_engine_rank_on_a_cpu_target() -> None:
    study = optuna.create_study()
    study.set_user_attr("identity", {"engine": "vllm 0.31.0", "target": "cpu:"})
    assert progress._unit(study, "capacity_per_gpu") == "req/s per engine rank"
    study.set_user_attr("identity", {"engine": "vllm 0.31.0", "target": "gpu:0"})
    assert progress._unit(study, "capacity_per_gpu") == "req/s per GPU"
