"""Verdicts against misbehaving engines: tune, bench and compare-engines on the fault-injection
harness (``autotuner.testing.standin``: an engine interpreter that prints garbage, exits at
start, exits 0, hangs, runs out of memory, dies in the middle of a level, ...).

A verdict is a product: met (exit 0), not met (exit 1) and an error (exit 3 for a failed
engine) are different outcomes, in the exit code and in the ``--outcome`` file. An engine that
cannot start, or crashes while measured, is never an SLA verdict and never a capacity.
Everything but the engine is real here: the model is generated, the study, the search, the
load generator and the promotion run as in a tune.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotuner.cli.main import main
from autotuner.engines import envs
from autotuner.records.outcome import JobOutcome
from autotuner.records.trial import TrialRecord
from autotuner.search.study import storage_url
from autotuner.search.trial import CRASHED, TrialResult
from autotuner.testing.standin import write_engine_python

NAME = "faults"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _sla(tmp_path: Path, python: Path | None, startup_s: float = 60, **tune: Any) -> str:
    """A small SLA on the stand-in: levels of 16 requests at 8 req/s and more, a grid over
    max_num_seqs 4 and 32 after the baseline (3 launches)."""
    data: dict[str, Any] = {
        "name": NAME,
        "model": {"synth": "tiny-llama"},
        "engine": {"kind": "vllm", "startup_timeout_s": startup_s},
        "target": "cpu",
        "workload": {
            "input_tokens": 8,
            "output_tokens": 4,
            "arrival": {"process": "poisson", "rate": 8},
            "requests": 16,
            "warmup_requests": 0,
        },
        "constraints": {"p50_ttft_ms": 2000},
        "search": {"params": {"max_num_seqs": {"values": [4, 32]}}},
        "tune": {
            "sampler": "grid",
            "max_levels": 2,
            "confirm": {"replicates": 1},
            **tune,
        },
    }
    if python is not None:
        data["engine"]["python"] = str(python)
    path = tmp_path / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _tune(tmp_path: Path, sla: str) -> tuple[int, JobOutcome]:
    out = tmp_path / "outcome.json"
    code = main(["tune", sla, "--trials-dir", str(tmp_path / "trials"), "--outcome", str(out)])
    return code, JobOutcome.read(out)


def _trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    url = storage_url(tmp_path / "trials" / NAME, None)
    return optuna.load_study(study_name=NAME, storage=url).get_trials(deepcopy=False)


# --------------------------------------------------------------------------- tune


@pytest.mark.parametrize("fault", ["garbage", "exit0", "oom", "hang"])
def test_tune_whose_every_launch_fails_to_start_is_an_engine_failure(
    tmp_path: Path, fault: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: "no measured config met the SLA", exit 1, outcome not_met (and the daemon's
    critical sla_infeasible), while bench on the same engine exits 3."""
    python = write_engine_python(tmp_path / "engine" / "python", fault=fault)
    startup_s = 3 if fault == "hang" else 60  # a hang lasts until the start time-out
    code, outcome = _tune(tmp_path, _sla(tmp_path, python, startup_s))
    err = capsys.readouterr().err
    assert (code, outcome.status, outcome.exit_code) == (3, "error", 3)
    assert "the engine failed in every launch (3 of 3)" in err
    assert "no SLA verdict" in err and "baseline (" in err
    assert not (tmp_path / "trials" / NAME / "no_promotion.json").exists()
    # Run again: still no verdict, nothing launched (the budget is spent).
    again, outcome = _tune(tmp_path, _sla(tmp_path, python, startup_s))
    assert (again, outcome.status) == (3, "error")
    assert len(_trials(tmp_path)) == 3


