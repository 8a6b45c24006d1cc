"""The daemon's status (``GET /v1/status``, ``autotuner status``, the overview page): what
runs and waits, the devices leased, every SLA in brief, recent alerts, the disk, the
engines and the spool's refusals."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from autotuner.daemon import engine_checks, exits
from autotuner.records.promotion import Promotion

if TYPE_CHECKING:
    from autotuner.daemon.service import Daemon


def status(d: Daemon) -> dict[str, Any]:
    running = []
    for job_id, run in d.running.items():
        job = d.store.job(job_id)
        running.append(
            {
                **(job.to_dict() if job else {}),
                "devices": run.devices,
                "log": str(d.layout.log(job_id)),
                "log_tail": exits.tail(d, job_id, 3).splitlines(),
            }
        )
    full = d.disk.full
    return {
        "daemon": {
            "pid": os.getpid(),
            "url": d.url,
            "bind": d.bind,
            "started": d.started,
            "state_dir": str(d.root),
            "stopping": d.stopping,
        },
        "running": running,
        "queue": [
            {**j.to_dict(), "waiting_for": d.waiting.get(j.id)}
            for j in reversed(d.store.jobs(states=("queued",)))
        ],
        "leases": d.leases.snapshot(),
        "slas": [
            {
                "name": r.name,
                "engine": r.engine,
                "schedule": r.schedule,
                "next_check": r.next_check,
                "promotion": _brief(r.promotion),
                "fallback": _brief(r.fallback),
                "summary": r.summary,
            }
            for r in d.store.slas()
        ],
        "alerts": d.list_alerts(limit=10),
        "disk": {
            "full": full is not None,
            "why": full.why if full else None,
            "since": full.since if full else None,
        },
        "engines": d.store.engines(),
        "engine_checks": {n: engine_checks.summary(r) for n, r in d.engine_checks.items()},
        "spool": {
            "rejected": d.store.alert_counts().get("spool_rejected", 0),
            "recent": list(d.spool_refusals)[:5],
        },
    }


def _brief(p: Promotion | None) -> dict[str, Any] | None:
    if p is None:
        return None
    keys = ("engine", "engine_version", "label", "meets_sla", "goodput", "time", "bundle")
    data = p.to_json()
    return {k: data[k] for k in keys}
