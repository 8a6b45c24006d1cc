"""Shell text for deployment artifacts, whatever the engine: argv grouped a flag per line,
quoted so that the text runs exactly that argv, and wrapped in a bash script.

The engine-specific renderers (serve command, container, Kubernetes) are the engine
adapter's ``deploy`` (vLLM's: :mod:`autotuner.engines.vllm.deploy`); the bundle writes what
they return.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from autotuner.core.text import printable

_FLAG = re.compile(r"^--?[A-Za-z]")


def argv_lines(argv: Sequence[str]) -> list[list[str]]:
    """``argv`` grouped for display: the head up to the first flag, then a flag per group."""
    groups: list[list[str]] = [[]]
    for arg in argv:
        if _FLAG.match(arg) and groups[-1]:
            groups.append([])
        groups[-1].append(arg)
    return groups


def format_command(lines: Sequence[Sequence[str]], indent: str = "  ") -> str:
    """Shell text for groups of arguments, one group a line, joined by backslash-newlines.

    Every argument is quoted with :func:`shlex.quote`, so the text runs exactly that argv.
    """
    rendered = [shlex.join(line) for line in lines if line]
    return (" \\\n" + indent).join(rendered)


def bash_script(lines: Sequence[Sequence[str]], comments: Sequence[str], *, pass_args: bool) -> str:
    """A bash script that ``exec``s ``lines`` (see :func:`format_command`) under ``comments``;
    ``pass_args`` appends the script's own arguments to the command. Comments carry text from
    outside (an engine's reported version, a model path): their control characters are
    escaped, so a newline in one can't end the comment and start a command."""
    out = [
        "#!/usr/bin/env bash",
        *(f"# {printable(c)}" if c else "#" for c in comments),
        "set -euo pipefail",
    ]
    command = "exec " + format_command(lines)
    if pass_args:
        # Extra flags given to the script (e.g. --api-key) are appended to the server's.
        command += ' \\\n  "$@"'
    out.append(command)
    return "\n".join(out) + "\n"
