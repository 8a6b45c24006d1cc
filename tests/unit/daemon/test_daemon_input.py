"""The daemon's input paths under hostile or careless input (issue 15, items 3, 4, 7, 8, 9, 14):
size caps and parsing off the event loop, the spool's robustness, confinement of what an SLA
may make the daemon read and write, the read-only metrics token, bounded numbers, and leases
that hold across every daemon of the host."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autotuner.daemon import actions, jobs, submissions
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.errors import SubmitError
from autotuner.daemon.hostlocks import DeviceBusy, HostLocks
from autotuner.daemon.leases import Leases
from autotuner.daemon.service import Daemon
from autotuner.daemon.spool import scan_spool
from autotuner.sla.spec import Sla, parse_sla

from .conftest import SLA, api_client, bearer, make_daemon

SECRET = "root:x:0:0:root:/root:/bin/bash\n"


def _slow_parse(monkeypatch: pytest.MonkeyPatch, seconds: float) -> dict[str, float]:
    """Every SLA parse takes ``seconds`` more; returns when the first one started and ended."""
    real = parse_sla
    times: dict[str, float] = {}

    def slow(*args: Any, **kwargs: Any) -> Sla:
        times.setdefault("started", time.monotonic())
        time.sleep(seconds)
        times.setdefault("ended", time.monotonic())
        return real(*args, **kwargs)

    monkeypatch.setattr(submissions, "parse_sla", slow)
    return times


def _failed(spool: Path) -> dict[str, Path]:
    """failed/ by original file name: the file (or link, folder, FIFO) and its error text."""
    return {p.name.split("-", 1)[1]: p for p in (spool / "failed").iterdir()}


# --------------------------------------------------------------------------- 3: size, event loop


def test_a_spool_file_over_the_size_cap_is_refused_unread(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*a: Any, **k: Any) -> Sla:
        raise AssertionError("an oversized file was parsed")

    monkeypatch.setattr(submissions, "parse_sla", never)
    spool = daemon.root / "spool"
    cap = daemon.config.max_request_bytes
    (spool / "big.yaml").write_text("#" * (cap + 1))
    assert scan_spool(daemon, min_age_s=0) == [("big.yaml", False)]
    error = _failed(spool)["big.yaml.error.txt"].read_text()
    assert f"limit of {cap} bytes" in error and "not read" in error
    assert daemon.store.slas() == []


def test_text_over_the_cap_never_reaches_the_database(daemon: Daemon) -> None:
    text = SLA.format(name="big") + "#" * daemon.config.max_request_bytes + "\n"
    with pytest.raises(SubmitError) as err:
        daemon.submit(text, source="big.yaml", base_dir=None)
    assert err.value.status == 413
    assert daemon.store.slas() == [] and daemon.store.jobs() == []


def test_a_slow_parse_does_not_stall_the_api(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    parse = _slow_parse(monkeypatch, 1.5)

    async def go() -> None:
        client = await api_client(daemon)
        try:
            post = asyncio.create_task(
                client.post("/v1/studies", data=SLA.format(name="s"), headers=bearer(daemon.token))
            )
            while "started" not in parse:
                await asyncio.sleep(0.01)
            r = await client.get("/v1/status", headers=bearer(daemon.token))
            assert r.status == 200
            assert "ended" not in parse, "the status request waited for the parse"
            assert (await post).status == 201
        finally:
            await client.close()

    asyncio.run(go())


def test_a_slow_spool_parse_does_not_stall_the_daemon_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = make_daemon(tmp_path / "state", spool_poll_s=0.1)
    _slow_parse(monkeypatch, 1.5)

    async def nothing(*a: Any) -> None:
        return None

    monkeypatch.setattr(d, "dispatch", nothing)  # no job is started here
    monkeypatch.setattr(d, "_scan_engines_safely", nothing)
    spool = d.root / "spool"
    (spool / "s.yaml").write_text(SLA.format(name="s"))
    os.utime(spool / "s.yaml", (time.time() - 60, time.time() - 60))

    async def go() -> float:
        loops = asyncio.create_task(d.run_loops())
        worst, last = 0.0, time.monotonic()
        deadline = last + 20
        while not list((spool / "done").iterdir()) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            worst, last = max(worst, now - last), now
        await d.stop()
        d.wake.set()
        await asyncio.wait_for(loops, 10)
        return worst

    try:
        worst = asyncio.run(go())
        assert d.store.get_sla("s") is not None
        assert worst < 0.8, f"the event loop stalled for {worst:.2f} s"
    finally:
        d.close()


# --------------------------------------------------------------------------- 4: the spool


def test_a_file_written_in_place_is_taken_only_once_it_is_stable(daemon: Daemon) -> None:
    spool = daemon.root / "spool"
    f = spool / "slow.yaml"
    head, tail = SLA.format(name="slow").rsplit("constraints", 1)
    old = time.time() - 60
    f.write_text(head)  # a valid SLA without its constraints: the writer paused here
    os.utime(f, (old, old))
    assert scan_spool(daemon, min_age_s=1.0) == []
    assert daemon.store.get_sla("slow") is None
    with f.open("a") as out:
        out.write("constraints" + tail)
    os.utime(f, (old + 1, old + 1))
    assert scan_spool(daemon, min_age_s=1.0) == []  # changed since the last scan
    assert scan_spool(daemon, min_age_s=1.0) == [("slow.yaml", True)]
    row = daemon.store.get_sla("slow")
    assert row is not None and "p99_ttft_ms" in row.yaml
    # write-then-rename, the documented way: a .tmp name is never looked at
    (spool / "next.yaml.tmp").write_text(SLA.format(name="next"))
    assert scan_spool(daemon, min_age_s=1.0) == []
    assert (spool / "next.yaml.tmp").exists()


def test_links_and_special_files_are_refused_unread_and_reported_once(
    daemon: Daemon, tmp_path: Path
) -> None:
    spool = daemon.root / "spool"
    secret = tmp_path / "shadow"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    (spool / "evil.yaml").symlink_to(secret)
    (spool / "dangling.yaml").symlink_to(tmp_path / "nothing-here")
    (spool / "folder.yaml").mkdir()
    os.mkfifo(spool / "pipe.yaml")
    os.link(secret, spool / "hard.yaml")
    t0 = time.monotonic()
    results = scan_spool(daemon, min_age_s=0)
    assert time.monotonic() - t0 < 5  # nothing blocked on the FIFO
    names = ("dangling.yaml", "evil.yaml", "folder.yaml", "hard.yaml", "pipe.yaml")
    assert results == [(n, False) for n in names]
    assert not [p for p in spool.iterdir() if p.name.endswith(".yaml")]
    failed = _failed(spool)
    for name in names:
        assert name in failed, name
        error = failed[f"{name}.error.txt"]
        assert SECRET.strip() not in error.read_text() and "root:x" not in error.read_text()
        assert stat.S_IMODE(error.stat().st_mode) == 0o600
    assert "symbolic link" in failed["evil.yaml.error.txt"].read_text()
    assert "hard link" in failed["hard.yaml.error.txt"].read_text()
    assert scan_spool(daemon, min_age_s=0) == []  # reported once
    assert len([a for a in daemon.store.alerts() if a["kind"] == "spool_rejected"]) == 5


def test_missing_spool_folders_are_created_again(daemon: Daemon) -> None:
    spool = daemon.root / "spool"
    shutil.rmtree(spool)
    assert scan_spool(daemon, min_age_s=0) == []
    assert (spool / "done").is_dir() and (spool / "failed").is_dir()
    shutil.rmtree(spool / "failed")
    shutil.rmtree(spool / "done")
    (spool / "good.yaml").write_text(SLA.format(name="good"))
    (spool / "broken.yaml").write_text("model: {synth: tiny-llama}\nworkload: 3\n")
    assert scan_spool(daemon, min_age_s=0) == [("broken.yaml", False), ("good.yaml", True)]
    assert "broken.yaml.error.txt" in _failed(spool)


def test_one_failing_file_never_stops_the_others(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = submissions.prepare

    def flaky(config: DaemonConfig, text: str, *, source: str, **kw: Any) -> submissions.Submission:
        if source == "a-bad.yaml":
            raise RuntimeError("a bug")
        return real(config, text, source=source, **kw)

    monkeypatch.setattr(submissions, "prepare", flaky)
    spool = daemon.root / "spool"
    (spool / "a-bad.yaml").write_text(SLA.format(name="bad"))
    (spool / "b-good.yaml").write_text(SLA.format(name="good"))
    assert scan_spool(daemon, min_age_s=0) == [("a-bad.yaml", False), ("b-good.yaml", True)]
    assert "a bug" in _failed(spool)["a-bad.yaml.error.txt"].read_text()
    assert daemon.store.get_sla("good") is not None


def test_rejections_reach_the_log_status_metrics_and_alerts(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    spool = daemon.root / "spool"
    (spool / "broken.yaml").write_text("model: {synth: tiny-llama}\nworkload: 3\n")
    with caplog.at_level(logging.WARNING, logger="autotuner.daemon"):
        assert scan_spool(daemon, min_age_s=0) == [("broken.yaml", False)]
    assert any("broken.yaml" in r.getMessage() for r in caplog.records)
    refused = daemon.status()["spool"]
    assert refused["rejected"] == 1 and refused["recent"][0]["file"] == "broken.yaml"
    assert "broken.yaml:2: workload" in refused["recent"][0]["errors"][0]
    alert = daemon.store.alerts()[0]
    assert alert["kind"] == "spool_rejected" and "broken.yaml" in alert["summary"]

    async def go() -> str:
        client = await api_client(daemon)
        try:
            return await (await client.get("/metrics", headers=bearer(daemon.token))).text()
        finally:
            await client.close()

    text = asyncio.run(go())
    assert "autotuner_spool_rejected_total 1.0" in text


def test_a_file_a_dead_daemon_was_handling_is_not_parsed_again(daemon: Daemon) -> None:
    work = daemon.root / "spool" / ".work"
    work.mkdir(exist_ok=True)
    (work / "20260101T000000-hang.yaml").write_text(SLA.format(name="hang"))
    assert scan_spool(daemon, min_age_s=0) == []
    failed = _failed(daemon.root / "spool")
    assert "hang.yaml" in failed and "stopped while" in failed["hang.yaml.error.txt"].read_text()
    assert daemon.store.get_sla("hang") is None and not list(work.iterdir())


# --------------------------------------------------------------------------- 7: confinement


def test_api_sla_storage_and_paths_are_confined(daemon: Daemon, tmp_path: Path) -> None:
    studies = daemon.root / "studies"
    cases = {
        "sqlite:////tmp/elsewhere.db": "tune.storage",
        "postgresql://db.example/optuna": "tune.storage",
        "sqlite:///relative.db": "tune.storage",
        f"sqlite:///{studies}/../daemon.db": "tune.storage",
    }

    async def go() -> None:
        client = await api_client(daemon)
        h = bearer(daemon.token)
        try:
            for i, (url, field) in enumerate(cases.items()):
                text = SLA.format(name=f"st{i}") + f"tune: {{storage: '{url}'}}\n"
                r = await client.post("/v1/studies", data=text, headers=h)
                assert r.status == 400, url
                assert field in (await r.json())["error"], url
            text = SLA.format(name="ok") + f"tune: {{storage: 'sqlite:///{studies}/x.db'}}\n"
            assert (await client.post("/v1/studies", data=text, headers=h)).status == 201

            passwd = SLA.format(name="pw").replace("input_tokens: 16", "dataset: /etc/passwd")
            r = await client.post("/v1/studies", data=passwd, headers=h)
            assert r.status == 400
            error = (await r.json())["error"]
            assert "workload.dataset" in error and "outside" in error
            model = SLA.format(name="m").replace("{synth: tiny-llama}", "{path: /etc}")
            r = await client.post("/v1/studies", data=model, headers=h)
            assert r.status == 400 and "model.path" in (await r.json())["error"]
        finally:
            await client.close()

    asyncio.run(go())
    assert {r.name for r in daemon.store.slas()} == {"ok"}


def test_spool_sla_paths_outside_the_roots_are_never_read(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    import autotuner.workload.replay as replay
    import autotuner.workload.requests as workload

    def never(*a: Any, **k: Any) -> Any:
        raise AssertionError("a dataset outside the allowed paths was read")

    monkeypatch.setattr(workload, "load_dataset", never)
    monkeypatch.setattr(replay, "read_dataset", never)
    monkeypatch.setattr(replay, "read_trace", never)
    spool = daemon.root / "spool"
    (spool / "pw.yaml").write_text(
        SLA.format(name="pw").replace("input_tokens: 16", "dataset: /etc/passwd")
    )
    assert scan_spool(daemon, min_age_s=0) == [("pw.yaml", False)]
    error = _failed(spool)["pw.yaml.error.txt"].read_text()
    assert "workload.dataset" in error and "outside" in error and "root:" not in error


def test_allowed_paths_admit_what_lies_under_them(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "m").mkdir(parents=True)
    (models / "m" / "config.json").write_text("{}")
    (models / "escape").symlink_to("/etc")
    d = make_daemon(tmp_path / "state", allowed_paths=[models])
    try:
        inside = SLA.format(name="in").replace("{synth: tiny-llama}", f"{{path: {models}/m}}")
        assert d.submit(inside, source="in.yaml", base_dir=None)["created"]
        out = SLA.format(name="out").replace("{synth: tiny-llama}", f"{{path: {models}/escape}}")
        with pytest.raises(SubmitError) as err:
            d.submit(out, source="out.yaml", base_dir=None)
        assert err.value.status == 400 and "model.path" in err.value.messages[0]
    finally:
        d.close()


# --------------------------------------------------------------------------- 8: metrics token


def test_the_metrics_token_reads_metrics_and_nothing_else(daemon: Daemon) -> None:
    path = daemon.root / "metrics_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    metrics = path.read_text().strip()
    assert metrics == daemon.metrics_token and metrics != daemon.token and len(metrics) >= 32

    async def go() -> None:
        client = await api_client(daemon)
        try:
            r = await client.get("/metrics", headers=bearer(metrics))
            assert r.status == 200 and "autotuner_jobs" in await r.text()
            for method, path in (("GET", "/v1/status"), ("GET", "/v1/studies")):
                r = await client.request(method, path, headers=bearer(metrics))
                assert r.status == 403, path
            r = await client.post("/v1/studies", data=SLA.format(name="x"), headers=bearer(metrics))
            assert r.status == 403
            r = await client.get("/metrics", headers=bearer(daemon.token))  # admin: everything
            assert r.status == 200
        finally:
            await client.close()

    asyncio.run(go())
    assert daemon.store.slas() == []


# --------------------------------------------------------------------------- 9: bounds


def test_a_non_ascii_token_is_401_not_a_server_error(daemon: Daemon) -> None:
    async def go() -> None:
        client = await api_client(daemon)
        try:
            for token in ("tökén", "\u2603" * 40, daemon.token + "é"):
                r = await client.get("/v1/status", headers=bearer(token))
                assert r.status == 401, token
                assert "malformed" in (await r.json())["error"]
        finally:
            await client.close()

    asyncio.run(go())


def test_numbers_out_of_bounds_are_400_and_write_nothing(daemon: Daemon) -> None:
    huge = str(10**30)

    async def go() -> None:
        client = await api_client(daemon)
        h = bearer(daemon.token)
        try:
            for path in (f"/v1/jobs?limit={huge}", f"/v1/alerts?limit={huge}", "/v1/jobs?limit=-1"):
                assert (await client.get(path, headers=h)).status == 400, path
            r = await client.post(
                f"/v1/studies?priority={huge}", data=SLA.format(name="p"), headers=h
            )
            assert r.status == 400 and "priority" in (await r.json())["error"]
            assert daemon.store.slas() == []  # no SLA left without its job
            assert (await client.get(f"/v1/jobs/{huge}", headers=h)).status == 400
            assert (await client.post(f"/v1/jobs/{huge}/cancel", headers=h)).status == 400
            assert (await client.delete(f"/v1/jobs/{huge}", headers=h)).status == 400
            assert (
                await client.post("/v1/studies", data=SLA.format(name="q"), headers=h)
            ).status == 201
            for trials in ("100000000000000000000000", "10001", "-1"):
                r = await client.post(f"/v1/studies/q/tune?trials={trials}", headers=h)
                assert r.status == 400, trials
            assert (await client.post("/v1/studies/q/tune?trials=5", headers=h)).status == 202
        finally:
            await client.close()

    asyncio.run(go())
    with pytest.raises(SubmitError) as err:
        daemon.submit(SLA.format(name="r"), source="r.yaml", base_dir=None, priority=10**30)
    assert err.value.status == 400 and daemon.store.get_sla("r") is None
    with pytest.raises(SubmitError):
        actions.tune_now(daemon, "q", extra=10**23)


def test_a_bind_beyond_loopback_is_recorded_and_warned_about(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="autotuner.daemon"):
        daemon.write_address("0.0.0.0", 8787)
    info = json.loads((daemon.root / "daemon.json").read_text())
    assert info["bind"] == "0.0.0.0:8787" and info["url"] == "http://127.0.0.1:8787"
    assert daemon.status()["daemon"]["bind"] == "0.0.0.0:8787"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("0.0.0.0:8787" in w and "clear text" in w for w in warnings), warnings
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="autotuner.daemon"):
        daemon.write_address("127.0.0.1", 8787)
        daemon.write_address("::1", 8787)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert daemon.url == "http://[::1]:8787"


# --------------------------------------------------------------------------- 14: host-wide leases


def test_leases_of_two_daemons_sharing_a_lock_dir_exclude_each_other(tmp_path: Path) -> None:
    a = Leases(None, host=HostLocks(tmp_path / "locks", owner="/state/a"))
    b = Leases(None, host=HostLocks(tmp_path / "locks", owner="/state/b"))
    a.acquire(["cpu"], 1)
    why = b.available(["cpu"], set())
    assert why is not None and "another autotuner daemon" in why and "/state/a" in why
    with pytest.raises(DeviceBusy):
        b.acquire(["cpu"], 7)
    assert b.holders == {}
    a.release(1)
    assert b.available(["cpu"], set()) is None
    b.acquire(["cpu"], 7)
    assert a.available(["cpu"], set()) is not None


def test_two_daemons_with_their_own_state_dirs_never_run_on_one_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        jobs, "tune_argv", lambda *a: [sys.executable, "-c", "import time; time.sleep(60)"]
    )
    locks = tmp_path / "locks"
    one = make_daemon(tmp_path / "one", lease_dir=locks)
    two = make_daemon(tmp_path / "two", lease_dir=locks)

    async def go() -> None:
        one.submit(SLA.format(name="a"), source="a.yaml", base_dir=None)
        two.submit(SLA.format(name="b"), source="b.yaml", base_dir=None)
        await one.dispatch()
        await two.dispatch()
        assert len(one.running) == 1 and not two.running
        (waiting,) = two.waiting.values()
        assert "another autotuner daemon" in waiting and str(one.root) in waiting
        await one.stop()
        two.waiting.clear()
        await two.dispatch()
        assert len(two.running) == 1
        await two.stop()

    try:
        asyncio.run(go())
    finally:
        one.close()
        two.close()


def test_a_dead_holder_releases_its_device(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from autotuner.daemon.hostlocks import HostLocks\n"
            "assert HostLocks(Path(sys.argv[1])).take('gpu0')\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
            str(locks),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        mine = HostLocks(locks)
        assert not mine.free("gpu0")
        holder.kill()  # kill -9: no clean-up ran
        holder.wait()
        assert mine.take("gpu0")
        mine.close()
    finally:
        holder.kill()
        holder.wait()


def test_an_sla_with_a_5000_digit_integer_is_400_not_a_server_error(daemon: Daemon) -> None:
    # Issue 40: Python's int conversion limit surfaced as HTTP 500 and a traceback.
    text = SLA.format(name="d").replace("requests: 10", "requests: " + "9" * 5000)

    async def go() -> None:
        client = await api_client(daemon)
        try:
            r = await client.post("/v1/studies", data=text, headers=bearer(daemon.token))
            assert r.status == 400
            assert "an integer of more than" in (await r.json())["error"]
        finally:
            await client.close()

    asyncio.run(go())
    assert daemon.store.slas() == []


def test_an_engine_name_too_long_for_a_file_name_is_refused_everywhere(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 40: `engine add` took 300 characters; the daemon then failed on "File name too
    # long" writing the pinned copy and left slas/NAME/source.yaml without a row.
    from autotuner.cli.main import main

    name = "e" * 300
    assert main(["engine", "add", name, "--python", sys.executable]) == 2
    assert "at most 100 characters, got 300" in capsys.readouterr().err
    text = SLA.format(name="long").replace("name: eng-a", f"name: {name}")
    with pytest.raises(SubmitError) as err:
        daemon.submit(text, source="long.yaml", base_dir=None)
    assert err.value.status == 400 and "at most 100 characters" in str(err.value)
    assert daemon.store.get_sla("long") is None
    assert not daemon.layout.sla_dir("long").exists()
