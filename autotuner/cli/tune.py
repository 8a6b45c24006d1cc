"""`autotuner tune SLA`: run (or resume) the study, confirm and promote.

Exit 0: a config that meets the SLA is promoted; 1: none confirmed to meet it (the bundle may
still hold the baseline and its fallbacks); 2: bad input, or another tuner holds the study;
3: the engine failed in every launch (did not start, or crashed while measured): nothing was
measured, so there is no SLA verdict; 130: interrupted (run the same command again to
resume). A finished study exits as its first run did, with nothing launched (``--reconfirm``
confirms again).
"""

from __future__ import annotations

import signal
from pathlib import Path

import optuna

from autotuner.core.errors import BadInput, Interrupted
from autotuner.core.procs import sigterm_as_interrupt
from autotuner.pipeline.tune import tune
from autotuner.sla.spec import Sla, load_sla


def _read_replay(sla: Sla) -> None:
    """A dataset or trace is read and fitted to the model before anything is launched: a
    file with no usable prompt is bad input (exit 2), not a failed trial."""
    if sla.workload.dataset is None and sla.workload.trace is None:
        return
    from autotuner.engines import registry
    from autotuner.measure.bench import build_plan
    from autotuner.measure.launch import resolve_model

    roles = registry.get(sla.engine.kind).roles  # its context length bounds the requests
    try:
        plan = build_plan(sla, resolve_model(sla), roles=roles)
    except (FileNotFoundError, ValueError) as exc:
        raise BadInput(str(exc)) from exc
    if plan.factory.replay is not None:
        print(plan.factory.replay.note())


def main_tune(
    sla_path: str,
    trials_dir: str,
    trials: int | None,
    extra_trials: int = 0,
    executor: str = "local",
    address: str | None = None,
    reconfirm: bool = False,
    fresh: bool = False,
) -> int:
    if fresh and extra_trials < 1:
        raise BadInput("--fresh is for a re-tune: give it with --extra-trials N")
    sla = load_sla(sla_path)
    _read_replay(sla)
    previous = signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        promotion = tune(
            sla,
            trials_dir=Path(trials_dir),
            budget_trials=trials,
            extra_trials=extra_trials,
            executor=executor,
            address=address,
            reconfirm=reconfirm,
            fresh=fresh,
        )
    except FileNotFoundError as exc:  # the SLA's model or dataset went missing
        raise BadInput(str(exc)) from exc
    except KeyboardInterrupt:
        raise Interrupted(
            "interrupted: engines stopped; run the same command again to resume"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if promotion is None:
        return 1
    bundle = Path(trials_dir) / sla.name / "promoted"
    print(f"bundle: {bundle}")
    return 0 if promotion.meets_sla else 1
