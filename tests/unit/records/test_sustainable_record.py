"""The sustainable load in the capacity record: written and read back in trial.json and the
study's attributes, absent from older files, damaged values refused, and its words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotuner.records.base import RecordError
from autotuner.records.trial import CapacityRecord, SustainableRecord, TrialFile, TrialRecord
from autotuner.search.trial import Level, TrialResult

HELD = SustainableRecord(
    value=4.3, high=4.6, target=5.0, unit="req/s", lowest=3.33, levels=3, stopped_by="budget"
)
MISSED = CapacityRecord(
    value=0.0,
    low=0.0,
    high=5.0,
    unit="req/s",
    stopped_by="infeasible_at_start",
    note="misses the SLA at poisson 5 req/s (p99_tpot_ms)",
    resolution=0.03,
    sustainable=HELD,
)


def _result(capacity: CapacityRecord) -> TrialResult:
    levels = tuple(
        Level(load, load < 4.5, {"goodput": load}, {"p99_tpot_ms": m}, {}, {}, f"level-{i}.json")
        for i, (load, m) in enumerate([(5.0, 0.12), (3.33, -0.3), (4.3, -0.02), (4.6, 0.01)])
    )
    return TrialResult({}, "stopped_early", "rate", levels, None, capacity=capacity)


def test_the_sustainable_load_round_trips_through_trial_json(tmp_path: Path) -> None:
    result = _result(MISSED)
    result.write(tmp_path / "trial.json")
    data = json.loads((tmp_path / "trial.json").read_text())
    assert data["capacity"]["sustainable"]["value"] == 4.3
    back = TrialResult.read(tmp_path / "trial.json")
    assert back == result and back.capacity is not None and back.capacity.sustainable == HELD
    # It is no capacity: the trial met nothing, its capacity stays 0.
    assert not back.feasible and back.metric("capacity") == 0.0 and back.max_load is None


def test_the_sustainable_load_round_trips_through_the_study_attributes() -> None:
    attrs = TrialRecord(capacity=MISSED).attrs()
    assert TrialRecord.from_data(attrs, "trial 0").capacity == MISSED


def test_a_file_written_before_the_field_reads_without_it(tmp_path: Path) -> None:
    result = _result(MISSED)
    result.write(tmp_path / "trial.json")
    data = json.loads((tmp_path / "trial.json").read_text())
    del data["capacity"]["sustainable"]
    (tmp_path / "trial.json").write_text(json.dumps(data))
    back = TrialFile.read(tmp_path / "trial.json")
    assert back.capacity is not None and back.capacity.sustainable is None
    assert back.capacity.model_copy(update={"sustainable": HELD}) == MISSED


@pytest.mark.parametrize(
    "bad", [{"value": -1.0}, {"value": float("inf")}, {"target": 0.0}, {"lowest": 1e300}]
)
def test_a_damaged_sustainable_load_is_a_record_error(
    tmp_path: Path, bad: dict[str, float]
) -> None:
    data = json.loads(TrialFile.model_validate(_result(MISSED).to_record()).model_dump_json())
    data["capacity"]["sustainable"].update(bad)
    path = tmp_path / "trial.json"
    path.write_text(json.dumps(data).replace("Infinity", "1e999"))
    with pytest.raises(RecordError):
        TrialFile.read(path)


def test_its_words_and_the_replicas_it_takes() -> None:
    assert HELD.describe() == "holds the SLA's limits up to 4.3 req/s; the SLA asks 5: 14% short"
    assert HELD.short == pytest.approx(0.14)
    assert HELD.replicas() == 2  # two copies at 2.5 req/s each, below the 4.3 each holds
    exact = HELD.model_copy(update={"value": 2.5})
    assert exact.replicas() == 2  # exactly half: two copies, not three
    assert HELD.model_copy(update={"value": 1.2}).replicas() == 5
    none = HELD.model_copy(update={"value": 0.0, "high": None})
    assert none.short is None and none.replicas() is None
    assert none.describe() == (
        "holds the SLA's limits at no load tried below the SLA's 5 req/s (down to 3.33 req/s)"
    )
