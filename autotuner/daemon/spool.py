"""The spool directory: SLA files dropped into ``STATE_DIR/spool/`` are submitted, then moved
to ``done/``, or to ``failed/`` with a sibling ``.error.txt`` (mode 0600).

Dropping a file safely: write it under a name the daemon ignores (one that does not end in
``.yaml``/``.yml``, such as ``x.yaml.tmp``, or one starting with ``.``), then rename it to
``x.yaml`` in the same directory. A rename is atomic, so the daemon sees the whole file or
nothing. For writers that do not rename, a file is taken only once its size, mtime and inode
were the same at two scans and it is ``min_age_s`` old.

Refused without being read, moved to ``failed/`` and reported: anything that is not a
regular file (symbolic links, dangling or not, directories, FIFOs, sockets, devices), a
second name of a file that lives elsewhere (a hard link), a file over the size cap
(``max_request_bytes``). Links are never followed: a file is claimed by renaming it into
``.work/`` and opened there with ``O_NOFOLLOW``, so what is read is what gets moved on.

Every file is handled on its own: whatever goes wrong with one (an unreadable file, a bug)
moves it aside, or, when it can't be moved, is reported once, and the scan goes on. A file
left in ``.work/`` by a daemon that died while handling it goes to ``failed/`` at the next
scan instead of being parsed again. Every refusal is reported where a user looks: the log,
an alert (``spool_rejected``), ``autotuner status`` and ``autotuner_spool_rejected_total``.
Missing ``spool/``, ``done/`` or ``failed/`` folders are created again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from autotuner.core.errors import BadInput
from autotuner.daemon.errors import SubmitError
from autotuner.daemon.offload import off_loop

if TYPE_CHECKING:
    from autotuner.daemon.service import Daemon, Submission

logger = logging.getLogger(__name__)

SUFFIXES = (".yaml", ".yml")
WORK = ".work"  # files claimed while they are read and parsed
PARSE_TIMEOUT_S = 60.0  # a file whose reading and validation take longer is refused


class SpoolRefused(BadInput):
    """A spool file that is not read or not accepted as it is (the message says why)."""


_Mark = tuple[int, int, int, int]  # size, mtime_ns, inode, device


def _mark(st: os.stat_result) -> _Mark:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _not_plain(st: os.stat_result) -> str | None:
    """Why a spool entry is refused without being opened, or None for a plain file."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "a symbolic link: spool files must be regular files (links are never followed)"
    if stat.S_ISDIR(mode):
        return "a directory, not an SLA file"
    if not stat.S_ISREG(mode):
        return "not a regular file (a FIFO, socket or device): it is never opened"
    if st.st_nlink > 1:
        return "a hard link to a file that lives elsewhere: copy the file instead"
    return None


@dataclass(frozen=True)
class Claimed:
    name: str  # as dropped
    path: Path  # under .work/


