"""Process-group reaping and the guard, on real processes (no engine needed)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from autotuner.core import procs

# A parent that starts a child which starts a grandchild, all in one new session.
FAMILY = textwrap.dedent(
    """
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "time.sleep(600)"])
    print("ready", flush=True)
    time.sleep(600)
    """
)


def start_family() -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", FAMILY], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while len(procs.group_members(p.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    return p


def test_kill_group_reaps_children_and_grandchildren() -> None:
    p = start_family()
    assert len(procs.group_members(p.pid)) == 3
    assert procs.kill_group(p.pid, [], grace_s=5)
    p.wait(timeout=5)
    assert procs.group_members(p.pid) == []


def test_kill_group_escalates_to_sigkill() -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
    started = time.monotonic()
    assert procs.kill_group(stubborn.pid, [], grace_s=0.5)
    assert stubborn.wait(timeout=5) == -signal.SIGKILL
    assert time.monotonic() - started < 10


IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(600)"
)


def test_kill_group_logs_the_escalation(caplog: pytest.LogCaptureFixture) -> None:
    stubborn = subprocess.Popen(
        [sys.executable, "-c", IGNORES_SIGTERM],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
    with caplog.at_level(logging.INFO, logger="autotuner.core.procs"):
        assert procs.kill_group(stubborn.pid, [], grace_s=0.3)
    stubborn.wait(timeout=5)
    assert [r.getMessage() for r in caplog.records] == [
        f"process group {stubborn.pid} still running 0 s after SIGTERM: SIGKILL"
    ]


def test_guard_reaps_the_group_when_its_owner_is_killed() -> None:
    # The owner starts the family and a guard, then is killed with -9 (as a crashed tuner).
    owner_code = textwrap.dedent(
        f"""
        import subprocess, sys
        sys.path.insert(0, {os.getcwd()!r})
        from autotuner.core import procs
        fam = subprocess.Popen([sys.executable, "-c", {FAMILY!r}],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
        fam.stdout.readline()
        procs.start_guard(fam.pid)
        print(fam.pid, flush=True)
        import time; time.sleep(600)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    pgid = int(owner.stdout.readline())
    deadline = time.monotonic() + 10
    while len(procs.group_members(pgid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(procs.group_members(pgid)) == 3
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 20
    while procs.group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert procs.group_members(pgid) == []


def test_tree_lists_live_descendants() -> None:
    p = start_family()
    try:
        pids = {q.pid for q in procs.tree(p.pid)}
        assert p.pid in pids and len(pids) == 3
        assert procs.tree(2**22 + 12345) == []
    finally:
        procs.kill_group(p.pid, [], grace_s=2)
        p.wait(timeout=5)
    assert not psutil.pid_exists(p.pid) or psutil.Process(p.pid).status() == "zombie"
