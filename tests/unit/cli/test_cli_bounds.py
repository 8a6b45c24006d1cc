"""Counts given on the command line are bounded like the SLA's own (issue 27, 4): a launch
budget or a replicate count out of bounds is exit 2 before anything is read or launched."""

from __future__ import annotations

from typing import Any

import pytest
from annotated_types import Le

from autotuner.cli.main import MAX_REPLICATES, MAX_TRIALS, main
from autotuner.daemon.config import RegressionSettings
from autotuner.sla.spec import TuneSpec


def _le(field: Any) -> Any:
    return next(m.le for m in field.metadata if isinstance(m, Le))


def test_the_bounds_are_the_schemas() -> None:
    assert _le(TuneSpec.model_fields["trials"]) == MAX_TRIALS
    assert _le(RegressionSettings.model_fields["replicates"]) == MAX_REPLICATES


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (["tune", "x.yaml", "--trials", "1000000000"], "--trials: must be 1 to 10,000"),
        (["tune", "x.yaml", "--trials", "0"], "--trials: must be 1 to 10,000, got 0"),
        (["tune", "x.yaml", "--extra-trials", "10001"], "--extra-trials: must be 0 to 10,000"),
        (["tune", "x.yaml", "--trials", "many"], "--trials: not an integer: 'many'"),
        (
            [
                *("compare-engines", "x.yaml", "--bundle", "b", "--old", "a", "--new", "b"),
                *("--work-dir", "w", "--replicates", "1000000000"),
            ],
            "--replicates: must be 1 to 20",
        ),
    ],
)
def test_counts_out_of_bounds_exit_2(
    argv: list[str], phrase: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert phrase in capsys.readouterr().err
