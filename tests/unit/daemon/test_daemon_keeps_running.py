"""The service keeps running (issue 27, section 3): a schedule that never fires, a webhook that
never answers, a flood of slow submissions, a full state disk and damaged rows of daemon.db
each end as a clear refusal or one failed job or SLA, never as the end of the daemon's loop."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from autotuner.cli.main import main
from autotuner.daemon import alerts, api, jobs, kinds, schedules, service, submissions, workers
from autotuner.daemon.config import ConfigError, load_config
from autotuner.daemon.errors import StoreDamaged, SubmitError
from autotuner.daemon.service import Daemon
from autotuner.daemon.store import Store
from autotuner.sla.spec import Sla, parse_sla

from .conftest import SLA, FullDisk, api_client, bearer, make_daemon

NEVER = "0 0 30 2 *"  # 30 February
PARSE_SLOTS = 2  # SLAs validated at once (docs/daemon.md, HTTP API)


async def _until(what: str, done: Callable[[], bool], within_s: float = 10.0) -> None:
    """Wait for ``done()``, polling; fail (not hang) after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s:.0f} s: {what}")
        await asyncio.sleep(0.02)


def _quiet(d: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """No engine probing (it would start interpreters) in a loop under test."""

    async def nothing() -> None:
        return None

    monkeypatch.setattr(d, "_scan_engines_safely", nothing)


def _child_job(monkeypatch: pytest.MonkeyPatch, marker: Path) -> None:
    """Tune jobs are a Python child that leaves ``marker`` and exits (it started)."""
    code = f"open({str(marker)!r}, 'w').close()"
    monkeypatch.setattr(jobs, "tune_argv", lambda *a: [sys.executable, "-c", code])


async def _stop(d: Daemon, loops: asyncio.Task[None]) -> None:
    await d.stop()
    d.wake.set()
    await asyncio.wait_for(loops, 10)


def _drop(d: Daemon, name: str) -> None:
    """An SLA file in the spool, old enough to be taken at the next two scans."""
    f = d.root / "spool" / f"{name}.yaml"
    f.write_text(SLA.format(name=name))
    old = time.time() - 60
    os.utime(f, (old, old))


async def _nothing(*args: Any) -> None:
    return None


def _promote(d: Daemon, name: str) -> None:
    promotion = {"engine": "eng-a", "label": "trial-3", "params": {"max_num_seqs": 8}}
    d.store.update_sla(name, promotion={**promotion, "meets_sla": True, "goodput": 2.0})


# --------------------------------------------------------------------------- 1: schedules


def test_a_schedule_that_never_fires_is_refused_by_the_api_and_the_config(
    daemon: Daemon, tmp_path: Path
) -> None:
    async def go() -> None:
        client = await api_client(daemon)
        try:
            r = await client.post(
                "/v1/studies",
                params={"schedule": NEVER},
                data=SLA.format(name="s"),
                headers=bearer(daemon.token),
            )
            assert r.status == 400
            assert "never fires" in (await r.json())["error"]
        finally:
            await client.close()

    asyncio.run(go())
    assert daemon.store.slas() == [] and daemon.store.jobs() == []
    with pytest.raises(SubmitError, match="never fires"):
        daemon.submit(SLA.format(name="s"), source="s.yaml", base_dir=None, schedule=NEVER)
    f = tmp_path / "daemon.yaml"
    f.write_text(f"schedule: '{NEVER}'\n")
    with pytest.raises(ConfigError, match=r"schedule: .*never fires"):
        load_config(f)


def test_an_sla_whose_schedule_fails_is_reported_once_and_the_loop_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = make_daemon(tmp_path / "state")
    _quiet(d, monkeypatch)
    monkeypatch.setattr(d, "dispatch", _nothing)  # nothing is started here
    # As an older daemon accepted it: a schedule that never fires, and a due SLA beside it.
    d.store.add_sla("never", SLA.format(name="never"), NEVER, "eng-a")
    _promote(d, "never")
    d.store.add_sla("nightly", SLA.format(name="nightly"), "0 2 * * *", "eng-a")
    _promote(d, "nightly")
    d.store.update_sla("nightly", next_check=time.time() - 1)

    async def go() -> None:
        loops = asyncio.create_task(d.run_loops())
        try:
            await _until("a re-check of the due SLA", lambda: bool(d.store.jobs()))
            await asyncio.sleep(0.05)
            assert not loops.done(), loops.exception()
        finally:
            await _stop(d, loops)

    try:
        asyncio.run(go())
        assert [(j.kind, j.sla) for j in d.store.jobs()] == [("recheck", "nightly")]
        failed = [a for a in d.store.alerts() if a["kind"] == "schedule_failed"]
        assert len(failed) == 1 and failed[0]["sla"] == "never"
        assert NEVER in failed[0]["summary"] and "never fires" in failed[0]["summary"]
        schedules.tick(d, time.time() + 86_400)  # again: reported once, not at every tick
        assert len([a for a in d.store.alerts() if a["kind"] == "schedule_failed"]) == 1
    finally:
        d.close()


def test_one_jobs_broken_bookkeeping_fails_that_job_not_the_loop(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    _child_job(monkeypatch, marker)
    real = kinds.Tune.argv

    def argv(self: kinds.Tune, d: Daemon, job: Any, row: Any) -> list[str]:
        if job.sla == "broken":
            raise RuntimeError("a promotion record it can't use")
        return real(self, d, job, row)

    monkeypatch.setattr(kinds.Tune, "argv", argv)
    daemon.submit(SLA.format(name="broken"), source="broken.yaml", base_dir=None, priority=1)
    daemon.submit(SLA.format(name="fine"), source="fine.yaml", base_dir=None)

    async def go() -> None:
        await daemon.dispatch()
        await _until("the other job ends", lambda: not daemon.running)

    asyncio.run(go())
    assert marker.exists()  # the job after the broken one started
    states = {j.sla: j for j in daemon.store.jobs()}
    assert states["broken"].state == "failed"
    assert "a promotion record it can't use" in (states["broken"].error or "")
    assert any(a["kind"] == "job_failed" and a["sla"] == "broken" for a in daemon.store.alerts())


# --------------------------------------------------------------------------- 2: webhooks


def test_a_webhook_that_never_answers_does_not_delay_spool_pickup_or_job_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "started"
    _child_job(monkeypatch, marker)
    seen = {"now": 0, "peak": 0}

    async def go() -> None:
        posted = asyncio.Event()
        open_writers: list[asyncio.StreamWriter] = []

        async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            open_writers.append(writer)
            seen["now"] += 1
            seen["peak"] = max(seen["peak"], seen["now"])
            posted.set()
            try:
                await reader.read()  # until the client gives up
            finally:
                seen["now"] -= 1

        server = await asyncio.start_server(never_answers, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        hook = {"url": f"http://127.0.0.1:{port}/hook", "timeout_s": 600, "max_attempts": 1}
        d = make_daemon(tmp_path / "state", spool_poll_s=0.05, webhooks=[hook])
        _quiet(d, monkeypatch)
        for i in range(10):
            d.alert("sla_violation", f"s{i}", "critical", f"alert {i}", {})
        loops = asyncio.create_task(d.run_loops())
        try:
            await asyncio.wait_for(posted.wait(), 10)  # delivery is under way, and hangs
            _drop(d, "late")
            t0 = time.monotonic()
            await _until("the spool file is picked up", lambda: d.store.get_sla("late") is not None)
            picked = time.monotonic() - t0
            await _until("its job starts", marker.exists)
            started = time.monotonic() - t0
            assert not loops.done()
        finally:
            await _stop(d, loops)
            for w in open_writers:
                w.close()
            server.close()
            await server.wait_closed()
            d.close()
        assert picked < 5 and started < 5, (picked, started)
        # bounded: never more posts at once than the deliverer's workers
        assert 1 <= seen["peak"] <= alerts.MAX_CONCURRENT_DELIVERIES

    asyncio.run(go())


# --------------------------------------------------------------------------- 3: parses


def test_parse_threads_are_bounded_and_a_flood_is_refused_fast(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    lock = threading.Lock()
    count = {"calls": 0, "now": 0, "peak": 0}
    real = parse_sla

    def slow(*args: Any, **kwargs: Any) -> Sla:
        with lock:
            count["calls"] += 1
            count["now"] += 1
            count["peak"] = max(count["peak"], count["now"])
        try:
            release.wait(60)
            text, *rest = args  # its padding is a 1 MiB comment: parsed as it is, ~5 s
            return real(text.split("#", 1)[0], *rest, **kwargs)
        finally:
            with lock:
                count["now"] -= 1

    monkeypatch.setattr(submissions, "parse_sla", slow)
    monkeypatch.setattr(api, "PARSE_TIMEOUT_S", 1.0)
    pad = "#" * (daemon.config.max_request_bytes - 1024) + "\n"  # just under the 1 MiB cap

    async def go() -> None:
        client = await api_client(daemon)
        h = bearer(daemon.token)
        try:
            six = [
                client.post("/v1/studies", data=SLA.format(name=f"big{i}") + pad, headers=h)
                for i in range(6)
            ]
            answers = await asyncio.wait_for(asyncio.gather(*six), 30)
            assert [r.status for r in answers] == [503] * 6
            assert count["peak"] <= PARSE_SLOTS  # not one thread per request
            assert count["calls"] == PARSE_SLOTS  # the others were never parsed
            # Both slots are held by parses whose callers got their 503: refused at once.
            t0 = time.monotonic()
            r = await client.post("/v1/studies", data=SLA.format(name="next"), headers=h)
            assert r.status == 503 and time.monotonic() - t0 < 0.5
            assert "Retry-After" in r.headers and "still running" in (await r.json())["error"]
            assert count["calls"] == PARSE_SLOTS
            # A body no SLA comes in is refused unread.
            form = {**h, "Content-Type": "multipart/form-data; boundary=x"}
            r = await client.post("/v1/studies", data=b"--x--", headers=form)
            assert r.status == 415
            release.set()
            await _until("the stuck parses end", lambda: count["now"] == 0)
            r = await client.post("/v1/studies", data=SLA.format(name="next"), headers=h)
            assert r.status == 201
        finally:
            release.set()
            await client.close()

    asyncio.run(go())
    assert [s.name for s in daemon.store.slas()] == ["next"]
    assert service.PARSE_SLOTS == PARSE_SLOTS


# --------------------------------------------------------------------------- 4: a full disk


def test_a_full_disk_refuses_work_with_507_alerts_and_the_daemon_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full_disk: FullDisk
) -> None:
    marker = tmp_path / "started"
    _child_job(monkeypatch, marker)
    monkeypatch.setattr(service, "DISK_PROBE_S", 0.05, raising=False)
    received: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response()

    def kinds_received() -> list[str]:
        return [m["alerts"][0]["labels"]["kind"] for m in received]

    async def go() -> None:
        app = web.Application()
        app.router.add_post("/hook", hook)
        hooks_server = TestServer(app, host="127.0.0.1")
        await hooks_server.start_server()
        d = make_daemon(tmp_path / "state", webhooks=[{"url": str(hooks_server.make_url("/hook"))}])
        _quiet(d, monkeypatch)
        d.submit(SLA.format(name="queued"), source="queued.yaml", base_dir=None)
        client = await api_client(d)
        h = bearer(d.token)
        full_disk.on = True
        loops = asyncio.create_task(d.run_loops())
        try:
            r = await client.post("/v1/studies", data=SLA.format(name="new"), headers=h)
            assert r.status == 507
            assert "is full" in (await r.json())["error"]
            await _until(
                "a disk_full alert reaches the webhook", lambda: "disk_full" in kinds_received()
            )
            assert not loops.done()
            status = await (await client.get("/v1/status", headers=h)).json()
            assert status["disk"]["full"] and status["alerts"][0]["kind"] == "disk_full"
            assert "is full" in status["queue"][0]["waiting_for"]  # no job starts
            assert not marker.exists()
            metrics = await (await client.get("/metrics", headers=h)).text()
            assert "autotuner_state_disk_full 1.0" in metrics
            r = await client.post("/v1/studies/queued/tune", headers=h)  # any change
            assert r.status == 507

            full_disk.on = False  # space is freed
            await _until("the daemon takes work again", lambda: d.disk.full is None)
            await _until("the queued job starts", marker.exists)
            r = await client.post("/v1/studies", data=SLA.format(name="new"), headers=h)
            assert r.status == 201
            stored = [a for a in d.store.alerts() if a["kind"] == "disk_full"]
            assert len(stored) == 1 and stored[0]["delivered"] == 1  # kept, sent once
            assert kinds_received().count("disk_full") == 1
        finally:
            full_disk.on = False
            await _stop(d, loops)
            await client.close()
            await hooks_server.close()
            d.close()

    asyncio.run(go())


def test_a_restart_on_a_full_disk_keeps_the_daemon_up(tmp_path: Path, full_disk: FullDisk) -> None:
    state = tmp_path / "state"
    d = make_daemon(state)
    job = d.store.enqueue("tune", "x", "eng-a")
    d.store.claim(job)
    d.store.set_pid(job, 999_999, 0.0)  # its daemon died with it
    d.close()

    full_disk.on = True
    d = make_daemon(state)
    try:
        assert workers.recover(d) == []  # nothing could be written, nothing raised
        d.write_address("127.0.0.1", 8787)
        assert d.disk.full is not None
        assert d.list_alerts()[0]["kind"] == "disk_full"
        assert d.store.job(job).state == "running"  # type: ignore[union-attr]
        assert not d.disk.probe()  # still full

        full_disk.on = False
        assert d.disk.probe()
        assert d.store.job(job).state == "queued"  # type: ignore[union-attr]
        assert [a["kind"] for a in d.store.alerts()] == ["disk_full"]
    finally:
        d.close()


# --------------------------------------------------------------------------- 5: damaged rows


def test_a_daemon_db_row_that_is_not_a_json_object_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    state = tmp_path / "state"
    d = make_daemon(state)
    d.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    job = d.store.jobs()[0].id
    d.store.claim(job)
    d.store.set_pid(job, 999_999, 0.0)
    d.close()
    db = sqlite3.connect(state / "daemon.db")
    db.execute("UPDATE jobs SET args='{not json' WHERE id=?", (job,))
    db.commit()

    assert main(["daemon", "--state-dir", str(state), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"jobs row {job}, column args: not valid JSON" in err and "Restore" in err

    db.execute("UPDATE jobs SET args='{}'")
    db.execute("UPDATE slas SET promotion='[1, 2]'")
    db.commit()
    with pytest.raises(StoreDamaged, match="slas row 'p', column promotion: a JSON object"):
        Store(state / "daemon.db")
    db.execute("UPDATE slas SET promotion=NULL")
    db.commit()
    store = Store(state / "daemon.db")
    try:  # a row damaged while the daemon runs: bad input too, never a bare JSON error
        db.execute("UPDATE slas SET summary=?", ("[" * 5000,))
        db.commit()
        with pytest.raises(StoreDamaged, match="column summary: not valid JSON"):
            store.slas()
    finally:
        store.close()
        db.close()
