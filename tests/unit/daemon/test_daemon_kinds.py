"""The daemon's job-kind table, and the service facade the HTTP API goes through."""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from autotuner.daemon import actions, api, kinds
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.errors import SubmitError, UnknownJobKind
from autotuner.daemon.service import Daemon
from autotuner.daemon.store import JOB_KINDS, SlaRow
from autotuner.engines import envs

from .conftest import SLA, engine_env, make_daemon


@pytest.fixture
def daemon(tmp_path: Path, registry: dict[str, envs.EngineEnv]) -> Iterator[Daemon]:
    registry["eng-b"] = engine_env("eng-b")  # a second engine to pin SLAs to
    d = make_daemon(tmp_path / "state")
    yield d
    d.close()


def _submitted(d: Daemon, name: str = "p") -> SlaRow:
    d.submit(SLA.format(name=name), source=f"{name}.yaml", base_dir=None)
    row = d.store.get_sla(name)
    assert row is not None
    return row


def _promote(d: Daemon, name: str) -> SlaRow:
    promotion = {"engine": "eng-a", "label": "trial-3", "params": {"max_num_seqs": 8}}
    d.store.update_sla(name, promotion={**promotion, "meets_sla": True, "goodput": 2.0})
    row = d.store.get_sla(name)
    assert row is not None
    return row


# --------------------------------------------------------------------------- the table


def test_every_stored_kind_has_one_object_with_its_result_codes() -> None:
    assert tuple(kinds.KINDS) == JOB_KINDS
    assert {name: sorted(k.results) for name, k in kinds.KINDS.items()} == {
        "tune": [0, 1],  # 1: nothing met the SLA, still a finished study
        "recheck": [0, 1],  # 1: missed the SLA; 3 (the engine failed) is no verdict
        "regression": [0],
    }
    assert all(2 not in k.results for k in kinds.KINDS.values())  # bad input is never a result
    assert all(3 not in k.results for k in kinds.KINDS.values())  # nor a failed engine
    with pytest.raises(UnknownJobKind, match="unknown job kind 'nightly'"):
        kinds.get("nightly")


def test_tune_argv_and_where_it_runs(daemon: Daemon) -> None:
    row = _submitted(daemon)
    job_id = daemon.store.enqueue("tune", "p", "eng-a", args={"extra_trials": 3})
    job = daemon.store.job(job_id)
    assert job is not None
    argv = kinds.get("tune").argv(daemon, job, row)
    assert argv[:4] == [sys.executable, "-m", "autotuner", "tune"]
    assert argv[4] == str(daemon.layout.sla_file("p", "eng-a"))
    assert argv[argv.index("--trials-dir") + 1] == str(daemon.layout.trials_dir("p", "eng-a"))
    assert argv[argv.index("--extra-trials") + 1] == "3"
    assert "--fresh" in argv  # a re-tune decides on what it measures now
    tune = kinds.get("tune")
    assert tune.leases_devices(DaemonConfig())
    assert tune.leases_devices(DaemonConfig(executor="ray"))  # a local Ray: leased here
    assert not tune.leases_devices(DaemonConfig(executor="ray", ray_address="ray://h:10001"))
    assert kinds.get("recheck").leases_devices(DaemonConfig(executor="ray", ray_address="x"))


def test_recheck_argv_sets_the_promoted_params_and_needs_a_promotion(daemon: Daemon) -> None:
    row = _submitted(daemon)
    recheck = kinds.get("recheck")
    assert recheck.cannot_run(row) == "nothing promoted to re-check"
    row = _promote(daemon, "p")
    assert recheck.cannot_run(row) is None
    job_id = daemon.store.enqueue("recheck", "p", "eng-a")
    job = daemon.store.job(job_id)
    assert job is not None
    argv = recheck.argv(daemon, job, row)
    assert argv[3:5] == ["bench", str(daemon.layout.sla_file("p", "eng-a"))]
    assert argv[argv.index("--set") + 1] == "max_num_seqs=8"
    out = daemon.layout.run_dir("p", job_id) / "result.json"
    assert argv[argv.index("--output") + 1] == str(out)


