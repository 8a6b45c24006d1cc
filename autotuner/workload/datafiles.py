"""Reading the data files an SLA names (datasets, traces) as hostile input.

Every problem is a :class:`DataFileError` (a ``ValueError``) whose text starts with
``FILE:LINE:`` (or ``FILE: record N:`` for records of one JSON document), so that ``check``,
``bench`` and ``tune`` can show it as it is and exit 2 before anything is launched. Limits
keep a wrong or malicious file from exhausting memory: a line longer than
:data:`MAX_LINE_BYTES`, a file larger than :data:`MAX_FILE_BYTES`, more than
:data:`MAX_RECORDS` records; bytes that are not UTF-8, JSON nested too deeply, ``NaN`` or
numbers that Python will not parse are errors too.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from autotuner.core import confined, strict_json

MAX_FILE_BYTES = 2 * 1024**3  # ShareGPT's best-known file is 0.7 GB
MAX_LINE_BYTES = 16 * 1024**2
MAX_RECORDS = 10_000_000


class DataFileError(ValueError):
    """A data file that can't be used; the message names the file and line or record."""


def parse_json(text: str) -> Any:
    """Strict JSON (:func:`autotuner.core.strict_json.loads`: no NaN, no duplicate keys); any
    failure is a ``ValueError``."""
    return strict_json.loads(text)


def check_size(path: Path) -> None:
    """Refuse a missing file, a directory, or one past :data:`MAX_FILE_BYTES`."""
    _open(path).close()


def _open(path: Path) -> IO[bytes]:
    """``path`` opened for reading once it is checked: a regular file within the size cap
    and, where reads are confined (the daemon's jobs), under the allowed directories once
    every link is resolved (:mod:`autotuner.core.confined`): checked on what was opened."""
    try:
        fd = confined.open_file(path)
    except confined.OutsideRoots as exc:
        raise DataFileError(str(exc)) from None
    except OSError as exc:
        raise DataFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    f = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DataFileError(f"{path}: not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise DataFileError(
                f"{path}: {st.st_size} bytes, more than the {MAX_FILE_BYTES} allowed"
            )
    except BaseException:
        f.close()
        raise
    return f


def lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of every non-blank line, checked for length and encoding."""
    with _open(path) as f:
        lineno = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            lineno += 1
            if len(raw) > MAX_LINE_BYTES:
                raise DataFileError(f"{path}:{lineno}: line longer than {MAX_LINE_BYTES} bytes")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataFileError(
                    f"{path}:{lineno}: not UTF-8 text (byte {raw[exc.start]:#04x} at column "
                    f"{exc.start + 1})"
                ) from None
            if lineno > MAX_RECORDS:
                raise DataFileError(f"{path}:{lineno}: more than {MAX_RECORDS} lines")
            if text.strip():
                yield lineno, text


def jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of every record of a JSON Lines file."""
    for lineno, text in lines(path):
        try:
            yield lineno, parse_json(text)
        except ValueError as exc:
            raise DataFileError(f"{path}:{lineno}: {exc}") from None


def json_document(path: Path) -> Any:
    """The one JSON value a ``.json`` file holds."""
    with _open(path) as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataFileError(f"{path}:{line}: not UTF-8 text") from None
    try:
        return strict_json.loads(text)
    except ValueError as exc:
        raise DataFileError(f"{path}: {exc}") from None


def count(value: Any, what: str, *, low: int = 1, high: int = 10_000_000) -> int:
    """``value`` as a token count in ``[low, high]``; a ``ValueError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {shown(value)}")
    if not low <= value <= high:
        raise ValueError(f"{what} must be between {low} and {high}, got {value}")
    return value


def shown(value: Any) -> str:
    """A short rendering of a value from a data file, for messages."""
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
