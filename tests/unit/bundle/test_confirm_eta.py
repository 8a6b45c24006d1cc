"""Confirmation says how long it has left, from the launches it measured so far (issue 29)."""

from __future__ import annotations

import re
from pathlib import Path

from autotuner.bundle.promote import promote
from tests.unit.bundle.test_promote import DEFAULT_SEQS, Scenario, _study


def test_each_confirmation_launch_after_the_first_has_an_eta(tmp_path: Path) -> None:
    sc = Scenario(confirm={32: [30.0, 31.0, 29.0], DEFAULT_SEQS: [15.0, 15.5, 14.5]})
    ctx = _study(tmp_path, sc)
    said: list[str] = []
    promote(ctx, sc.confirm_run, said.append)
    launches = [s for s in said if s.startswith("confirmation ") and "replicate" in s]
    assert len(launches) == 6
    assert "ETA" not in launches[0]  # nothing measured yet
    assert re.search(r"; 5 launches left with this one, ETA \d+ min$", launches[1]), launches
    assert re.search(r"; 1 launch left with this one, ETA \d+ min$", launches[5]), launches
