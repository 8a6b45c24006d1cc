"""Validating a submitted SLA before anything is written: its size, its content, the paths
it names (confined), its schedule and the engine environment it runs on. Runs off the event
loop (the API's and the spool's validation threads); the daemon registers what passes
(``Daemon.register``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from annotated_types import Le

from autotuner.core import confined
from autotuner.daemon import confine, jobs
from autotuner.daemon.config import DaemonConfig, check_cron
from autotuner.daemon.errors import SubmitError
from autotuner.engines import envs
from autotuner.sla.spec import Sla, SlaError, TuneSpec, parse_sla

# Bounds of the numbers a submission carries (checked before anything is written).
MAX_PRIORITY = 1_000_000


def _schema_max_trials() -> int:
    """A re-tune adds at most what an SLA's ``tune.trials`` may ask for."""
    for m in TuneSpec.model_fields["trials"].metadata:
        if isinstance(m, Le) and isinstance(m.le, int):
            return m.le
    raise AssertionError("TuneSpec.trials has no upper bound")


MAX_EXTRA_TRIALS = _schema_max_trials()


@dataclass(frozen=True)
class Submission:
    """A submission validated without touching the store (see :func:`prepare`)."""

    sla: Sla
    text: str
    source: str
    engine: str
    pinned: str
    schedule: str | None


def check_priority(priority: int) -> None:
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise SubmitError(
            400, [f"priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}, got {priority}"]
        )


def check_extra_trials(extra: int) -> None:
    if not 0 <= extra <= MAX_EXTRA_TRIALS:
        raise SubmitError(400, [f"trials must be between 0 and {MAX_EXTRA_TRIALS}, got {extra}"])


def prepare(
    config: DaemonConfig,
    text: str,
    *,
    source: str,
    base_dir: Path | None,
    schedule: str | None = None,
) -> Submission:
    """Validate a submission without touching the store, so the API and the spool run it
    on a thread of its own (a slow parse must not stall the event loop). Raises
    SubmitError: 413 over the size cap, 400 for a bad SLA, path, storage, schedule or
    engine.

    ``base_dir`` is where relative paths resolve (the spool); None for HTTP, where paths
    must be absolute. Either way the SLA came from outside: ``tune.storage`` and the
    files it names are confined (:mod:`autotuner.daemon.confine`)."""
    root = config.state_dir
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > config.max_request_bytes:
        raise SubmitError(
            413,
            [
                f"{source}: {size} bytes is over the daemon's limit of "
                f"{config.max_request_bytes} bytes (max_request_bytes)"
            ],
        )
    try:
        sla = parse_sla(text, source, base_dir)
    except SlaError as exc:
        raise SubmitError(400, [p.render(source) for p in exc.problems]) from None
    bad = _relative_paths(sla) if base_dir is None else []
    bad = bad or confine.problems(sla, root, config.allowed_paths)
    if bad:
        raise SubmitError(400, [f"{source}: {b}" for b in bad])
    if base_dir is not None:  # the files are confined: now they may be read
        roots = confine.path_roots(root, config.allowed_paths)
        try:  # and again as they are opened: a link may have been swapped in since
            with confined.confined_to(roots):
                sla = parse_sla(text, source, base_dir, check_files=True)
        except SlaError as exc:
            raise SubmitError(400, [p.render(source) for p in exc.problems]) from None
    if schedule is not None:
        try:
            check_cron(schedule)
        except ValueError as exc:
            raise SubmitError(400, [f"schedule: {exc}"]) from None
    engine = _engine_for(sla, source)
    return Submission(sla, text, source, engine, jobs.pinned_yaml(sla, engine), schedule)


def _engine_for(sla: Sla, source: str) -> str:
    """The registered engine environment the SLA runs on (its name)."""
    registered = envs.list_envs()
    if sla.engine.name:
        if not any(e.name == sla.engine.name for e in registered):
            names = ", ".join(e.name for e in registered) or "none"
            raise SubmitError(
                400,
                [
                    f"{source}: engine.name: no engine environment {sla.engine.name!r} "
                    f"(registered: {names}; see `autotuner engine list`)"
                ],
            )
        return sla.engine.name
    if sla.engine.python:
        want = Path(sla.engine.python).expanduser()
        for e in registered:
            if e.python == want:
                return e.name
        raise SubmitError(
            400,
            [
                f"{source}: engine.python: the daemon runs registered engines only; register "
                f"it with `autotuner engine add NAME --python {want}` and name it in the SLA"
            ],
        )
    of_kind = [e for e in registered if e.kind == sla.engine.kind]
    if len(of_kind) == 1:
        return of_kind[0].name
    names = ", ".join(e.name for e in of_kind) or "none registered"
    raise SubmitError(
        400, [f"{source}: engine: name the engine environment to use (engine.name: {names})"]
    )


def _relative_paths(sla: Sla) -> list[str]:
    bad = []
    if sla.model.path is not None and not Path(sla.model.path).expanduser().is_absolute():
        bad.append("model.path: must be absolute in a submission over HTTP")
    if sla.workload.dataset is not None and not Path(sla.workload.dataset).is_absolute():
        bad.append("workload.dataset: must be absolute in a submission over HTTP")
    if sla.workload.trace is not None and not Path(sla.workload.trace).is_absolute():
        bad.append("workload.trace: must be absolute in a submission over HTTP")
    return bad