class Spool:
    """The spool folder's files: which are ready, claiming, reading, moving on."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self._marks: dict[str, _Mark] = {}  # what each file looked like at the last scan
        self._stuck: dict[str, _Mark] = {}  # refused but could not be moved: reported once

    def ensure_dirs(self) -> None:
        for sub in ("done", "failed", WORK):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)

    def leftovers(self) -> list[Path]:
        """Files a previous daemon claimed and never moved on (it died handling them)."""
        work = self.dir / WORK
        return sorted(work.iterdir()) if work.is_dir() else []

    def due(self, min_age_s: float) -> list[tuple[str, str | None]]:
        """The files to act on now: ``(name, None)`` to read, ``(name, why)`` to refuse."""
        self.ensure_dirs()
        out: list[tuple[str, str | None]] = []
        present: set[str] = set()
        now = time.time()
        with os.scandir(self.dir) as entries:
            names = sorted(e.name for e in entries)
        for name in names:
            if name.startswith(".") or not name.endswith(SUFFIXES):
                continue
            present.add(name)
            try:
                st = os.lstat(self.dir / name)
            except FileNotFoundError:
                continue
            mark = _mark(st)
            if self._stuck.get(name) == mark:
                continue
            why = _not_plain(st)
            if why is None and st.st_size > self.max_bytes:
                why = self._too_big(st.st_size)
            if why is not None:
                out.append((name, why))
                continue
            previous = self._marks.get(name)
            self._marks[name] = mark
            if min_age_s <= 0 or (previous == mark and now - st.st_mtime >= min_age_s):
                del self._marks[name]
                out.append((name, None))
        for gone in set(self._marks) - present:
            del self._marks[gone]
        for gone in set(self._stuck) - present:
            del self._stuck[gone]
        return out

    def _too_big(self, size: int) -> str:
        return (
            f"{size} bytes is over the daemon's limit of {self.max_bytes} bytes "
            "(max_request_bytes): it was not read"
        )

    def claim(self, name: str) -> Claimed:
        """Move ``name`` into .work/ (a rename: it moves a link, never what it points to)."""
        dest = _unique(self.dir / WORK, f"{datetime.now().strftime('%Y%m%dT%H%M%S')}-{name}")
        os.rename(self.dir / name, dest)
        return Claimed(name, dest)

    def read(self, path: Path) -> str:
        """The text of a claimed file; SpoolRefused unless it is a plain UTF-8 file within
        the size cap. Opened with O_NOFOLLOW and O_NONBLOCK: a link or a FIFO swapped in
        since the scan is refused, never followed or waited on."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if os.path.islink(path):
                raise SpoolRefused(_not_plain(os.lstat(path)) or "a link") from None
            raise SpoolRefused(f"cannot open it: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            why = _not_plain(st)
            if why is None and st.st_size > self.max_bytes:
                why = self._too_big(st.st_size)
            if why is not None:
                raise SpoolRefused(why)
            chunks: list[bytes] = []
            size = 0
            while size <= self.max_bytes:
                chunk = os.read(fd, min(1 << 16, self.max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > self.max_bytes:
                raise SpoolRefused(self._too_big(size))
        finally:
            os.close(fd)
        try:
            return b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpoolRefused(f"not UTF-8 text (byte {exc.start})") from None

    def move(self, path: Path, folder: str) -> Path:
        """Move a claimed (or refused) entry into done/ or failed/; returns where it went."""
        self.ensure_dirs()
        name = path.name
        if path.parent == self.dir:  # refused before being claimed: stamp it here
            name = f"{datetime.now().strftime('%Y%m%dT%H%M%S')}-{name}"
        dest = _unique(self.dir / folder, name)
        os.rename(path, dest)
        return dest

    def unclaim(self, c: Claimed) -> None:
        """Put a claimed file back for the next scan (the daemon is stopping)."""
        with contextlib.suppress(OSError):
            if not os.path.lexists(self.dir / c.name):
                os.rename(c.path, self.dir / c.name)

    def stuck(self, name: str) -> None:
        """``name`` was refused but could not be moved: skip it until it changes."""
        with contextlib.suppress(OSError):
            self._stuck[name] = _mark(os.lstat(self.dir / name))


def _unique(folder: Path, name: str) -> Path:
    dest = folder / name
    n = 1
    while os.path.lexists(dest) or os.path.lexists(dest.with_name(dest.name + ".error.txt")):
        stamp, _, rest = name.partition("-")
        dest = folder / f"{stamp}-{n}-{rest}"
        n += 1
    return dest


def write_error(next_to: Path, messages: list[str]) -> Path:
    """The ``.error.txt`` beside a failed file, mode 0600, never through a link."""
    path = next_to.with_name(next_to.name + ".error.txt")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write("\n".join(messages) + "\n")
    return path


# --------------------------------------------------------------------------- one scan


def _refuse(d: Daemon, name: str, path: Path, messages: list[str]) -> None:
    """Move an entry to failed/ with its messages and report it, once."""
    moved: Path | None = None
    try:
        moved = d.spool.move(path, "failed")
        write_error(moved, messages)
    except OSError as exc:
        messages = [*messages, f"(could not move it to failed/: {exc.strerror or exc})"]
        if path.parent == d.spool.dir:
            d.spool.stuck(name)
    d.spool_rejected(name, messages, moved)


def _claim_due(d: Daemon, min_age_s: float) -> tuple[list[Claimed], list[tuple[str, bool]]]:
    """Refuse what is refused unread, claim what is ready to read."""
    sp = d.spool
    refused: list[tuple[str, bool]] = []
    for left in sp.leftovers():
        try:
            msg = (
                f"{left.name}: the daemon stopped while it handled this file, so it is not "
                "read again; if `autotuner status` does not list its SLA, drop it again"
            )
            _refuse(d, left.name, left, [msg])
        except Exception:  # one file must never stop the scan
            logger.exception("spool: cannot move %s aside", left)
    claimed: list[Claimed] = []
    for name, why in sp.due(min_age_s):
        try:
            if why is not None:
                _refuse(d, name, sp.dir / name, [f"{name}: {why}"])
                refused.append((name, False))
            else:
                claimed.append(sp.claim(name))
        except FileNotFoundError:
            continue  # renamed or removed since the scan: the next scan sees it
        except Exception as exc:
            logger.exception("spool: cannot handle %s", name)
            sp.stuck(name)
            d.spool_rejected(name, [f"{name}: cannot handle it: {exc!r}"], None)
            refused.append((name, False))
    return claimed, refused


def _prepare(d: Daemon, c: Claimed) -> Submission | list[str]:
    """Read and validate a claimed file: the part that may be slow (off the event loop)."""
    try:
        text = d.spool.read(c.path)
        return d.prepare(text, source=c.name, base_dir=d.spool.dir)
    except SpoolRefused as exc:
        return [f"{c.name}: {exc}"]
    except SubmitError as exc:
        return exc.messages
    except Exception as exc:
        logger.exception("spool: reading %s failed", c.name)
        return [f"{c.name}: internal error while reading it: {exc!r}"]


def _finish(d: Daemon, c: Claimed, prepared: Submission | list[str]) -> tuple[str, bool]:
    """Register a prepared file and move it to done/, or move it to failed/."""
    try:
        if not isinstance(prepared, list):
            try:
                result = d.register(prepared)
            except SubmitError as exc:
                prepared = exc.messages
            else:
                d.spool.move(c.path, "done")
                logger.info(
                    "spool: %s submitted as %s (job %s)", c.name, result["sla"], result["job"]
                )
                return (c.name, True)
        _refuse(d, c.name, c.path, prepared)
    except Exception as exc:
        logger.exception("spool: handling %s failed", c.name)
        d.spool_rejected(c.name, [f"{c.name}: internal error: {exc!r}"], None)
    return (c.name, False)


def scan_spool(d: Daemon, min_age_s: float = 1.0) -> list[tuple[str, bool]]:
    """One scan with every parse on this thread (tests; callers outside the event loop).
    Returns ``(file name, submitted)`` per file handled."""
    claimed, out = _claim_due(d, min_age_s)
    for c in claimed:
        out.append(_finish(d, c, _prepare(d, c)))
    return sorted(out)


async def scan_spool_async(d: Daemon, min_age_s: float = 1.0) -> list[tuple[str, bool]]:
    """One scan as the daemon's loop runs it: reading and parsing each file on a thread of
    its own, so a slow parse never stalls the API, job supervision or a stop."""
    claimed, out = _claim_due(d, min_age_s)
    for i, c in enumerate(claimed):
        try:
            prepared = await asyncio.wait_for(off_loop(_prepare, d, c), PARSE_TIMEOUT_S)
        except TimeoutError:
            prepared = [f"{c.name}: reading and validating it took over {PARSE_TIMEOUT_S:.0f} s"]
        except asyncio.CancelledError:  # the daemon is stopping: the next start reads them
            for rest in claimed[i:]:
                d.spool.unclaim(rest)
            raise
        out.append(_finish(d, c, prepared))
    return sorted(out)