def test_tune_where_some_launches_measured_decides_on_them_and_lists_the_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python = write_engine_python(
        tmp_path / "engine" / "python", fault="exit", fault_if="--max-num-seqs 4"
    )
    code, outcome = _tune(tmp_path, _sla(tmp_path, python))
    out = capsys.readouterr().out
    assert (code, outcome.status) == (0, "met")  # the measured baseline and max_num_seqs 32
    assert "1 launch(es) failed and are left out of the decision (the 2 measured decide)" in out
    assert "(other): exited with status 1 during start-up" in out


def test_a_crash_in_the_middle_of_a_level_is_a_crash_not_a_miss_nor_a_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: the crashed level counted as a miss of the SLA and the capacity was interpolated
    between it and the level below (the config "held" the load it crashed under)."""
    # max_num_seqs 32 serves its first level (16 requests), then dies in its second.
    python = write_engine_python(
        tmp_path / "engine" / "python",
        fault="die-mid-level",
        fault_if="--max-num-seqs 32",
        die_after=20,
    )
    # No warm-up to steady state: the crash comes after a count of requests, which the
    # warm-up's would otherwise move into the first level.
    code, _ = _tune(tmp_path, _sla(tmp_path, python, warmup={"max_requests": 0}))
    out = capsys.readouterr().out
    assert code == 0
    crashed = [t for t in _trials(tmp_path) if TrialRecord.from_trial(t).cause == CRASHED]
    assert len(crashed) == 1
    t = crashed[0]
    record = TrialRecord.from_trial(t)
    assert t.state == TrialState.FAIL and record.status == "failed"
    assert record.capacity is None and record.max_load is None
    assert record.reason is not None and "crashed during level 2" in record.reason
    assert "exited with status 1" in record.reason
    assert record.params_or({})["max_num_seqs"] == 32
    result = TrialResult.read(tmp_path / "trials" / NAME / str(record.result_file))
    assert result.status == "failed" and result.cause == CRASHED
    assert result.capacity is None and result.found_capacity() is None
    assert result.metric("capacity") is None
    assert len(result.levels) == 1 and result.levels[0].feasible  # the level before, kept
    assert result.extra["crash"]["level"] == 2
    assert "engine crashed (exit status 1)" in out
    # The report says it crashed, and shows no capacity for it.
    assert main(["report", NAME, "--trials-dir", str(tmp_path / "trials")]) == 0
    report = capsys.readouterr().out.splitlines()
    row = next(ln for ln in report if ln.startswith(f"{t.number:>3} "))
    assert "crashed" in row and "crashed during level 2" in row


def test_a_retune_decides_on_what_it_measures_now_not_on_earlier_launches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: after a failed re-check, the re-tune's two new launches measured 0 req/s and it
    re-promoted the config of the first tune from its old numbers ("kept the baseline, no
    launch spent"), exit 0: the daemon's autotuner_sla_feasible went back to 1."""
    engine = tmp_path / "engine" / "python"
    write_engine_python(engine)
    sla = _sla(tmp_path, engine)
    first, outcome = _tune(tmp_path, sla)
    assert (first, outcome.status) == (0, "met")
    bundle = tmp_path / "trials" / NAME / "promoted" / "optimization_manifest.json"
    before = json.loads(bundle.read_text())["created"]
    # The host got slower: every request now waits 3 s for its first token (limit: 2 s).
    write_engine_python(engine, options=("--ttft-s", "3", "--itl-s", "0.001"))
    capsys.readouterr()
    out = tmp_path / "outcome.json"
    argv = ["tune", sla, "--trials-dir", str(tmp_path / "trials"), "--outcome", str(out)]
    code = main([*argv, "--extra-trials", "2", "--fresh"])  # as the daemon re-tunes
    said = capsys.readouterr().out
    outcome = JobOutcome.read(out)
    assert (code, outcome.status) == (1, "not_met")
    assert "no launch spent" not in said
    assert "the decision rests on the launches from trial 3 on" in said
    trials = _trials(tmp_path)
    fresh = trials[3:]
    assert len(fresh) == 2 and TrialRecord.from_trial(fresh[0]).baseline  # measured again
    assert all(TrialRecord.from_trial(t).capacity.low == 0 for t in fresh)  # type: ignore[union-attr]
    assert json.loads(bundle.read_text())["created"] == before  # no new promotion
    # Run again: the decision stays with the re-tune's launches.
    again, outcome = _tune(tmp_path, sla)
    assert (again, outcome.status) == (1, "not_met")


