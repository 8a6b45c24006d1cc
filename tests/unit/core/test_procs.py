"""Process-group reaping and the guard, on real processes (no engine needed)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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


STOPPING = "stopping the engine's processes"


def test_guard_reaps_the_group_when_its_owner_is_killed(tmp_path: Path) -> None:
    # The owner starts the family and a guard, then is killed with -9 (as a crashed tuner).
    owner_code = textwrap.dedent(
        f"""
        import subprocess, sys
        sys.path.insert(0, {os.getcwd()!r})
        from pathlib import Path
        from autotuner.core import procs
        fam = subprocess.Popen([sys.executable, "-c", {FAMILY!r}],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
        fam.stdout.readline()
        procs.start_guard(fam.pid, Path({str(tmp_path / "engine.log")!r}))
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
    said = (tmp_path / "engine.log").read_text()
    assert said == f"# autotuner guard: the tuner (pid {owner.pid}) is gone: {STOPPING}\n"


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


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _move_the_wall_clock(monkeypatch: pytest.MonkeyPatch, by_s: float) -> None:
    """What an adjustment of the system clock does to the boot time psutil reads."""
    real = psutil._pslinux.boot_time
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: real() + by_s)


def test_a_process_keeps_its_start_stamp_when_the_wall_clock_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child = _sleeper()
    try:
        stamp = procs.start_stamp(child.pid)
        assert stamp is not None
        wall = psutil.Process(child.pid).create_time()
        _move_the_wall_clock(monkeypatch, 1.0)
        # psutil's start time moves with the clock: compared with it, the live child looks gone
        assert psutil.Process(child.pid).create_time() == pytest.approx(wall + 1.0)
        assert procs.start_stamp(child.pid) == stamp
        assert procs.same_process(child.pid, stamp)
        assert not procs.same_process(child.pid, stamp - 1.0)  # another process, same pid
    finally:
        child.kill()
        child.wait(timeout=10)
    assert procs.start_stamp(child.pid) is None
    assert not procs.same_process(child.pid, stamp)


def test_a_zombie_is_not_the_process_it_was() -> None:
    child = _sleeper()
    stamp = procs.start_stamp(child.pid)
    assert stamp is not None
    child.kill()
    # not reaped yet: the pid stays a zombie until wait()
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the killed child never became a zombie"
        time.sleep(0.01)
    assert procs.start_stamp(child.pid) is None and not procs.same_process(child.pid, stamp)
    child.wait(timeout=10)


def test_a_wall_clock_start_of_an_older_record_still_names_its_process() -> None:
    child = _sleeper()
    try:
        wall = psutil.Process(child.pid).create_time()
        assert procs.same_process(child.pid, wall)
        assert not procs.same_process(child.pid, wall - 3600)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert not procs.same_process(child.pid, wall)


def test_the_guard_keeps_a_live_owners_engine_when_the_wall_clock_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the start read through psutil, a moved clock made the owner look gone and its guard
    # SIGTERMed live engines: the likely cause of CI's engines killed mid-start and mid-profile.
    from autotuner.core import guard

    family = start_family()
    checks = 0
    real = procs.same_process

    def counted(pid: int, stamp: float) -> bool:
        nonlocal checks
        checks += 1
        alive = real(pid, stamp)
        if checks == 3:  # three checks with the clock moved kept the family: end it now
            procs.kill_group(family.pid, [], grace_s=5)
        return alive

    monkeypatch.setattr(procs, "same_process", counted)
    _move_the_wall_clock(monkeypatch, 1.0)
    try:
        # 0: the family ended on its own (here: by the test), 1: the guard killed it
        assert guard.watch(os.getpid(), procs.own_start_stamp(), family.pid, 0.01) == 0
        assert checks == 3
    finally:
        procs.kill_group(family.pid, [], grace_s=2)
        family.wait(timeout=5)


@pytest.mark.parametrize("pid", [-1, 0, 2**40])
@pytest.mark.parametrize("stamp", [float("nan"), float("inf"), -1.0, 0.0, 1e12])
def test_an_owner_read_from_a_hostile_record_is_no_process(pid: int, stamp: float) -> None:
    assert procs.start_stamp(pid) is None
    assert not procs.same_process(pid, stamp)
