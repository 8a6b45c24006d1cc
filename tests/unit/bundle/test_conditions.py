"""`autotuner report`'s conditions section (issue 28): each launch's warm-up and the host's
load, and the trials measured on a busy host named so their figures can be marked."""

from __future__ import annotations

from pathlib import Path

from autotuner.bundle.conditions import condition_lines
from autotuner.records.trial import LevelRecord, TrialFile, TrialRecord

WARM = {"requests": 50, "seconds": 6.2, "steady": True, "stopped_by": "steady",
        "load": "poisson 8 req/s", "failed": 0, "windows": []}  # fmt: skip


def _trial(tmp: Path, name: str, busy: bool, warmup: dict[str, object] | None) -> TrialRecord:
    level = LevelRecord(
        load=8.0, feasible=True, metrics={}, margins={}, errors={}, engine={},
        result_file="level-0.json", warmup=warmup,
    )  # fmt: skip
    host = {
        "cores": 2,
        "busy": busy,
        "before": {"load1": 3.1, "others_share": 0.6 if busy else 0.02},
        "during": {"load1_max": 3.4, "others_share_mean": 0.4 if busy else 0.01},
    }
    path = tmp / name / "trial.json"
    path.parent.mkdir(parents=True)
    TrialFile(
        params={}, status="complete", load_kind="rate", levels=[level], extra={"host": host}
    ).write(path)
    return TrialRecord(result_file=f"{name}/trial.json")


def test_warmup_and_host_load_per_trial_and_the_busy_ones_named(tmp_path: Path) -> None:
    trials = [
        (0, _trial(tmp_path, "t0", busy=False, warmup=WARM)),
        (1, _trial(tmp_path, "t1", busy=True, warmup={**WARM, "steady": False,
                                                       "stopped_by": "max_requests"})),
        (2, TrialRecord()),  # launched nothing
    ]  # fmt: skip
    lines, busy = condition_lines(trials, tmp_path)
    assert busy == {1}
    text = "\n".join(lines)
    assert "trial 0: warm-up 50 requests, 6.2 s at poisson 8 req/s: steady; quiet host" in text
    assert (
        "trial 1: warm-up 50 requests, 6.2 s at poisson 8 req/s: not steady (the request " in text
    )
    assert "busy host: other processes used 60% before the launch, 40% during it of 2 cores" in text
    assert "trial 2" not in text


def test_records_without_conditions_leave_the_section_out(tmp_path: Path) -> None:
    assert condition_lines([(0, TrialRecord())], tmp_path) == ([], set())
