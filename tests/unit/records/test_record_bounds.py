"""A tampered record is bad input, never an internal error (issue 27, section 3): a capacity of
1e300 in a confirmation replicate's ``trial.json`` made ``math.expm1`` overflow in the
capacity comparison (search/capacity_compare.py) and ``tune`` exit 70."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autotuner.bundle.promote import promote
from autotuner.records.base import RecordError
from autotuner.records.manifest import Manifest
from autotuner.records.trial import MAX_LOAD, TrialFile
from autotuner.search.capacity_compare import compare_capacity
from tests.unit.bundle.test_promote import DEFAULT_SEQS, Scenario, _Cut, _study, _writing


def _trial_file(tmp_path: Path, capacity: float, load: float = 1.0) -> Path:
    data = {
        "schema_version": 2,
        "params": {},
        "status": "complete",
        "load_kind": "rate",
        "levels": [
            {
                "load": load,
                "feasible": True,
                "metrics": {},
                "margins": {},
                "errors": {},
                "engine": {},
                "result_file": "level-0.json",
            }
        ],
        "best": 0,
        "capacity": {
            "value": capacity,
            "low": 1.0,
            "high": None,
            "unit": "req/s",
            "stopped_by": "budget",
        },
    }
    path = tmp_path / "trial.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("capacity", [1e300, float("inf"), float("nan"), -1.0])
def test_a_capacity_no_engine_measures_is_a_record_error(tmp_path: Path, capacity: float) -> None:
    with pytest.raises(RecordError, match=r"trial\.json: not a valid trial file: capacity\.value"):
        TrialFile.read(_trial_file(tmp_path, capacity))
    assert TrialFile.read(_trial_file(tmp_path, 4.0)).capacity is not None


def test_a_level_load_beyond_the_bound_is_a_record_error(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match=r"levels\.0\.load"):
        TrialFile.read(_trial_file(tmp_path, 4.0, load=MAX_LOAD * 10))


def test_a_manifest_replicate_with_an_absurd_capacity_is_a_record_error(tmp_path: Path) -> None:
    path = tmp_path / "optimization_manifest.json"
    replicate = {
        "config": "trial-4",
        "replicate": 0,
        "goodput": 1.0,
        "feasible": True,
        "metrics": {},
        "run_dir": "confirm/trial-4-r0",
        "capacity": 1e300,
    }
    path.write_text(json.dumps({"measurements": {"confirmation": {"replicates": [replicate]}}}))
    with pytest.raises(RecordError, match=r"replicates\.0\.capacity"):
        Manifest.read(path)


def test_the_capacity_comparison_never_overflows() -> None:
    # Finite capacities whose log-ratios are huge (what a tampered record gave): a verdict,
    # not an OverflowError.
    result = compare_capacity([1.0, 1.0], [1e300, 1.0])
    assert result.pairs == 2 and result.verdict == "not_enough_data"
    assert result.high is not None and math.isfinite(result.high)
    assert compare_capacity([1e-300, 1e-300], [1e12, 1e12]).verdict == "better"


def test_a_tampered_confirmation_replicate_is_measured_again(tmp_path: Path) -> None:
    sc = Scenario(confirm={32: [30.0] * 9, DEFAULT_SEQS: [15.0] * 9})
    ctx = _study(tmp_path, sc)
    with pytest.raises(_Cut):
        promote(ctx, _writing(sc, cut_at=3), lambda s: None)
    replicate = ctx.study_dir / "confirm" / "trial-4-r0" / "trial.json"
    data = json.loads(replicate.read_text())
    data["capacity"]["value"] = 1e300  # still a trial file, with a capacity no engine has
    replicate.write_text(json.dumps(data))
    manifest = promote(ctx, _writing(sc), lambda s: None)
    runs = [d.name for _, d, _ in sc.confirm_calls[2:]]
    assert runs[0] == "trial-4-r0"  # not taken as measured: launched again
    decision = manifest["decision"]
    assert decision["promoted"] == "trial-4" and decision["verdict"] == "better"
