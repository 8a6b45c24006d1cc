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
A name with control characters is refused too, and every name and message is shown with
its control characters escaped.

The folders are the daemon's own: ``spool/`` and, inside it, ``done/``, ``failed/`` and
``.work/`` (mode 0700) must be real directories of the daemon's user. Each scan opens them
once (``O_DIRECTORY | O_NOFOLLOW``) and renames and opens only relative to those descriptors,
so one swapped for a symbolic link is never followed: a folder that is a link, a file or
another user's stops the start (exit 2) or, found later, the scans (logged once) until it is
removed. Missing folders are created again.
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
from autotuner.core.text import has_control, printable
from autotuner.daemon import submissions
from autotuner.daemon.errors import SubmitError
from autotuner.daemon.offload import off_loop

if TYPE_CHECKING:
    from autotuner.daemon.service import Daemon
    from autotuner.daemon.submissions import Submission

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
    work: str  # its name in .work/


SPOOL = ""  # the spool folder itself, as a key of Tree.fds
FOLDERS = ("done", "failed", WORK)


class SpoolTreeError(BadInput):
    """A folder of the spool is not one the daemon made: a symbolic link, a file, another
    user's. Nothing is moved into or out of it."""


class Tree:
    """The spool's folders as open directory descriptors, for one scan: every rename and open
    is relative to them (``dir_fd``), so a folder swapped for a link after they were opened
    is never followed."""

    def __init__(self, fds: dict[str, int]) -> None:
        self.fds = fds

    def fd(self, folder: str) -> int:
        return self.fds[folder]

    def close(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = {}


def _open_dir(parent: int, name: str, shown: Path, mode: int) -> int:
    """``name`` in ``parent`` as a directory descriptor; made (``mode``) when missing. Refused
    with SpoolTreeError unless it is a real directory of this user (never a link)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SpoolTreeError(f"{shown}: cannot make the folder: {exc.strerror or exc}") from None
    try:
        fd = os.open(name, flags, dir_fd=parent)
    except OSError as exc:
        raise SpoolTreeError(_not_ours(parent, name, shown, exc)) from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise SpoolTreeError(
            f"{shown} belongs to user {st.st_uid}, not to the daemon's user {os.geteuid()}: the "
            "daemon moves files only within folders it made; remove it and the daemon makes it "
            "again"
        )
    return fd


def _not_ours(parent: int, name: str, shown: Path, exc: OSError) -> str:
    what = f"cannot be opened ({exc.strerror or exc})"
    with contextlib.suppress(OSError):
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=parent)
            what = f"a symbolic link (to {printable(target)})"
        elif not stat.S_ISDIR(st.st_mode):
            what = "not a folder"
    return (
        f"{shown} is {what}, not a folder the daemon made: the daemon never moves files "
        "through it; remove it and the daemon makes the folder again"
    )


class Spool:
    """The spool folder's files: which are ready, claiming, reading, moving on."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self._marks: dict[str, _Mark] = {}  # what each file looked like at the last scan
        self._stuck: dict[str, _Mark] = {}  # refused but could not be moved: reported once
        self.problem: str | None = None  # why the last scan could not run (reported once)

    def open_tree(self) -> Tree:
        """Open (making what is missing) and check the spool and its folders; SpoolTreeError
        for one that is not a directory the daemon made."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        try:  # the state directory itself is the operator's choice: links are fine there
            root = os.open(self.dir.parent, flags)
        except OSError as exc:
            raise SpoolTreeError(f"{self.dir.parent}: cannot open: {exc.strerror or exc}") from None
        fds: dict[str, int] = {}
        tree = Tree(fds)
        try:
            fds[SPOOL] = _open_dir(root, self.dir.name, self.dir, 0o777)
            for sub in FOLDERS:  # only the daemon reads and writes these
                fds[sub] = _open_dir(fds[SPOOL], sub, self.dir / sub, 0o700)
        except BaseException:
            tree.close()
            raise
        finally:
            os.close(root)
        return tree

    def ensure_dirs(self) -> None:
        """Make and check the folders (at start: a tree the daemon did not make is an error)."""
        self.open_tree().close()

    def leftovers(self, tree: Tree) -> list[str]:
        """Files a previous daemon claimed and never moved on (it died handling them)."""
        return sorted(os.listdir(tree.fd(WORK)))

    def due(self, tree: Tree, min_age_s: float) -> list[tuple[str, str | None]]:
        """The files to act on now: ``(name, None)`` to read, ``(name, why)`` to refuse."""
        spool = tree.fd(SPOOL)
        out: list[tuple[str, str | None]] = []
        present: set[str] = set()
        now = time.time()
        with os.scandir(spool) as entries:
            names = sorted(e.name for e in entries)
        for name in names:
            if name.startswith(".") or not name.endswith(SUFFIXES):
                continue
            present.add(name)
            try:
                st = os.stat(name, dir_fd=spool, follow_symlinks=False)
            except FileNotFoundError:
                continue
            mark = _mark(st)
            if self._stuck.get(name) == mark:
                continue
            why = _not_plain(st)
            if why is None and has_control(name):
                why = "its name holds control characters (a newline, an escape): rename it"
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

    def claim(self, tree: Tree, name: str) -> Claimed:
        """Move ``name`` into .work/ (a rename: it moves a link, never what it points to)."""
        work = _unique(tree.fd(WORK), f"{datetime.now().strftime('%Y%m%dT%H%M%S')}-{name}")
        os.rename(name, work, src_dir_fd=tree.fd(SPOOL), dst_dir_fd=tree.fd(WORK))
        return Claimed(name, work)

    def open_claimed(self, tree: Tree, c: Claimed) -> int:
        """A claimed file, opened for :meth:`read` (which closes it). O_NOFOLLOW and
        O_NONBLOCK: a link or a FIFO swapped in since the scan is refused, never followed or
        waited on."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        work = tree.fd(WORK)
        try:
            return os.open(c.work, flags, dir_fd=work)
        except OSError as exc:
            with contextlib.suppress(OSError):
                st = os.stat(c.work, dir_fd=work, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise SpoolRefused(_not_plain(st) or "a link") from None
            raise SpoolRefused(f"cannot open it: {exc.strerror or exc}") from None

    def read(self, fd: int) -> str:
        """The text of a claimed file opened by :meth:`open_claimed` (closed here);
        SpoolRefused unless it is a plain UTF-8 file within the size cap."""
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

    def move(self, tree: Tree, where: str, entry: str, folder: str) -> str:
        """Move ``entry`` of folder ``where`` (SPOOL: refused before it was claimed; WORK)
        into ``folder`` (done/failed); returns its name there."""
        name = entry
        if where == SPOOL:  # refused before being claimed: stamp it here
            name = f"{datetime.now().strftime('%Y%m%dT%H%M%S')}-{entry}"
        dest = _unique(tree.fd(folder), name)
        os.rename(entry, dest, src_dir_fd=tree.fd(where), dst_dir_fd=tree.fd(folder))
        return dest

    def unclaim(self, tree: Tree, c: Claimed) -> None:
        """Put a claimed file back for the next scan (the daemon is stopping)."""
        with contextlib.suppress(OSError):
            if not _exists(tree.fd(SPOOL), c.name):
                os.rename(c.work, c.name, src_dir_fd=tree.fd(WORK), dst_dir_fd=tree.fd(SPOOL))

    def stuck(self, tree: Tree, name: str) -> None:
        """``name`` was refused but could not be moved: skip it until it changes."""
        with contextlib.suppress(OSError):
            self._stuck[name] = _mark(os.stat(name, dir_fd=tree.fd(SPOOL), follow_symlinks=False))


def _exists(folder: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _unique(folder: int, name: str) -> str:
    dest = name
    n = 1
    while _exists(folder, dest) or _exists(folder, dest + ".error.txt"):
        stamp, _, rest = name.partition("-")
        dest = f"{stamp}-{n}-{rest}"
        n += 1
    return dest


def write_error(folder: int, next_to: str, messages: list[str]) -> str:
    """The ``.error.txt`` beside a failed file in ``folder`` (a descriptor), mode 0600, never
    through a link; control characters in the messages are escaped. Returns its name."""
    name = next_to + ".error.txt"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write("\n".join(printable(m, lines=True) for m in messages) + "\n")
    return name


# --------------------------------------------------------------------------- one scan


def _refuse(d: Daemon, tree: Tree, where: str, entry: str, name: str, messages: list[str]) -> None:
    """Move an entry to failed/ with its messages and report it, once."""
    moved: Path | None = None
    try:
        dest = d.spool.move(tree, where, entry, "failed")
        moved = d.spool.dir / "failed" / dest
        write_error(tree.fd("failed"), dest, messages)
    except OSError as exc:
        messages = [*messages, f"(could not move it to failed/: {exc.strerror or exc})"]
        if where == SPOOL:
            d.spool.stuck(tree, name)
    rejected(d, printable(name), [printable(m, lines=True) for m in messages], moved)


def rejected(d: Daemon, name: str, messages: list[str], moved_to: Path | None) -> None:
    """Report a refused spool file everywhere a user looks: the log, an alert
    (``spool_rejected``, which /metrics counts) and ``status``."""
    shown = printable(str(moved_to)) if moved_to is not None else None  # names from outside
    where = f"moved to {shown}" if shown is not None else "left where it is"
    logger.warning("spool: %s refused (%s): %s", name, where, " | ".join(messages[:5]))
    details = {
        "file": name,
        "moved_to": shown,
        "errors": messages[:20],
    }
    d.spool_refusals.appendleft({"time": time.time(), **details})
    first = messages[0] if messages else "refused"
    d.alert("spool_rejected", "", "warning", f"spool file {name} refused: {first}", details)


def _claim_due(
    d: Daemon, tree: Tree, min_age_s: float
) -> tuple[list[Claimed], list[tuple[str, bool]]]:
    """Refuse what is refused unread, claim what is ready to read."""
    sp = d.spool
    refused: list[tuple[str, bool]] = []
    for left in sp.leftovers(tree):
        try:
            msg = (
                f"{printable(left)}: the daemon stopped while it handled this file, so it is "
                "not read again; if `autotuner status` does not list its SLA, drop it again"
            )
            _refuse(d, tree, WORK, left, left, [msg])
        except Exception:  # one file must never stop the scan
            logger.exception("spool: cannot move %s aside", printable(left))
    claimed: list[Claimed] = []
    for name, why in sp.due(tree, min_age_s):
        try:
            if why is not None:
                _refuse(d, tree, SPOOL, name, name, [f"{printable(name)}: {why}"])
                refused.append((name, False))
            else:
                claimed.append(sp.claim(tree, name))
        except FileNotFoundError:
            continue  # renamed or removed since the scan: the next scan sees it
        except Exception as exc:
            logger.exception("spool: cannot handle %s", printable(name))
            sp.stuck(tree, name)
            rejected(d, printable(name), [f"{printable(name)}: cannot handle it: {exc!r}"], None)
            refused.append((name, False))
    return claimed, refused


def _prepare(d: Daemon, c: Claimed, opened: int | SpoolRefused) -> Submission | list[str]:
    """Read and validate a claimed file: the part that may be slow (off the event loop)."""
    try:
        if isinstance(opened, SpoolRefused):
            raise opened
        text = d.spool.read(opened)
        return submissions.prepare(d.config, text, source=c.name, base_dir=d.spool.dir)
    except SpoolRefused as exc:
        return [f"{c.name}: {exc}"]
    except SubmitError as exc:
        return exc.messages
    except Exception as exc:
        logger.exception("spool: reading %s failed", c.name)
        return [f"{c.name}: internal error while reading it: {exc!r}"]


def _open(d: Daemon, tree: Tree, c: Claimed) -> int | SpoolRefused:
    try:
        return d.spool.open_claimed(tree, c)
    except SpoolRefused as exc:
        return exc


def _finish(
    d: Daemon, tree: Tree, c: Claimed, prepared: Submission | list[str]
) -> tuple[str, bool]:
    """Register a prepared file and move it to done/, or move it to failed/."""
    try:
        if not isinstance(prepared, list):
            try:
                result = d.register(prepared)
            except SubmitError as exc:
                prepared = exc.messages
            else:
                d.spool.move(tree, WORK, c.work, "done")
                logger.info(
                    "spool: %s submitted as %s (job %s)", c.name, result["sla"], result["job"]
                )
                return (c.name, True)
        _refuse(d, tree, WORK, c.work, c.name, prepared)
    except Exception as exc:
        logger.exception("spool: handling %s failed", c.name)
        rejected(d, c.name, [f"{c.name}: internal error: {exc!r}"], None)
    return (c.name, False)


def _open_tree(d: Daemon) -> Tree | None:
    """The spool's folders for one scan; None (reported once, in the log) while one is not a
    folder the daemon made."""
    try:
        tree = d.spool.open_tree()
    except SpoolTreeError as exc:
        if d.spool.problem != str(exc):
            logger.error("spool: not scanned: %s", exc)
        d.spool.problem = str(exc)
        return None
    if d.spool.problem is not None:
        logger.info("spool: scanned again (%s is in order)", d.spool.dir)
        d.spool.problem = None
    return tree


def scan_spool(d: Daemon, min_age_s: float = 1.0) -> list[tuple[str, bool]]:
    """One scan with every parse on this thread (tests; callers outside the event loop).
    Returns ``(file name, submitted)`` per file handled."""
    tree = _open_tree(d)
    if tree is None:
        return []
    try:
        claimed, out = _claim_due(d, tree, min_age_s)
        for c in claimed:
            out.append(_finish(d, tree, c, _prepare(d, c, _open(d, tree, c))))
    finally:
        tree.close()
    return sorted(out)


async def scan_spool_async(d: Daemon, min_age_s: float = 1.0) -> list[tuple[str, bool]]:
    """One scan as the daemon's loop runs it: reading and parsing each file on a thread of
    its own, so a slow parse never stalls the API, job supervision or a stop. The file is
    opened here and handed to the thread, which never uses the folders' descriptors."""
    tree = _open_tree(d)
    if tree is None:
        return []
    try:
        claimed, out = _claim_due(d, tree, min_age_s)
        for i, c in enumerate(claimed):
            opened = _open(d, tree, c)
            try:
                prepared = await asyncio.wait_for(off_loop(_prepare, d, c, opened), PARSE_TIMEOUT_S)
            except TimeoutError:
                prepared = [
                    f"{c.name}: reading and validating it took over {PARSE_TIMEOUT_S:.0f} s"
                ]
            except asyncio.CancelledError:  # the daemon is stopping: the next start reads them
                for rest in claimed[i:]:
                    d.spool.unclaim(tree, rest)
                raise
            out.append(_finish(d, tree, c, prepared))
    finally:
        tree.close()
    return sorted(out)
