"""The nightly re-check and the spool against a real vLLM.

A daemon state is prepared with an SLA whose promotion is the engine defaults and whose
re-check is due, as after a night: the daemon's schedule queues the re-check, which
benchmarks the promoted config on the real engine; it meets the SLA, but at well below the
goodput the promotion recorded (set on purpose to twice the offered rate), so a
``throughput_regression`` alert reaches the webhook. An SLA file dropped into the spool is
registered the same way as over the API.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from autotuner.daemon import jobs
from autotuner.daemon.store import Store
from autotuner.sla.spec import parse_sla

from .conftest import assert_no_leftovers, cpu_sla, run_cli, wait_until
from .test_daemon_real import Receiver

pytestmark = pytest.mark.slow

SLA = cpu_sla(
    "it-recheck",
    {
        "input_tokens": 32,
        "output_tokens": 16,
        "arrival": {"process": "poisson", "rate": 2.0},
        "requests": 16,
        "seed": 3,
    },
    engine="cpu-032",
)


def test_schedule_rechecks_the_promoted_config_and_alerts_on_lost_goodput(
    tmp_path: Path, cli_env: dict[str, str], vllm_python: Path, tag: str
) -> None:
    env = dict(cli_env)
    env.pop("AUTOTUNER_VLLM_PYTHON")
    res = run_cli(["engine", "add", "cpu-032", "--python", str(vllm_python)], env, 120)
    assert res.returncode == 0, res.stderr
    state = tmp_path / "state"
    text = yaml.safe_dump(SLA, sort_keys=False)
    sla = parse_sla(text, "it-recheck.yaml")
    layout = jobs.Layout(state)
    layout.sla_file(sla.name, "cpu-032").parent.mkdir(parents=True)
    layout.sla_file(sla.name, "cpu-032").write_text(jobs.pinned_yaml(sla, "cpu-032"))
    store = Store(state / "daemon.db")
    store.add_sla(sla.name, text, "0 2 * * *", "cpu-032")
    store.update_sla(
        sla.name,
        promotion={
            "engine": "cpu-032",
            "label": "baseline",
            "params": dict(SLA["engine"]["params"]),  # type: ignore[index]
            "meets_sla": True,
            "goodput": 4.0,  # twice the offered rate: the re-check must fall short of it
            "goodput_spread": 0.02,
            "time": time.time() - 86400,
        },
        next_check=time.time() - 1,  # due: the night has come
    )
    store.close()

    receiver = Receiver()
    config = tmp_path / "daemon.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(state),
                "port": 0,
                "webhooks": [{"url": receiver.url}],
                "spool_poll_s": 0.5,
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotuner", "daemon", "--config", str(config)],
        env=env,
        stdout=(tmp_path / "daemon.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        log = tmp_path / "daemon.log"
        wait_until(lambda: "(recheck it-recheck" in log.read_text(), 120, "the re-check to start")
        # Dropped now, its tune waits behind the re-check for the CPU.
        spool_sla = {**SLA, "name": "it-spool"}
        (state / "spool" / "it-spool.yaml").write_text(yaml.safe_dump(spool_sla))
        wait_until(
            lambda: any((state / "spool" / "done").iterdir()), 60, "the spool file to be taken"
        )
        wait_until(
            lambda: any(a["labels"]["kind"] == "throughput_regression" for a in receiver.alerts()),
            600,
            "the re-check's alert",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        receiver.server.shutdown()
    store = Store(state / "daemon.db")
    try:
        rechecks = [j for j in store.jobs() if j.kind == "recheck"]
        assert len(rechecks) == 1 and rechecks[0].state == "done", rechecks
        outcome = rechecks[0].outcome or {}
        assert outcome["meets_sla"] is True
        assert 1.0 < outcome["goodput"] < 2.5  # about the offered 2 req/s, measured for real
        assert outcome["change"] == pytest.approx(outcome["goodput"] / 4.0 - 1.0)
        result = json.loads((layout.run_dir(sla.name, rechecks[0].id) / "result.json").read_text())
        assert result["kind"] == "autotuner.bench"
        assert result["metrics"]["goodput"] == outcome["goodput"]
        row = store.get_sla(sla.name)
        assert row is not None and row.next_check is not None and row.next_check > time.time()
        assert store.get_sla("it-spool") is not None  # registered from the spool
        assert any(j.sla == "it-spool" and j.kind == "tune" for j in store.jobs())
    finally:
        store.close()
    alert = next(a for a in receiver.alerts() if a["labels"]["kind"] == "throughput_regression")
    assert alert["labels"]["sla"] == "it-recheck" and "fell" in alert["annotations"]["summary"]
    assert_no_leftovers(tag)
