"""The daemon on a full disk: while writes under its state directory fail for lack of space
(recognised by :mod:`autotuner.daemon.diskfull`), new work is refused (HTTP 507) and no job
starts; the writes that failed wait here and are redone in order once a probe write fits,
and alerts the store could not take are held in memory (and sent from there) meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotuner.daemon import diskfull
from autotuner.daemon.diskfull import DiskFull
from autotuner.daemon.errors import SubmitError
from autotuner.daemon.store import Store

logger = logging.getLogger(__name__)
DISK_ALERT_EVERY_S = 3600.0  # a disk that fills again within this raises no new alert

# kind, sla, severity, summary, details (Daemon.alert)
Alert = Callable[[str, str, str, str, dict[str, Any]], None]


class DiskGuard:
    def __init__(self, root: Path, store: Store, alert: Alert, wake: asyncio.Event) -> None:
        self.root = root
        self.store = store
        self._alert = alert
        self._wake = wake
        self.full: DiskFull | None = None  # writes under the state dir fail for space
        self.held: dict[int, dict[str, Any]] = {}  # alerts the store could not take
        self._alerted = float("-inf")
        # Writes that failed for lack of space, redone in order once a probe write succeeds.
        self._deferred: list[tuple[str, Callable[[], object]]] = []

    def message(self) -> str:
        why = f" ({self.full.why})" if self.full is not None else ""
        return (
            f"the disk of the daemon's state directory {self.root} is full{why}: new work is "
            "refused until space is freed"
        )

    def refuse_if_full(self) -> None:
        """SubmitError 507 while writes under the state directory fail for lack of space."""
        if self.full is not None:
            raise SubmitError(507, [self.message()])

    def note(self, exc: BaseException, doing: str) -> bool:
        """Whether ``exc`` says the state directory's disk is full. The first time: the
        daemon notes it (new work is refused, no job starts), logs it and raises a
        ``disk_full`` alert (critical), which is sent even though the store can't keep it."""
        if not diskfull.is_full(exc):
            return False
        if self.full is not None:
            return True
        self.full = DiskFull(f"{doing}: {diskfull.describe(exc)}", time.time())
        logger.error("%s", self.message())
        if time.time() - self._alerted >= DISK_ALERT_EVERY_S:
            self._alerted = time.time()
            self._alert(
                "disk_full",
                "",
                "critical",
                f"the disk of the daemon's state directory {self.root} is full ({doing}: "
                f"{diskfull.describe(exc)}); new submissions are refused (HTTP 507) and no "
                "job starts until space is freed",
                {"state_dir": str(self.root), "error": diskfull.describe(exc)},
            )
        self._wake.set()
        return True

    def defer(self, what: str, redo: Callable[[], object]) -> None:
        """Redo ``redo`` once there is space again (``what`` names it in the log)."""
        self._deferred.append((what, redo))

    def probe(self) -> bool:
        """While the disk is full: True (and what waited is done) once a probe write fits."""
        if self.full is None:
            return True
        try:
            diskfull.probe(self.root)
        except OSError as exc:
            if not diskfull.is_full(exc):
                logger.warning("disk probe in %s failed: %s", self.root, exc)
            return False
        logger.info("the disk of %s has space again", self.root)
        self.full = None
        self._back()
        return self.full is None

    def _back(self) -> None:
        """Do the writes that waited for space, in order, then store the alerts held in
        memory (with their delivery state); stops where the disk is full again."""
        while self._deferred:
            what, redo = self._deferred[0]
            try:
                redo()
            except Exception as exc:
                if self.note(exc, what):
                    return
                logger.exception("%s failed", what)
            self._deferred.pop(0)
        for key in sorted(self.held, reverse=True):  # oldest first
            a = self.held[key]
            try:
                stored = self.store.add_alert(
                    a["kind"], a["sla"], a["severity"], a["summary"], a["details"]
                )
                if a["delivered"] == 1:
                    self.store.alert_sent(stored, True, next_try=0.0, error=None)
                elif a["delivered"] == -1:
                    self.store.give_up_alert(stored, str(a["last_error"]))
            except Exception as exc:
                if self.note(exc, "storing the alerts kept in memory"):
                    return
                raise
            del self.held[key]