# --------------------------------------------------------------------------- bench


@pytest.mark.parametrize(
    ("fault", "code", "status"),
    [
        ("none", 0, "met"),
        ("exit", 3, "error"),
        ("die-mid-level", 3, "error"),
        # An engine that serves, but answers every request with an error, was measured: it
        # misses the SLA (its goodput is 0), a verdict like any other.
        ("http-500", 1, "not_met"),
    ],
)
def test_bench_on_the_harness(
    tmp_path: Path, fault: str, code: int, status: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash under load was "SLA not met" (exit 1); it is an engine failure (exit 3)."""
    python = write_engine_python(tmp_path / "engine" / "python", fault=fault, die_after=3)
    out = tmp_path / "outcome.json"
    sla = _sla(tmp_path, python)
    argv = ["bench", sla, "--trials-dir", str(tmp_path / "b"), "--outcome", str(out)]
    assert main(argv) == code
    outcome = JobOutcome.read(out)
    assert (outcome.status, outcome.exit_code) == (status, code)
    if fault == "die-mid-level":
        err = capsys.readouterr().err
        assert "the engine crashed while measured: it exited with status 1" in err
        assert "EngineCore encountered" in err  # the log's last lines


# --------------------------------------------------------------------------- compare-engines


def _bundle(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    manifest = {"schema_version": 2, "promoted": {"label": "trial-1", "params": {}}}
    (bundle / "optimization_manifest.json").write_text(json.dumps(manifest))
    return bundle


def _compare(tmp_path: Path, *extra: str) -> tuple[int, JobOutcome]:
    out = tmp_path / "outcome.json"
    argv = [
        "compare-engines",
        _sla(tmp_path, None),
        "--bundle",
        str(_bundle(tmp_path)),
        "--old",
        "old",
        "--new",
        "new",
        "--replicates",
        "2",
        "--work-dir",
        str(tmp_path / "work"),
        "--outcome",
        str(out),
        *extra,
    ]
    return main(argv), JobOutcome.read(out)


def test_compare_engines_with_an_old_engine_that_never_runs_is_no_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: verdict not_enough_data, exit 0 (a result the daemon records and acts on)."""
    envs.add("old", write_engine_python(tmp_path / "old" / "python", fault="exit0"))
    envs.add("new", write_engine_python(tmp_path / "new" / "python"))
    code, outcome = _compare(tmp_path)
    assert (code, outcome.status, outcome.exit_code) == (3, "error", 3)
    assert "did not run on the old engine old in any of its 2 replicates" in outcome.message
    assert not (tmp_path / "work" / "result.json").exists()
    journal = (tmp_path / "work" / "replicates.jsonl").read_text().splitlines()
    assert all(json.loads(line)["started"] for line in journal)  # a retry runs the rest again


def test_compare_engines_counts_a_crash_on_the_new_engine_as_no_measurement(
    tmp_path: Path,
) -> None:
    envs.add("old", write_engine_python(tmp_path / "old" / "python"))
    envs.add(
        "new", write_engine_python(tmp_path / "new" / "python", fault="die-mid-level", die_after=3)
    )
    code, outcome = _compare(tmp_path)
    assert (code, outcome.status) == (0, "met")
    result = json.loads((tmp_path / "work" / "result.json").read_text())
    assert result["verdict"] == "regression"
    assert result["counts"]["new_measured"] == 0 and result["counts"]["old_measured"] == 2
    assert CRASHED in result["reason"]
