"""``autotuner report``'s text says what the study measured in the study's own terms: a CPU
target's devices are engine ranks (no "per GPU"), its target reads ``cpu`` (not ``cpu:,``),
and the latency columns are the percentiles the SLA limits (issue 29)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, cast

import optuna
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from autotuner.bundle.summary import render, sla_percentiles, target_text
from autotuner.engines import registry
from autotuner.search.study import storage_url

SLA = (
    "name: p90\nmodel: {synth: tiny-llama}\ntarget: cpu\n"
    "workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 1},"
    " requests: 4}\nconstraints: {p90_ttft_ms: 100, p90_tpot_ms: 20}\n"
    "objectives: [{maximize: goodput}]\n"
)


def _study(tmp_path: Path, target: str) -> optuna.Study:
    (tmp_path / "sla.yaml").write_text(SLA)
    study = optuna.create_study(
        study_name="p90", storage=storage_url(tmp_path, None), directions=["maximize"]
    )
    study.set_user_attr("identity", {"engine": "vllm 0.31.0", "target": target})
    study.set_user_attr("objectives", ["goodput"])
    study.add_trial(
        create_trial(
            values=[4.0],
            params={"max_num_seqs": 32},
            distributions={"max_num_seqs": IntDistribution(1, 64)},
            user_attrs={
                "status": "complete",
                "role": "candidate",
                "config_key": '{"max_num_seqs":32}',
                "params_full": {"max_num_seqs": 32},
                "max_load": 4.0,
                "metrics": {
                    "goodput": 4.0,
                    "p90_ttft_ms": 61.0,
                    "p99_ttft_ms": 987.0,
                    "p90_tpot_ms": 12.5,
                    "p99_tpot_ms": 77.7,
                },
            },
            constraints={"p90_ttft_ms": -0.4},
        )
    )
    return study


def _render(study: optuna.Study, study_dir: Path) -> str:
    """:func:`render`, given the engine's option roles where it takes them."""
    args: list[Any] = [study, study_dir]
    if "roles" in inspect.signature(render).parameters:
        args.append(registry.get("vllm").roles)
    return str(cast(Any, render)(*args))


def test_a_cpu_study_reads_in_engine_ranks_and_its_target_without_a_dangling_colon(
    tmp_path: Path,
) -> None:
    text = _render(_study(tmp_path, "cpu:"), tmp_path)
    assert "target cpu:" not in text and "target cpu, space" in text
    assert "per GPU" not in text
    assert "per rank" in text


def test_a_gpu_study_keeps_its_gpus() -> None:
    assert target_text("gpu:0,1") == "gpu 0,1"
    assert target_text("cpu:") == "cpu"


def test_the_latency_columns_are_the_percentiles_the_sla_limits(tmp_path: Path) -> None:
    text = _render(_study(tmp_path, "cpu:"), tmp_path)
    assert "p90 TTFT" in text and "p90 TPOT" in text and "p99" not in text
    row = next(line for line in text.splitlines() if "candidate" in line)
    assert " 61 " in row and "12.5" in row and "987" not in row


def test_without_an_sla_file_the_columns_stay_p99(tmp_path: Path) -> None:
    assert sla_percentiles(tmp_path) == ("p99_ttft_ms", "p99_tpot_ms")


def test_a_candidate_still_choosing_its_config_does_not_read_as_the_defaults(
    tmp_path: Path,
) -> None:
    # A tune stopped (or crashed) while the sampler chose trial 1's config leaves it RUNNING
    # with no params; "engine defaults" there named a config it never ran.
    study = _study(tmp_path, "gpu:0")
    trial = study.ask()
    trial.set_user_attr("role", "candidate")
    text = _render(study, tmp_path)
    row = next(line for line in text.splitlines() if line.lstrip().startswith(f"{trial.number} "))
    assert "running" in row and "config not chosen yet" in row
    assert "engine defaults" not in row


def test_a_candidate_interrupted_before_its_config_was_chosen_is_not_the_defaults(
    tmp_path: Path,
) -> None:
    # The H200 interactive study: the sampler crashed while choosing trial 2's config; the
    # next run failed it as interrupted, and the report called it "engine defaults".
    study = _study(tmp_path, "gpu:0")
    study.add_trial(
        create_trial(
            state=TrialState.FAIL,
            user_attrs={"role": "candidate", "interrupted": True},
        )
    )
    text = _render(study, tmp_path)
    row = next(line for line in text.splitlines() if line.lstrip().startswith("1 "))
    assert "interrupted before its config was chosen" in row
    assert "engine defaults" not in row
