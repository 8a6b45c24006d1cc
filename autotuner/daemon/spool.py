"""The spool directory: SLA files dropped there are submitted, then moved to done/ or to
failed/ with a sibling ``.error.txt``."""

from __future__ import annotations

import contextlib
import os
import time
from datetime import datetime
from typing import TYPE_CHECKING

from autotuner.daemon.errors import SubmitError

if TYPE_CHECKING:
    from autotuner.daemon.service import Daemon


def scan_spool(d: Daemon, min_age_s: float = 1.0) -> list[tuple[str, bool]]:
    """Submit SLA files dropped into spool/; move each to done/ or failed/."""
    spool = d.root / "spool"
    out = []
    now = time.time()
    for f in sorted(spool.iterdir()):
        if not f.is_file() or f.name.startswith(".") or f.suffix not in (".yaml", ".yml"):
            continue
        with contextlib.suppress(OSError):
            if now - f.stat().st_mtime < min_age_s:
                continue  # maybe still being written
        stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
        try:
            text = f.read_text(encoding="utf-8")
            d.submit(text, source=f.name, base_dir=spool)
        except (SubmitError, UnicodeDecodeError, OSError) as exc:
            dest = spool / "failed" / f"{stamp}-{f.name}"
            msg = "\n".join(exc.messages) if isinstance(exc, SubmitError) else str(exc)
            os.replace(f, dest)
            dest.with_name(dest.name + ".error.txt").write_text(msg + "\n")
            out.append((f.name, False))
            continue
        os.replace(f, spool / "done" / f"{stamp}-{f.name}")
        out.append((f.name, True))
    return out
