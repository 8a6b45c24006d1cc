"""`autotuner check FILE...`: validate SLA files without running anything.

Exit 0 when every file is a valid SLA, else 2 (each problem on stderr, with file and line).
"""

from __future__ import annotations

import sys

from autotuner.sla.spec import SlaError, load_sla


def check_main(paths: list[str]) -> int:
    if not paths:
        print("usage: autotuner check SLA_FILE...", file=sys.stderr)
        return 2
    ok = True
    for p in paths:
        try:
            load_sla(p)
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
    return 0 if ok else 2
