"""`autotuner compare-engines SLA --bundle B --old A --new B`: the promoted config on two engine
environments, and the regression verdict.

Exit 0: verdict written; 1: regression (with --fail-on-regression); 2: bad input; 3: the
config ran on the old engine in no replicate (it did not start or crashed): no verdict;
130: interrupted (run it again to resume).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from autotuner.core.errors import BadInput, Interrupted
from autotuner.core.procs import sigterm_as_interrupt
from autotuner.engines import registry
from autotuner.search.regress import compare_engines
from autotuner.sla.spec import load_sla


def _say(msg: str) -> None:
    print(msg, flush=True)


def main_compare(
    sla_path: str,
    bundle: str,
    old: str,
    new: str,
    replicates: int,
    min_effect: float,
    work_dir: str,
    fail_on_regression: bool,
) -> int:
    adapter = registry.get(load_sla(sla_path).engine.kind)  # the engine both environments run
    previous = signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    try:
        result = compare_engines(
            sla_path,
            Path(bundle),
            old,
            new,
            adapter=adapter,
            replicates=replicates,
            min_effect=min_effect,
            work_dir=Path(work_dir),
            say=_say,
        )
    except (FileNotFoundError, json.JSONDecodeError) as exc:  # the bundle or its manifest
        raise BadInput(str(exc)) from exc
    except KeyboardInterrupt:
        raise Interrupted(
            "interrupted: engines stopped; run the same command again to resume"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 1 if fail_on_regression and result["verdict"] == "regression" else 0
