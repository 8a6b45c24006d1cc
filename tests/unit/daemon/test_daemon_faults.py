"""The daemon's verdicts against misbehaving engines: its real jobs (``autotuner tune`` and
``autotuner bench`` child processes) on the fault-injection harness, an engine environment
whose interpreter is the stand-in server told to fail (autotuner.testing.standin).

An engine that cannot start is an engine failure: the job fails with ``job_failed``; it never
raises ``sla_infeasible`` or ``sla_violation``, never queues a re-tune and never changes what
``autotuner_sla_feasible`` says.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.metrics import make_registry, render
from autotuner.daemon.service import Daemon
from autotuner.engines import envs
from autotuner.records.outcome import JobOutcome
from autotuner.testing.standin import write_engine_python

SLA = """\
name: {name}
model: {{synth: tiny-llama}}
engine: {{kind: vllm, name: eng-a, startup_timeout_s: 60}}
target: cpu
workload:
  input_tokens: 8
  output_tokens: 4
  arrival: {{process: poisson, rate: 8}}
  requests: 16
  warmup_requests: 0
constraints: {{p50_ttft_ms: 2000}}
search: {{params: {{max_num_seqs: {{values: [4, 32]}}}}}}
tune: {{sampler: grid, max_levels: 2, confirm: {{replicates: 1}}}}
"""


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """A daemon whose one engine environment, eng-a, fails to start (exit 1 at start): the
    registry is real (its jobs are child processes that read it)."""
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    envs.add("eng-a", write_engine_python(tmp_path / "eng-a" / "python", fault="exit"))
    # The generated model lies under the home: jobs may read it (allowed_paths).
    models = tmp_path / "home" / "models"
    models.mkdir(parents=True)
    config = DaemonConfig(state_dir=tmp_path / "state", max_attempts=1, allowed_paths=[models])
    d = Daemon(config)
    yield d
    d.close()


async def _run_jobs(d: Daemon, timeout_s: float = 240.0) -> None:
    """Dispatch queued jobs until none is queued or running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await d.dispatch()
        if not d.running and not d.store.queued(time.time()):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("jobs did not finish in time")


def _kinds(d: Daemon) -> list[str]:
    return [a["kind"] for a in d.store.alerts()]


def test_a_tune_whose_engine_never_starts_is_a_failed_job_not_sla_infeasible(
    daemon: Daemon,
) -> None:
    """Was: tune exited 1 ("no measured config met the SLA"), the job was done and the daemon
    raised a critical sla_infeasible, with autotuner_sla_feasible 0."""
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    asyncio.run(_run_jobs(daemon))
    (job,) = daemon.store.jobs()
    assert (job.kind, job.state, job.exit_code) == ("tune", "failed", 3)
    outcome = JobOutcome.read(daemon.layout.outcome("p", job.id))
    assert (outcome.status, outcome.exit_code) == ("error", 3)
    assert outcome.message is not None and "the engine failed in every launch" in outcome.message
    assert _kinds(daemon) == ["job_failed"]
    row = daemon.store.get_sla("p")
    assert row is not None and row.promotion is None
    assert "sla_met" not in (row.summary or {})  # no verdict exported as sla_feasible
    metrics = render(make_registry(daemon.collector())).decode()
    assert "autotuner_sla_feasible{" not in metrics


def test_a_recheck_whose_engine_never_starts_is_a_failed_job_not_an_sla_violation(
    daemon: Daemon,
) -> None:
    """Was: bench exited 3, which the re-check read as a result: a critical sla_violation
    ("the engine failed to start; re-tuning") and a full re-tune."""
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    for job in daemon.store.jobs():
        daemon.store.finish(job.id, "done")
    promotion = {"engine": "eng-a", "label": "baseline", "params": {}, "meets_sla": True}
    daemon.store.update_sla("p", promotion={**promotion, "goodput": 2.0, "time": time.time()})
    job_id = daemon.enqueue_recheck("p", "eng-a")
    asyncio.run(_run_jobs(daemon))
    job = daemon.store.job(job_id)
    assert job is not None and (job.state, job.exit_code) == ("failed", 3)
    outcome = JobOutcome.read(daemon.layout.outcome("p", job_id))
    assert (outcome.status, outcome.exit_code) == ("error", 3)
    assert _kinds(daemon) == ["job_failed"]
    assert daemon.store.pending("p", "tune") is None  # no re-tune queued