def test_regression_argv_compares_old_and_new_and_pins_the_sla_to_new(daemon: Daemon) -> None:
    row = _submitted(daemon)
    job_id = daemon.enqueue_regression("p", "eng-a", "eng-b")
    job = daemon.store.job(job_id)
    assert job is not None and job.engine == "eng-b"
    assert not daemon.layout.sla_file("p", "eng-b").exists()
    argv = kinds.get("regression").argv(daemon, job, row)
    assert argv[3] == "compare-engines"
    assert argv[argv.index("--old") + 1] == "eng-a" and argv[argv.index("--new") + 1] == "eng-b"
    assert argv[argv.index("--bundle") + 1] == str(daemon.layout.bundle("p", "eng-a"))
    assert argv[argv.index("--replicates") + 1] == str(daemon.config.regression.replicates)
    assert "name: eng-b" in daemon.layout.sla_file("p", "eng-b").read_text()


def test_dispatch_fails_an_unknown_kind_and_cancels_a_recheck_with_nothing_promoted(
    daemon: Daemon,
) -> None:
    _submitted(daemon)
    for job in daemon.store.jobs():
        daemon.store.finish(job.id, "done")
    odd = daemon.store.enqueue("nightly", "p", "eng-a")  # type: ignore[arg-type]
    recheck = daemon.enqueue_recheck("p", "eng-a")
    asyncio.run(daemon.dispatch())
    assert daemon.running == {}
    odd_job, recheck_job = daemon.store.job(odd), daemon.store.job(recheck)
    assert odd_job is not None and recheck_job is not None
    assert (odd_job.state, odd_job.error) == ("failed", "unknown job kind 'nightly'")
    assert (recheck_job.state, recheck_job.error) == ("cancelled", "nothing promoted to re-check")


# --------------------------------------------------------------------------- the service


def test_a_racing_submission_of_the_same_name_gets_409(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    _submitted(daemon, "r")
    monkeypatch.setattr(daemon.store, "get_sla", lambda name: None)  # it lost the race
    changed = SLA.format(name="r").replace("rate: 1", "rate: 2")
    with pytest.raises(SubmitError, match="'r' was just submitted") as err:
        daemon.submit(changed, source="r.yaml", base_dir=None)
    assert err.value.status == 409


def test_tune_now_and_check_now_refuse_with_http_statuses(daemon: Daemon) -> None:
    with pytest.raises(SubmitError) as err:
        actions.tune_now(daemon, "none")
    assert err.value.status == 404
    _submitted(daemon)
    with pytest.raises(SubmitError) as err:
        actions.check_now(daemon, "p")
    assert err.value.status == 409
    _promote(daemon, "p")
    job = daemon.store.job(actions.check_now(daemon, "p"))
    assert job is not None and (job.kind, job.engine, job.priority) == ("recheck", "eng-a", 1)
    job = daemon.store.job(actions.tune_now(daemon, "p", extra=4))
    assert job is not None and (job.kind, job.args) == ("tune", {"extra_trials": 4})
    assert daemon.wake.is_set()


def test_the_api_goes_through_the_service_only() -> None:
    tree = ast.parse(inspect.getsource(api))
    touched = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "store" not in touched
    imported = {
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module is not None
    }
    assert "autotuner.daemon.store" not in imported


def test_api_study_actions_answer_as_before(daemon: Daemon) -> None:
    async def go() -> dict[str, Any]:
        client = TestClient(TestServer(api.make_app(daemon)))
        await client.start_server()
        h = {"Authorization": f"Bearer {daemon.token}"}
        try:
            seen: dict[str, Any] = {}
            r = await client.post("/v1/studies/none/tune", headers=h)
            seen["tune_missing"] = (r.status, (await r.json())["error"])
            _submitted(daemon)
            _promote(daemon, "p")
            r = await client.post("/v1/studies/p/check", headers=h)
            seen["check"] = (r.status, (await r.json())["job"])
            r = await client.get("/v1/engines", headers=h)
            seen["engines"] = r.status
            return seen
        finally:
            await client.close()

    seen = asyncio.run(go())
    assert seen["tune_missing"] == (404, "no SLA named 'none'")
    status, job_id = seen["check"]
    job = daemon.store.job(job_id)
    assert status == 202 and job is not None and job.kind == "recheck"


def test_the_daemon_logs_through_logging(daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="autotuner.daemon"):
        _submitted(daemon, "logged")
        daemon.alert("sla_violation", "logged", "critical", "too slow", {})
    messages = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert ("autotuner.daemon.service", logging.INFO, "submitted logged (engine eng-a): job 1") in (
        messages
    )
    assert (
        "autotuner.daemon.service",
        logging.WARNING,
        "ALERT critical sla_violation: too slow",
    ) in messages
