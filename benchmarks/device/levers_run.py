"""The loop of levers.sh: each config of CONFIGS measured by `autotuner bench`, one after another.

    python3 benchmarks/device/levers_run.py SLA OUT_DIR CONFIGS

CONFIGS holds one config a line: a name (letters, digits, '-', '_', '.') then the `--set`
words for `bench` ("defaults" with none); '#' starts a comment. A config already measured
(OUT_DIR/NAME.json exists) is skipped, so a run resumes. After each config, one line with its
p99 TPOT, p99 TTFT, mean TPOT and the SLA's verdict goes to standard output.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_METRICS = ("p99_tpot_ms", "mean_tpot_ms", "p99_itl_ms", "p99_ttft_ms", "p50_ttft_ms")


def configs_of(path: Path) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if not _NAME.fullmatch(words[0]):
            raise SystemExit(f"{path}: bad config name {words[0]!r}")
        out.append((words[0], words[1:]))
    return out


def summary(name: str, result: Path) -> str:
    try:
        data = json.loads(result.read_text())
    except (OSError, ValueError) as e:
        return f"{name}: no result ({e})"
    metrics = data.get("metrics") or {}
    shown = " ".join(
        f"{m} {metrics[m]:.1f}" for m in _METRICS if isinstance(metrics.get(m), (int, float))
    )
    verdict = "meets" if data.get("feasible") else "misses"
    return f"{name}: {shown} failed {data.get('failed')}/{data.get('requests')} -> {verdict}"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    sla, out, configs = Path(argv[0]), Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for name, words in configs_of(configs):
        result = out / f"{name}.json"
        if result.exists():
            print(summary(name, result), "(measured before)", flush=True)
            continue
        cmd = [sys.executable, "-m", "autotuner", "bench", str(sla), *words]
        cmd += ["-o", str(out / f"{name}.part"), "--trials-dir", str(out / "trials")]
        start = time.monotonic()
        with (out / f"{name}.log").open("w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        took = time.monotonic() - start
        part = out / f"{name}.part"
        if part.exists():
            part.rename(result)
        print(f"{summary(name, result)} (exit {rc}, {took:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
