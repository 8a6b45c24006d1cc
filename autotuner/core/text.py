"""Text from outside (file names, engine logs, lock files, package metadata) made safe to print
on a terminal or to put in a shell comment: control characters are shown escaped, never sent.

A raw ESC starts a terminal escape sequence (it can move the cursor, rewrite what was printed
or retitle the window); a raw newline in a name makes one line look like two, and in a shell
comment starts a command.
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls (U+0080-U+009F: some terminals act on them as on ESC [).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # keeps \t and \n


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c, f"\\x{ord(c):02x}")


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character escaped (``\\x1b``, ``\\n``); ``lines`` keeps
    newlines and tabs, for multi-line messages such as a log's tail."""
    return (_CONTROL_BUT_LINES if lines else _CONTROL).sub(_escape, text)


def has_control(text: str) -> bool:
    """Whether ``text`` holds any character :func:`printable` would escape."""
    return _CONTROL.search(text) is not None


# A terminal's CSI sequence (ESC [ ... final byte): colours and cursor moves in a program's log.
_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def log_text(text: str) -> str:
    """A log's lines as they may be shown: colour and cursor sequences dropped, every other
    control character escaped; newlines and tabs kept."""
    return printable(_CSI.sub("", text), lines=True)
