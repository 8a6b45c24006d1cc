"""The conditions each launch measured under, for `autotuner report`
(:mod:`autotuner.bundle.summary`): the warm-up before its first level (requests, seconds,
steady or ended by its bound; :mod:`autotuner.measure.steady`) and the host's load before and
during it (:mod:`autotuner.measure.hostload`). Launches measured on a busy host are named, so
the report can mark their figures.

Reads each launched trial's ``trial.json``; trials that launched nothing, or whose record
predates these fields, are left out, and so is the whole section when none has them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from autotuner.measure.hostload import describe as describe_host
from autotuner.measure.steady import describe as describe_warmup
from autotuner.records.trial import TrialRecord, launched_files


def condition_lines(
    trials: Iterable[tuple[int, TrialRecord]], study_dir: Path
) -> tuple[list[str], set[int]]:
    """The section's lines (one per trial) and the numbers of the trials measured on a busy
    host."""
    out: list[str] = []
    busy: set[int] = set()
    for number, trial in launched_files(trials, study_dir):
        said = []
        warm = trial.levels[0].warmup if trial.levels else None
        if warm:
            said.append(f"warm-up {describe_warmup(warm)}")
        host = trial.extra.get("host")
        if isinstance(host, dict) and host:
            said.append(describe_host(host))
            if host.get("busy"):
                busy.add(number)
        if said:
            out.append(f"  trial {number}: " + "; ".join(said))
    if not out:
        return [], busy
    head = "measured under (warm-up before the first level; other processes' use of the cores):"
    return ["", head, *out], busy
