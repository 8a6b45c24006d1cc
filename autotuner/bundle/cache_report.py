"""The prefix cache per load level, for `autotuner report` (:mod:`autotuner.bundle.summary`).

Reads each launched trial's ``trial.json``; trials whose engine reported no cache counters
(or that launched nothing) are left out, and so is the whole section when none did.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from autotuner.measure.cache import cached_share
from autotuner.records.trial import TrialRecord, launched_files


def cache_lines(trials: Iterable[tuple[int, TrialRecord]], study_dir: Path) -> list[str]:
    """One line per trial: each level's share of prompt tokens served from the prefix cache,
    with the hit rate (``82% (hit 85%)``), in the order the levels ran."""
    out: list[str] = []
    for number, trial in launched_files(trials, study_dir):
        cells = []
        for level in trial.levels:
            share = level.engine.get("prompt_cached_share", cached_share(level.engine))
            rate = level.engine.get("prefix_cache_hit_rate")
            if share is None and rate is None:
                continue
            text = "-" if share is None else f"{share:.0%}"
            cells.append(text + ("" if rate is None else f" (hit {rate:.0%})"))
        if cells:
            out.append(f"  trial {number}: " + ", ".join(cells))
    if not out:
        return []
    return ["", "prefix cache per level (prompt tokens served from the cache, hit rate):", *out]
