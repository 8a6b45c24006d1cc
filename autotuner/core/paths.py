"""Where autotuner keeps its own state (engine environments, generated models, caches).

Everything lives under one home directory: ``$AUTOTUNER_HOME`` if set, else
``~/.local/share/autotuner``. Tests point ``AUTOTUNER_HOME`` at a temporary directory.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from autotuner.core.errors import BadInput


class OutputRefused(BadInput):
    """An output path names something that is neither a file nor a stream to write into."""


def home() -> Path:
    """The autotuner home directory (not created here)."""
    env = os.environ.get("AUTOTUNER_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return Path("~/.local/share/autotuner").expanduser()


def engines_dir() -> Path:
    return home() / "engines"


def models_dir() -> Path:
    return home() / "models"


def check_folder(path: Path, what: str) -> None:
    """Refuse (:class:`OutputRefused`) a folder to write under that can't be one: ``path``, or
    the nearest of its parents that exists, is a file. Nothing is created here."""
    for existing in (path, *path.parents):
        try:
            mode = existing.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):  # not there, or under a file
            continue
        except OSError:
            return  # unreachable: making the folder says why, as it always did
        if not stat.S_ISDIR(mode):
            raise OutputRefused(f"{what} {path}: {existing} is a file, not a folder")
        return


def check_output(path: Path) -> bool:
    """Whether ``path`` is a stream (character device, FIFO: written through, never replaced);
    False for a regular file or nothing yet (replaced atomically). :class:`OutputRefused` for
    a directory, a socket, a block device: renaming over it would destroy it, writing into it
    is not meant."""
    try:
        mode = path.stat().st_mode  # through a symlink: /dev/stdout, a link to a FIFO
    except OSError:  # nothing there yet, or unreachable: the write says why as it always did
        return False
    if stat.S_ISREG(mode):
        return False
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return True
    what = "a directory" if stat.S_ISDIR(mode) else "not a file, a FIFO or a character device"
    raise OutputRefused(f"can't write {path}: it is {what}; name a file to write")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never half.

    A character device or a FIFO (``-o /dev/stdout``, a pipe) is written into, not replaced
    by a file; a directory or anything else is refused (:func:`check_output`)."""
    if check_output(path):
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file 0600; give it the mode a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
