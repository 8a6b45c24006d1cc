"""Shell text for deployment artifacts, whatever the engine: argv grouped a flag per line,
quoted so that the text runs exactly that argv, and wrapped in a bash script.

The engine-specific renderers (serve command, container, Kubernetes) are the engine
adapter's ``deploy`` (vLLM's: :mod:`autotuner.engines.vllm.deploy`); the bundle writes what
they return.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence

from autotuner.core.text import printable

_FLAG = re.compile(r"^--?[A-Za-z]")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def dns_label(text: str, fallback: str = "autotuner") -> str:
    """``text`` as a Kubernetes name (an RFC 1123 DNS label: lowercase letters, digits and
    ``-``, at most 63 characters, a letter or digit at each end). A name that already is one
    is kept; any other (``My_SLA.``, 100 characters) is folded and, so that two names do not
    fold into one, ends with 8 hex digits of its hash."""
    if _DNS_LABEL.match(text):
        return text
    folded = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    head = folded[: 63 - len(digest) - 1].strip("-") or fallback
    return f"{head}-{digest}"


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


def bash_script(
    lines: Sequence[Sequence[str]],
    comments: Sequence[str],
    *,
    pass_args: bool,
    env: Mapping[str, str] | None = None,
) -> str:
    """A bash script that ``exec``s ``lines`` (see :func:`format_command`) under ``comments``;
    ``pass_args`` appends the script's own arguments to the command; ``env`` is exported
    first (each value quoted: the command sees exactly that text). Comments carry text from
    outside (an engine's reported version, a model path): their control characters are
    escaped, so a newline in one can't end the comment and start a command."""
    out = [
        "#!/usr/bin/env bash",
        *(f"# {printable(c)}" if c else "#" for c in comments),
        "set -euo pipefail",
    ]
    for name, value in (env or {}).items():
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        out.append(f"export {name}={shlex.quote(value)}")
    command = "exec " + format_command(lines)
    if pass_args:
        # Extra flags given to the script (e.g. --api-key) are appended to the server's.
        command += ' \\\n  "$@"'
    out.append(command)
    return "\n".join(out) + "\n"
