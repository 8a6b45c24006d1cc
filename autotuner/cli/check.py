"""`autotuner check FILE...`: validate SLA files without running anything.

Exit 0 when every file is a valid SLA, else 2 (each problem on stderr, with file and line).
A valid SLA may still get warnings (stderr, exit 0): load levels too small to show a
percentile limit met (:mod:`autotuner.measure.levels`); notes (stdout) say how levels were
sized and what a confirmation with one replicate cannot do.
"""

from __future__ import annotations

import sys

from autotuner.measure.levels import resolution_notes
from autotuner.sla.spec import Sla, SlaError, load_sla


def _report(p: str, sla: Sla) -> None:
    warnings, notes = resolution_notes(sla)
    if sla.tune.confirm.replicates < 2:
        notes.append(
            f"tune.confirm.replicates {sla.tune.confirm.replicates}: a confirmation needs at "
            "least 2 replicates to measure the spread, so none is run and no candidate is "
            "promoted over engine defaults that meet the SLA"
        )
    for line in notes:
        print(f"{p}: note: {line}")
    for line in warnings:
        print(f"{p}: warning: {line}", file=sys.stderr)


def check_main(paths: list[str]) -> int:
    if not paths:
        print("usage: autotuner check SLA_FILE...", file=sys.stderr)
        return 2
    ok = True
    for p in paths:
        try:
            sla = load_sla(p)
        except SlaError as exc:
            ok = False
            print(exc, file=sys.stderr)
        except Exception as exc:  # one file's bug must not stop the check of the others
            ok = False
            print(
                f"{p}: internal error while checking: {type(exc).__name__}: {exc}", file=sys.stderr
            )
        else:
            print(f"OK {p}")
            _report(p, sla)
    return 0 if ok else 2
