"""``daemon.json`` in the daemon's state directory: where a running daemon listens.

Written by the daemon when it starts serving; read by the ``autotuner daemon`` client
commands to find it.
"""

from __future__ import annotations

from autotuner.records.base import Record


class DaemonInfo(Record):
    KIND = "daemon address file"

    url: str  # http://HOST:PORT, the address local clients use
    bind: str | None = None  # HOST:PORT the API is bound to (0.0.0.0:PORT: every interface)
    pid: int | None = None
    started: float | None = None  # epoch seconds
