"""Promotion with a profile run (no engine): the promoted config and the baseline are profiled
once each, into ``profile/<config>/``; their breakdowns become ``kernel_breakdown.csv`` and the
kernel panel of ``latency_breakdown.svg``; a profile that fails is said and left out."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path
from xml.etree import ElementTree

from autotuner.bundle.promote import promote
from autotuner.core.types import ParamValue
from autotuner.measure.kernel_profile import ProfileFailed
from autotuner.measure.kernels import ALL, KernelBreakdown, aggregate
from tests.unit.measure.test_kernels import cpu_trace

from .test_promote import DEFAULT_SEQS, Scenario, _study


def _kernel_bars(svg: str) -> list[ElementTree.Element]:
    return [e for e in ElementTree.fromstring(svg).iter() if e.get("class") == "kernel"]


def test_the_promoted_config_and_the_baseline_are_profiled_into_the_bundle(tmp_path: Path) -> None:
    sc = Scenario(confirm={32: [30.0, 31.0, 29.0], DEFAULT_SEQS: [15.0, 15.5, 14.5]})
    ctx = _study(tmp_path, sc)
    calls: list[tuple[dict[str, ParamValue], Path]] = []

    def profile(params: Mapping[str, ParamValue], run_dir: Path) -> KernelBreakdown:
        calls.append((dict(params), run_dir))
        return aggregate([cpu_trace()], window_s=2.0)

    said: list[str] = []
    promote(ctx, sc.confirm_run, said.append, profile)
    assert [(p.get("max_num_seqs"), d.relative_to(ctx.study_dir).as_posix()) for p, d in calls] == [
        (32, "profile/trial-4"),
        (None, "profile/baseline"),
    ]
    assert said.count("  -> " + aggregate([cpu_trace()]).summary()) == 2
    bundle = ctx.study_dir / "promoted"
    rows = list(csv.DictReader(io.StringIO((bundle / "kernel_breakdown.csv").read_text())))
    assert {r["config"] for r in rows} == {"promoted (trial 4)", "baseline (trial 0)"}
    bars = _kernel_bars((bundle / "latency_breakdown.svg").read_text())
    # Two configs, each its whole window and three phases, five classes in the whole window.
    assert len([b for b in bars if b.get("data-phase") == ALL]) == 10


def test_a_failed_profile_is_said_and_left_out(tmp_path: Path) -> None:
    sc = Scenario(top_of_32=1.0)  # no lead: the baseline is kept, the only config profiled

    def profile(params: Mapping[str, ParamValue], run_dir: Path) -> KernelBreakdown:
        raise ProfileFailed("the engine wrote no trace into /x")

    said: list[str] = []
    manifest = promote(_study(tmp_path, sc), sc.confirm_run, said.append, profile)
    assert manifest["promoted"]["is_baseline"]
    assert "  -> no kernel profile of baseline: the engine wrote no trace into /x" in said
    bundle = tmp_path / "promote-unit" / "promoted"
    assert not (bundle / "kernel_breakdown.csv").exists()
    assert not _kernel_bars((bundle / "latency_breakdown.svg").read_text())


def test_without_a_profile_run_nothing_is_profiled(tmp_path: Path) -> None:
    sc = Scenario(top_of_32=1.0)
    said: list[str] = []
    promote(_study(tmp_path, sc), sc.confirm_run, said.append)
    assert not any("kernel profile" in s for s in said)
    assert not (tmp_path / "promote-unit" / "promoted" / "kernel_breakdown.csv").exists()
