"""Replay a study's measured levels through the capacity search: how many levels it needs.

No engine runs. For each trial of a study tarball (as the GPU runs leave them under
docs/benchmarks/), the measured per-constraint margins at each load become a response curve
(piecewise linear between the measured loads, held flat outside them); the capacity search
(autotuner.measure.capacity) is then driven by that curve, once with the search margin taken
over every constraint (what the tuner did before 7fc5cc6: a met memory limit counted) and once
over the constraints the load moves (what it does now). Printed per trial: the levels each
needed and the bracket it ended with. Point margins stand in for the confidence-bound margins
the tuner interpolates, so the numbers show the search's behaviour, not a re-measurement.

    python3 benchmarks/capacity_replay.py \\
        docs/benchmarks/h200-llama3-8b-capacity/equal-memory/llama3-8b-h200-equal-memory.tar.gz

(run from the repository root: ``python3 -m benchmarks.capacity_replay ...`` also works)
"""

from __future__ import annotations

import argparse
import bisect
import json
import tarfile
from collections.abc import Callable, Sequence
from typing import Any

from autotuner.measure.capacity import CapacitySearch
from autotuner.measure.levels import LOAD_INDEPENDENT

MEMORY_KEYS = {"max_gpu_memory_gib"}  # constraint keys whose metric is in LOAD_INDEPENDENT
ZERO_LIMIT = {"max_error_rate"}  # the studies replayed here limit it to 0


def curve(levels: Sequence[dict[str, Any]], keys: set[str]) -> Callable[[float], float]:
    """The largest margin over ``keys`` at a load, interpolated between measured loads."""
    points: list[tuple[float, float]] = sorted(
        (float(lv["load"]), max(float(lv["margins"][k]) for k in keys)) for lv in levels
    )
    loads = [p[0] for p in points]

    def at(rate: float) -> float:
        i = bisect.bisect_left(loads, rate)
        if i == 0:
            return points[0][1]
        if i == len(points):
            return points[-1][1]
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        return y0 + (y1 - y0) * (rate - x0) / (x1 - x0)

    return at


def replay(margin: Callable[[float], float], start: float, max_levels: int) -> CapacitySearch:
    search = CapacitySearch(start, max_levels=max_levels)
    while (rate := search.next_rate()) is not None:
        m = margin(rate)
        search.record(rate, "meets" if m <= 0 else "misses", m)
    return search


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tarball")
    ap.add_argument("--max-levels", type=int, default=6)
    args = ap.parse_args()
    assert "peak_memory_gib" in LOAD_INDEPENDENT
    with tarfile.open(args.tarball) as tar:
        for name in sorted(n for n in tar.getnames() if n.endswith("/trial.json")):
            f = tar.extractfile(name)
            assert f is not None
            trial = json.load(f)
            levels = [lv for lv in trial.get("levels", []) if lv.get("margins")]
            if len(levels) < 2:
                continue
            # A met error limit of 0 never counted (its margin is 0 whenever met).
            keys = {
                k for k, v in levels[0]["margins"].items() if v is not None and k not in ZERO_LIMIT
            }
            moved = {k for k in keys if k not in MEMORY_KEYS}
            start = levels[0]["load"]
            tuned = {k: v for k, v in trial["params"].items() if k != "load_format"}
            print(f"{name.split('/')[-2]} {json.dumps(tuned)}")
            for label, use in (("memory counted", keys), ("load-dependent", moved)):
                s = replay(curve(levels, use), start, args.max_levels)
                cap = s.result()
                rates = ", ".join(f"{lv.rate:.4g}" for lv in s.levels)
                if cap.high is None or cap.low <= 0:
                    edges = f"[{cap.low:.4g}, -]"
                else:
                    edges = f"[{cap.low:.4g}, {cap.high:.4g}] {(cap.high - cap.low) / cap.low:.1%}"
                print(
                    f"  {label:15} {len(s.levels)} levels ({rates}) -> {cap.value:.4g} "
                    f"{edges} wide, {cap.stopped_by}"
                )


if __name__ == "__main__":
    main()
