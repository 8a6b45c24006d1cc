"""What the tuner prints while it runs reads right: "1 launch left", not "1 launches" (issue 29)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from autotuner.core.types import ParamValue
from autotuner.search.study import Budget, StudyRunner, make_sampler, open_study, storage_url
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import parse_sla

SLA = (
    "name: progress\nmodel: {synth: tiny-llama}\n"
    "workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 1},"
    " requests: 4}\nconstraints: {p99_ttft_ms: 100}\n"
    "objectives: [{maximize: goodput}]\n"
)


def _result(
    params: Mapping[str, ParamValue], trial_dir: Path, /, *, start_load: float | None = None
) -> TrialResult:
    level = Level(
        2.0,
        True,
        {"goodput": 2.0, "p99_ttft_ms": 40.0},
        {"p99_ttft_ms": -0.6},
        {},
        {},
        "level-0.json",
    )
    return TrialResult({}, "complete", "rate", (level,), 0, duration_s=60.0)


def test_one_launch_left_is_singular(tmp_path: Path) -> None:
    sla = parse_sla(SLA)
    study = open_study(sla, storage_url(tmp_path, None), make_sampler("random", 5, 1, 0), {})
    said: list[str] = []
    runner = StudyRunner(
        sla,
        study,
        tmp_path,
        suggest=lambda trial: {"max_num_seqs": trial.suggest_int("max_num_seqs", 1, 64)},
        fixed={},
        prune=lambda p: None,
        run=_result,
        budget=Budget(3),
        say=said.append,
    )
    runner.loop()
    left = [line for line in said if " left, ETA " in line]
    assert any("; 2 launches left," in line for line in left), said
    assert any("; 1 launch left," in line for line in left), said
    assert not any("1 launches" in line for line in said)


def test_the_trial_line_shows_the_percentiles_the_sla_limits(tmp_path: Path) -> None:
    sla = parse_sla(SLA.replace("{p99_ttft_ms: 100}", "{p90_ttft_ms: 100, p90_tpot_ms: 20}"))
    study = open_study(sla, storage_url(tmp_path, None), make_sampler("random", 5, 1, 0), {})
    said: list[str] = []

    def run(
        params: Mapping[str, ParamValue], trial_dir: Path, /, *, start_load: float | None = None
    ) -> TrialResult:
        metrics: dict[str, float | None] = {"goodput": 2.0, "p90_ttft_ms": 61.0}
        metrics |= {"p99_ttft_ms": 987.0}
        metrics |= {"p90_tpot_ms": 12.5, "p99_tpot_ms": 77.0}
        level = Level(2.0, True, metrics, {"p90_ttft_ms": -0.4}, {}, {}, "level-0.json")
        return TrialResult({}, "complete", "rate", (level,), 0, duration_s=60.0)

    StudyRunner(
        sla,
        study,
        tmp_path,
        suggest=lambda trial: {"max_num_seqs": trial.suggest_int("max_num_seqs", 1, 64)},
        fixed={},
        prune=lambda p: None,
        run=run,
        budget=Budget(1),
        say=said.append,
    ).loop()
    (line,) = [s for s in said if s.startswith("  -> ")]
    assert "p90 TTFT 61" in line and "p90 TPOT 12.5" in line, line
    assert "p99" not in line and "987" not in line
