"""The one error wrapper every command runs in: what reaches it becomes an exit code and a line.

- an :class:`~autotuner.core.errors.AutotunerError`: its ``describe()`` on stderr, exit with
  its ``exit_code`` (bad input 2, engine failed to start 3, interrupted 130, ...);
- Ctrl-C (``KeyboardInterrupt``) that no handler turned into a message: ``interrupted``, 130;
- anything else is a bug: exit 70 with one line naming the error and the file that holds the
  full traceback (``$AUTOTUNER_HOME/logs/crash-*.log``: a command's study directory is not
  known when it fails this early, the home always is). ``--debug`` prints the traceback on
  stderr instead.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from autotuner import __version__
from autotuner.core import paths
from autotuner.core.errors import AutotunerError, BadInput, InternalError, Interrupted
from autotuner.core.text import printable

MAX_LINE = 300  # characters of the error's message on the one line


def logs_dir() -> Path:
    """Where tracebacks of internal errors go."""
    return paths.home() / "logs"


# Told how a command ended: its exit code and the line printed about an error (None on a
# plain return). The ``--outcome`` file is written through it (autotuner.cli.outcome).
Report = Callable[[int, str | None], None]


def run(
    command: Callable[[], int],
    argv: Sequence[str],
    *,
    debug: bool,
    report: Report | None = None,
) -> int:
    """Run ``command`` (a handler) and turn what escapes it into an exit code; ``report``,
    if given, is told the code and the error line before it is returned."""
    code, line = _ending(command, argv, debug)
    if report is not None:
        report(code, line)
    return code


def _ending(command: Callable[[], int], argv: Sequence[str], debug: bool) -> tuple[int, str | None]:
    try:
        return command(), None
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("interrupted", file=sys.stderr)
        return Interrupted.exit_code, "interrupted"
    except InternalError as exc:
        return _internal(exc, argv, debug)
    except AutotunerError as exc:
        if debug:
            traceback.print_exc()
        said = printable(exc.describe(), lines=True)  # may quote a file, a log, a name
        print(said, file=sys.stderr)
        return exc.exit_code, said
    except Exception as exc:
        known = _foreign_bad_input(exc)
        if known is not None:
            if debug:
                traceback.print_exc()
            said = printable(known.describe(), lines=True)
            print(said, file=sys.stderr)
            return known.exit_code, said
        return _internal(exc, argv, debug)


def _foreign_bad_input(exc: Exception) -> AutotunerError | None:
    """Errors that keep a builtin root yet mean bad input. Hook: a module whose errors can't
    derive from :mod:`autotuner.core.errors` is listed here."""
    from autotuner.records import RecordError  # a record file this autotuner can't read

    if isinstance(exc, RecordError):
        return BadInput(str(exc))
    return None


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, the message shortened to ``MAX_LINE`` characters."""
    text = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = printable(text)
    if len(text) > MAX_LINE:
        text = text[: MAX_LINE - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _internal(exc: BaseException, argv: Sequence[str], debug: bool) -> tuple[int, str]:
    code = InternalError.exit_code
    if debug:
        traceback.print_exception(exc)
        line = f"internal error: {one_line(exc)}"
        print(line, file=sys.stderr)
        return code, line
    where = write_traceback(exc, argv)
    if where is None:  # nowhere to write it: the traceback is worth more than one line
        traceback.print_exception(exc)
        line = f"internal error: {one_line(exc)} (no log file could be written)"
        print(line, file=sys.stderr)
        return code, line
    line = f"internal error: {one_line(exc)} (traceback: {where}; --debug prints it)"
    print(line, file=sys.stderr)
    return code, line


def write_traceback(exc: BaseException, argv: Sequence[str]) -> Path | None:
    """Write the command line, versions and traceback of ``exc`` to a new file; its path, or
    None when neither the logs directory nor the temp directory takes it."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"crash-{stamp}-{os.getpid()}.log"
    text = (
        f"autotuner {__version__}, Python {platform.python_version()}, {stamp}\n"
        f"command: autotuner {' '.join(argv)}\n\n" + "".join(traceback.format_exception(exc))
    )
    for path in (logs_dir() / name, Path(tempfile.gettempdir()) / f"autotuner-{name}"):
        try:
            paths.atomic_write_text(path, text)
        except OSError:
            continue
        return path
    return None
