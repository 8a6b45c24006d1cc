"""A watchdog that reaps an engine's process group when the tuner dies without cleaning up.

``python -m autotuner.core.guard OWNER_PID OWNER_STAMP PGID [LOG]`` polls twice a second. When
the owner (the tuner process that started the engine) is gone — killed with -9, say — it says so
in the engine's log ``LOG`` and kills the whole group. vLLM's engine-core and worker processes
do not die with the API server, and the kernel's parent-death signal only reaches the direct
child, hence this process.
It lives in its own session, so a signal to the engine's group never reaches it.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from autotuner.core import procs


def watch(
    owner_pid: int, owner_stamp: float, pgid: int, interval_s: float = 0.5, log: Path | None = None
) -> int:
    """Until group ``pgid`` is empty (0), or its owner is gone and the group was killed (1)."""
    while True:
        if not procs.group_members(pgid):
            return 0
        if not procs.same_process(owner_pid, owner_stamp):  # a recycled pid has another stamp
            # Said first: without it, an engine killed here reads as one that exited on its own.
            if log is not None:
                with contextlib.suppress(OSError), log.open("ab") as out:
                    out.write(
                        f"# autotuner guard: the tuner (pid {owner_pid}) is gone: "
                        f"stopping the engine's processes\n".encode()
                    )
            procs.kill_group(pgid, [], grace_s=5.0)
            return 1
        time.sleep(interval_s)


def main(argv: list[str]) -> int:
    owner_pid, owner_stamp, pgid = int(argv[0]), float(argv[1]), int(argv[2])
    log = Path(argv[3]) if len(argv) > 3 else None
    return watch(owner_pid, owner_stamp, pgid, log=log)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
