"""The same traffic in several launches: how far apart launches are, and whether a launch's
first level is slower than its later ones.

Reads the run folders of ``benchmarks/warmup.py`` (``requests.csv`` and ``result.json``: one
fresh engine each, levels sent one after the other, no warm-up requests, the same seed, so
every launch given the same ``--levels`` receives the same arrival schedule and prompts).
Launches are grouped into configs by their engine parameters. It prints:

* per launch: the engine's start, and per level the mean and p99 TPOT and p99 TTFT (ms, the
  tuner's percentile, over the level's completed requests), and the ratio of mean TPOT of the
  launch's first level to its last level at the same rate (same schedule, later on the same
  engine): above 1 when a fresh engine is slower than it later is;
* per config and level: mean TPOT over the launches (mean, spread as a standard deviation in
  percent of the mean, range) and the range of p99 TPOT: the launch-to-launch spread on
  identical traffic;
* per config other than the first, per level: its mean TPOT over the first config's.

``--requests A:B`` keeps each level's requests A to B-1 in send order: ``150:450`` reads a
level as a tuner's level after a warm-up of 150 requests at the same rate (the race's view).

Run on the H200 launches (docs/benchmarks/h200-llama3-8b-interactive.md, "Launch-to-launch
spread")::

    python3 benchmarks/launch_spread.py /tmp/spread/d1 /tmp/spread/c1 /tmp/spread/d2 ...

Exit status 0, or 2 on a folder it cannot read.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Level:
    rate: float
    tpot_ms: list[float]
    ttft_ms: list[float]
    errors: int

    @property
    def mean_tpot(self) -> float:
        return float(np.mean(self.tpot_ms)) if self.tpot_ms else float("nan")

    def p99(self, values: list[float]) -> float:
        return float(np.percentile(values, 99)) if values else float("nan")


@dataclass(frozen=True)
class Launch:
    name: str
    config: str
    start_s: float | None
    levels: list[Level]

    def first_over_last(self) -> float | None:
        """Mean TPOT of the first level over the last level at the same rate, if any."""
        first = self.levels[0] if self.levels else None
        later = [lv for lv in self.levels[1:] if first is not None and lv.rate == first.rate]
        if first is None or not later or not later[-1].mean_tpot:
            return None
        return first.mean_tpot / later[-1].mean_tpot


def _num(raw: str | None) -> float | None:
    try:
        value = float(raw or "")
    except ValueError:
        return None
    return value if np.isfinite(value) else None


def read_launch(folder: Path, part: slice = slice(None)) -> Launch:
    """One warmup.py run folder, each level cut to ``part`` of its requests in send order;
    ValueError when it cannot be read."""
    try:
        meta = json.loads((folder / "result.json").read_text(encoding="utf-8"))
        with (folder / "requests.csv").open(encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, ValueError, csv.Error) as exc:  # ValueError: bad JSON or not UTF-8
        raise ValueError(f"{folder}: {exc}") from exc
    if not isinstance(meta, dict):
        raise ValueError(f"{folder}/result.json: not an object")
    params = meta.get("params") if isinstance(meta.get("params"), dict) else {}
    config = json.dumps(params, sort_keys=True)
    by_level: dict[int, list[dict[str, str]]] = {}
    for row in rows:
        try:
            by_level.setdefault(int(row["level"]), []).append(row)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{folder}/requests.csv: bad row {row!r}") from exc
    levels = []
    for number in sorted(by_level):
        level_rows = sorted(by_level[number], key=lambda r: _num(r.get("sent_s", "")) or 0.0)
        level_rows = level_rows[part]
        if not level_rows:
            raise ValueError(
                f"{folder}: level {number} has no requests in {part.start}:{part.stop}"
            )
        ok = [r for r in level_rows if not r.get("error")]
        levels.append(
            Level(
                rate=_num(level_rows[0].get("rate", "")) or 0.0,
                tpot_ms=[v for r in ok if (v := _num(r.get("tpot_ms", ""))) is not None],
                ttft_ms=[v for r in ok if (v := _num(r.get("ttft_ms", ""))) is not None],
                errors=len(level_rows) - len(ok),
            )
        )
    start = meta.get("startup_s")
    start_s = float(start) if isinstance(start, int | float) else None
    return Launch(folder.name, config, start_s, levels)


def _pct_sd(values: list[float]) -> float:
    if len(values) < 2:
        return float("nan")
    return 100 * statistics.stdev(values) / statistics.mean(values)


def render(launches: Sequence[Launch]) -> str:
    configs = list(dict.fromkeys(launch.config for launch in launches))
    label = {c: chr(ord("A") + i) for i, c in enumerate(configs)}
    out = ["configs: " + "; ".join(f"{label[c]} = {c}" for c in configs), ""]
    out.append("launch  config  start s  level: mean/p99 TPOT ms, p99 TTFT ms   first/last")
    for launch in launches:
        levels = "  ".join(
            f"{lv.rate:g}: {lv.mean_tpot:.2f}/{lv.p99(lv.tpot_ms):.2f}, {lv.p99(lv.ttft_ms):.0f}"
            + (f" ({lv.errors} err)" if lv.errors else "")
            for lv in launch.levels
        )
        ratio = launch.first_over_last()
        start = "-" if launch.start_s is None else f"{launch.start_s:.0f}"
        out.append(
            f"{launch.name:7} {label[launch.config]:7} {start:>7}  {levels}   "
            + ("-" if ratio is None else f"{ratio:.3f}")
        )
    ratios = [r for launch in launches if (r := launch.first_over_last()) is not None]
    if ratios:
        out.append(
            f"first/last, all launches: mean {statistics.mean(ratios):.3f}, "
            f"range {min(ratios):.3f}-{max(ratios):.3f} ({len(ratios)} launches)"
        )
    out.append("")
    out.append("config  level  launches  mean TPOT: mean  sd %   range        p99 TPOT range")
    means: dict[tuple[str, int], float] = {}
    for c in configs:
        group = [launch for launch in launches if launch.config == c]
        for i in range(min(len(launch.levels) for launch in group)):
            m = [launch.levels[i].mean_tpot for launch in group]
            p = [launch.levels[i].p99(launch.levels[i].tpot_ms) for launch in group]
            means[(c, i)] = statistics.mean(m)
            out.append(
                f"{label[c]:7} {i} @{group[0].levels[i].rate:<5g} {len(group):5}     "
                f"{statistics.mean(m):6.2f} {_pct_sd(m):5.1f}  {min(m):.2f}-{max(m):.2f}"
                f"   {min(p):.2f}-{max(p):.2f}"
            )
    for c in configs[1:]:
        pairs = [
            f"level {i}: {means[(c, i)] / base:.3f}"
            for i in range(len(launches[0].levels))
            if (c, i) in means and (base := means.get((configs[0], i), 0.0)) > 0
        ]
        out.append(f"{label[c]} / {label[configs[0]]} mean TPOT: " + ", ".join(pairs))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="warmup.py run folders")
    p.add_argument("--requests", default=":", metavar="A:B", help="each level's requests A..B-1")
    args = p.parse_args(argv)
    try:
        start, _, stop = args.requests.partition(":")
        part = slice(int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        print(f"error: --requests {args.requests!r}: expected A:B (whole numbers)", file=sys.stderr)
        return 2
    try:
        launches = [read_launch(folder, part) for folder in args.folders]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(launches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
