"""A re-check's verdict on the SLA (issue 27, section 1): only a re-check that measured the
promoted config and saw it miss the SLA raises ``sla_violation`` and queues a re-tune. One
whose engine failed to start for a transient reason (a host short of memory for a moment)
measured nothing: an error outcome, while ``status`` rightly still says the promoted config
meets the SLA."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from autotuner.daemon import outcomes
from autotuner.daemon.metrics import make_registry, render
from autotuner.daemon.service import Daemon
from autotuner.daemon.store import Job
from autotuner.records.outcome import JobOutcome

from .conftest import SLA

OOM = (
    "engine failed to start (out_of_memory): available memory on node 0 (3.1 GiB) is less "
    "than the KV cache needs (8.0 GiB)"
)


def _recheck(d: Daemon, code: int, message: str | None) -> Job:
    """A re-check job of SLA p that exited ``code``, its outcome file written as bench does."""
    job_id = d.store.enqueue("recheck", "p", "eng-a")
    assert d.store.claim(job_id)
    job = d.store.job(job_id)
    assert job is not None
    path = d.layout.outcome("p", job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    JobOutcome.of_exit("bench", code, message).write(path)
    return job


def _last_check_met(d: Daemon) -> list[float]:
    text = render(make_registry(d.collector())).decode()
    return [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "autotuner_last_check_meets_sla" and s.labels.get("sla") == "p"
    ]


def test_a_recheck_whose_engine_failed_to_start_is_no_sla_violation(daemon: Daemon) -> None:
    # Was: "ALERT critical sla_violation: ... the engine failed to start; re-tuning" and a
    # full re-tune, while `autotuner status` said the promoted config meets the SLA.
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    for queued in daemon.store.jobs():
        daemon.store.finish(queued.id, "done")
    promotion = {"engine": "eng-a", "label": "trial-3", "params": {"max_num_seqs": 8}}
    daemon.store.update_sla(
        "p", promotion={**promotion, "meets_sla": True, "goodput": 2.0, "time": time.time()}
    )
    job = _recheck(daemon, 3, OOM)
    outcome = outcomes.recheck_done(daemon, job, 3)
    daemon.store.finish(job.id, "done", exit_code=3, outcome=outcome)
    assert outcome["meets_sla"] is None and OOM in outcome["error"]
    (alert,) = daemon.store.alerts()
    assert (alert["kind"], alert["severity"]) == ("job_failed", "warning")
    assert "measured nothing (exit 3: engine failed to start (out_of_memory)" in alert["summary"]
    assert "no re-tune is queued" in alert["summary"]
    assert daemon.store.pending("p", "tune") is None
    row = daemon.store.get_sla("p")
    assert row is not None and row.promotion is not None and row.promotion.meets_sla is True
    assert _last_check_met(daemon) == []  # no check to report, not "missed"

    # A re-check that measured a miss is still the SLA's verdict.
    job = _recheck(daemon, 1, None)
    outcome = outcomes.recheck_done(daemon, job, 1)
    daemon.store.finish(job.id, "done", exit_code=1, outcome=outcome)
    alert = daemon.store.alerts()[0]
    assert (alert["kind"], alert["severity"]) == ("sla_violation", "critical")
    assert alert["summary"].endswith("on eng-a: it missed the SLA; re-tuning")
    assert daemon.store.pending("p", "tune") is not None
    assert _last_check_met(daemon) == [0.0]
