"""The same level measured in different launches: how far apart, and where within the level.

Reads level files (``level-N.json`` of a trial directory, as a study tarball keeps them) and
prints, per file: the requests, errors, the offered rate (sends over the send span), mean and
p99 TPOT, mean TTFT, and the mean and p99 TPOT of each third of the level in send order. The
first third holds the ramp (the engine filling up from empty), the last the drain (sending
stopped, fewer requests in flight): a cold engine shows as a first third slower than the last,
a slower machine or launch as every third slower.

Files of one arrival schedule (same seed, rate and level size) are compared request by
request with the first file given: ``same workload`` counts the requests whose prompt length
matches and whose send time is within 10 ms; on identical work the ratio of mean TPOT is the
launch's own difference, without the schedule's noise.

Run on the H200 interactive studies (docs/benchmarks/h200-llama3-8b-interactive.md)::

    python3 benchmarks/level_compare.py \\
        A=first/trial-000/level-0.json B=fresh/trial-000/level-0.json

Each argument is ``PATH`` or ``LABEL=PATH``. Exit status 0, or 2 on a file it cannot read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autotuner.measure.loadgen import LoadResult, RequestRecord

SAME_SEND_S = 0.01


@dataclass(frozen=True)
class Level:
    label: str
    records: list[RequestRecord]  # in send order

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.ok]


def read(arg: str) -> Level:
    label, _, path = arg.rpartition("=")
    p = Path(path)
    data = json.loads(p.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{p}: not a level file")
    result = LoadResult.from_dict(data)
    return Level(label or p.as_posix(), sorted(result.records, key=lambda r: r.sent_s))


def _tpot_ms(records: Sequence[RequestRecord]) -> np.ndarray:
    return np.asarray([t * 1000 for r in records if r.ok and (t := r.tpot_s) is not None])


def _stats(values: np.ndarray) -> str:
    if not values.size:
        return "-"
    return f"{values.mean():.2f}/{np.percentile(values, 99):.2f}"


def row(level: Level, first: Level) -> str:
    recs = level.records
    sends = [r.sent_s for r in recs]
    span = max(sends) - min(sends) if len(sends) > 1 else 0.0
    rate = (len(recs) - 1) / span if span > 0 else float("nan")
    tpot = _tpot_ms(recs)
    ttft = np.asarray([r.ttft_s * 1000 for r in level.ok if r.ttft_s is not None])
    n = len(recs)
    thirds = [recs[: n // 3], recs[n // 3 : 2 * n // 3], recs[2 * n // 3 :]]
    same = sum(
        1
        for a, b in zip(recs, first.records, strict=False)
        if a.prompt_tokens == b.prompt_tokens and abs(a.sent_s - b.sent_s) <= SAME_SEND_S
    )
    ratio = tpot.mean() / _tpot_ms(first.records).mean() if tpot.size else float("nan")
    return (
        f"{level.label:<28} {n:>5} {n - len(level.ok):>4} {rate:>7.2f} {_stats(tpot):>13} "
        f"{(ttft.mean() if ttft.size else float('nan')):>8.1f} "
        + " ".join(f"{_stats(_tpot_ms(t)):>13}" for t in thirds)
        + f" {same:>5}/{min(n, len(first.records))} {ratio:>6.3f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="level files, PATH or LABEL=PATH")
    args = ap.parse_args(argv)
    try:
        levels = [read(a) for a in args.files]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"level_compare: {e}", file=sys.stderr)
        return 2
    print(
        f"{'level':<28} {'reqs':>5} {'err':>4} {'req/s':>7} {'TPOT mean/p99':>13} "
        f"{'TTFT ms':>8} {'1st third':>13} {'2nd third':>13} {'3rd third':>13} "
        f"{'same workload':>9} {'TPOT x':>6}"
    )
    for level in levels:
        print(row(level, levels[0]))
    print("TPOT in ms, mean/p99; thirds in send order; 'TPOT x': mean TPOT over the first file's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
