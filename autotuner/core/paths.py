"""Where autotuner keeps its own state (engine environments, generated models, caches).

Everything lives under one home directory: ``$AUTOTUNER_HOME`` if set, else
``~/.local/share/autotuner``. Tests point ``AUTOTUNER_HOME`` at a temporary directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never half."""
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
