"""Opening files that an SLA from outside names, confined to the directories it may read.

The daemon checks ``model.path``, ``workload.dataset`` and ``workload.trace`` when an SLA is
submitted (:mod:`autotuner.daemon.confine`), but a path may not exist yet then, or be
replaced by a symbolic link afterwards. So the check is made again when a file is opened:
the file is opened first (following links as the kernel does), then the real path of the
open descriptor (``/proc/self/fd/N``) must lie under one of the roots. What was opened is
what was checked; nothing of a file outside the roots is read.

The roots are set for a block (:func:`confined_to`, the daemon's own reads of a submission)
or for a whole process by ``$AUTOTUNER_CONFINE_TO`` (``os.pathsep``-separated), which the
daemon sets for every job it starts. Without either, nothing is confined: the command line
runs as its user and reads what that user may.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path

from autotuner.core.errors import BadInput

ROOTS_VAR = "AUTOTUNER_CONFINE_TO"
_ROOTS: ContextVar[tuple[Path, ...] | None] = ContextVar("confined_roots", default=None)


class OutsideRoots(BadInput, ValueError):
    """A file or folder resolves outside the directories it may be read from."""


def roots() -> tuple[Path, ...] | None:
    """The directories reads are confined to now (None: not confined)."""
    set_here = _ROOTS.get()
    if set_here is not None:
        return set_here
    env = os.environ.get(ROOTS_VAR)
    if not env:
        return None
    return tuple(Path(p) for p in env.split(os.pathsep) if p)


def env_value(dirs: Sequence[Path]) -> str:
    """``$AUTOTUNER_CONFINE_TO`` for a child process confined to ``dirs``."""
    return os.pathsep.join(str(d) for d in dirs)


@contextlib.contextmanager
def confined_to(dirs: Sequence[Path]) -> Iterator[None]:
    """Confine this thread's (this context's) reads to ``dirs`` for the block."""
    token = _ROOTS.set(tuple(dirs))
    try:
        yield
    finally:
        _ROOTS.reset(token)


def _real(fd: int, path: Path) -> Path:
    """The real path of what ``fd`` (opened from ``path``) is."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # no /proc: the resolved path must still be the file that was opened
        real = Path(os.path.realpath(path))
        try:
            same = os.path.samestat(os.stat(real), os.fstat(fd))
        except OSError:
            same = False
        if not same:
            raise OutsideRoots(f"{path}: changed while it was opened; try again") from None
        return real


def check_fd(fd: int, path: Path) -> None:
    """OutsideRoots unless what ``fd`` is lies under the roots (if any)."""
    allowed = roots()
    if allowed is None:
        return
    real = _real(fd, path)
    if not any(real.is_relative_to(os.path.realpath(r)) for r in allowed):
        where = ", ".join(str(r) for r in allowed)
        raise OutsideRoots(
            f"{path}: resolves to {real}, outside the directories SLA files may be read from "
            f"({where}); it was not read"
        )


def open_file(path: Path) -> int:
    """``path`` opened for reading (a descriptor); OutsideRoots if it resolves outside the
    roots, OSError if it can't be opened. O_NONBLOCK: a FIFO never blocks the open."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        check_fd(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path) -> bytes:
    """The whole of the regular file ``path``, read within the roots."""
    fd = open_file(path)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        return f.read()


def check_dir(path: Path) -> Path:
    """The real path of the directory ``path`` once it is checked to lie under the roots
    (unchanged when nothing is confined); OutsideRoots, or OSError if it can't be opened."""
    if roots() is None:
        return path
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        check_fd(fd, path)
        return _real(fd, path)
    finally:
        os.close(fd)


def check_tree(path: Path, limit: int = 10_000) -> Path:
    """:func:`check_dir`, and every file and folder under it, links followed, must resolve
    under the roots too: an engine reads a whole model folder, following its links, so it is
    checked when a job is about to start it (not only when the SLA came in)."""
    real = check_dir(path)
    allowed = roots()
    if allowed is None:
        return real
    tops = [os.path.realpath(r) for r in allowed]
    seen = 0
    # followlinks: a linked folder inside the roots may hold links that leave them; a cycle
    # of links ends at the limit
    for top, dirs, files in os.walk(real, followlinks=True):
        for name in [*dirs, *files]:
            seen += 1
            if seen > limit:
                raise OutsideRoots(f"{path}: more than {limit} files and folders in it")
            full = os.path.join(top, name)
            target = Path(os.path.realpath(full))
            if not any(target.is_relative_to(t) for t in tops):
                raise OutsideRoots(
                    f"{full}: resolves to {target}, outside the directories SLA files may be "
                    f"read from ({', '.join(str(r) for r in allowed)}); the model was not used"
                )
    return real
