"""Prometheus metrics of the daemon, read from its store at scrape time.

A custom collector (the client_python pattern for state that lives elsewhere) keeps the
numbers exactly what the database says, with no gauges to keep in sync by hand.
``METRIC_NAMES`` lists every family; deploy/'s alert rules and dashboard use only these.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from autotuner.daemon.store import JOB_KINDS, JOB_STATES, Store

VERDICTS = ("regression", "improvement", "no_change", "not_enough_data")
ALERT_KINDS = (
    "engine_regression",
    "sla_violation",
    "throughput_regression",
    "sla_infeasible",
    "retune_not_promoted",
    "job_failed",
    "engine_changed",
    "spool_rejected",
    "schedule_failed",
    "disk_full",
)
TRIAL_STATES = ("COMPLETE", "FAIL", "PRUNED", "RUNNING", "WAITING")

METRIC_NAMES = (
    "autotuner_jobs",
    "autotuner_queue_length",
    "autotuner_trials",
    "autotuner_best_goodput",
    "autotuner_best_max_load",
    "autotuner_sla_feasible",
    "autotuner_promoted_goodput",
    "autotuner_last_promotion_timestamp_seconds",
    "autotuner_regression_verdict",
    "autotuner_regression_goodput_change_ratio",
    "autotuner_engine_info",
    "autotuner_alerts",
    "autotuner_alerts_undelivered",
    "autotuner_alerts_given_up",
    "autotuner_last_check_timestamp_seconds",
    "autotuner_last_check_meets_sla",
    "autotuner_last_check_goodput",
    "autotuner_device_leased",
    "autotuner_daemon_start_time_seconds",
    "autotuner_spool_rejected_total",
    "autotuner_state_disk_full",
)


class StoreCollector(Collector):
    def __init__(
        self,
        store: Store,
        leases: Callable[[], dict[str, Any]],
        started: float,
        disk_full: Callable[[], bool] = lambda: False,
    ) -> None:
        self.store = store
        self.leases = leases
        self.started = started
        self.disk_full = disk_full  # the daemon's, not the store's: the store can't say it

    def collect(self) -> Iterator[Metric]:
        s = self.store
        jobs = GaugeMetricFamily(
            "autotuner_jobs", "Jobs by kind and state", labels=["kind", "state"]
        )
        counts = s.counts()
        for kind in JOB_KINDS:
            for state in JOB_STATES:
                jobs.add_metric([kind, state], counts.get((kind, state), 0))
        yield jobs
        queued = sum(n for (_, st), n in counts.items() if st == "queued")
        yield GaugeMetricFamily("autotuner_queue_length", "Jobs waiting to run", value=queued)

        trials = GaugeMetricFamily(
            "autotuner_trials",
            "Trials of the SLA's current study by state",
            labels=["sla", "state"],
        )
        best = GaugeMetricFamily(
            "autotuner_best_goodput",
            "Highest goodput a feasible trial of the search measured (req/s meeting every SLO)",
            labels=["sla"],
        )
        best_load = GaugeMetricFamily(
            "autotuner_best_max_load",
            "Highest offered load a feasible trial sustained within the SLA (req/s, or "
            "concurrent requests for a concurrency SLA); not a goodput",
            labels=["sla"],
        )
        feasible = GaugeMetricFamily(
            "autotuner_sla_feasible",
            "1 if the promotion in force is confirmed to meet the SLA; 0 if nothing is, as "
            "the latest tune found (none promoted, or a re-tune found nothing)",
            labels=["sla"],
        )
        promoted = GaugeMetricFamily(
            "autotuner_promoted_goodput",
            "Goodput of the promotion in force, as confirmed",
            labels=["sla", "engine"],
        )
        last = GaugeMetricFamily(
            "autotuner_last_promotion_timestamp_seconds",
            "Unix time of the promotion in force",
            labels=["sla"],
        )
        for row in s.slas():
            summary = row.summary or {}
            for tstate in TRIAL_STATES:
                trials.add_metric([row.name, tstate], (summary.get("trials") or {}).get(tstate, 0))
            if summary.get("best_goodput") is not None:
                best.add_metric([row.name], float(summary["best_goodput"]))
            if summary.get("best_max_load") is not None:
                best_load.add_metric([row.name], float(summary["best_max_load"]))
            p = row.promotion
            met = summary.get("sla_met")  # set by every tune since it was added
            if met is None and p is not None:
                met = p.meets_sla
            if met is not None or p is not None:
                feasible.add_metric([row.name], 1.0 if met else 0.0)
            if p is not None:
                if p.goodput is not None:
                    promoted.add_metric([row.name, str(p.engine)], p.goodput)
                last.add_metric([row.name], p.time or 0.0)
        yield from (trials, best, best_load, feasible, promoted, last)

        verdict = GaugeMetricFamily(
            "autotuner_regression_verdict",
            "Latest engine-upgrade verdict per SLA and engine pair (1 for the verdict seen)",
            labels=["sla", "old_engine", "new_engine", "verdict"],
        )
        change = GaugeMetricFamily(
            "autotuner_regression_goodput_change_ratio",
            "Relative goodput change new vs old engine in the latest check",
            labels=["sla", "old_engine", "new_engine"],
        )
        for v in s.latest_verdicts():
            key = [v["sla"], v["old_engine"], v["new_engine"]]
            for name in VERDICTS:
                verdict.add_metric([*key, name], 1.0 if v["verdict"] == name else 0.0)
            for c in json.loads(v["details"]).get("changes", []):
                if c.get("metric") == "goodput" and c.get("change") is not None:
                    change.add_metric(key, float(c["change"]))
        yield from (verdict, change)

        info = GaugeMetricFamily(
            "autotuner_engine_info",
            "Registered engine environments and the version each reports",
            labels=["name", "distribution", "version", "device"],
        )
        for name, e in sorted(s.engines().items()):
            info.add_metric([name, e["distribution"], e["version"], e["device"]], 1.0)
        yield info

        alerts = GaugeMetricFamily("autotuner_alerts", "Alerts raised, by kind", labels=["kind"])
        counted = s.alert_counts()
        for akind in sorted({*ALERT_KINDS, *counted}):  # every kind from 0: increase() works
            alerts.add_metric([akind], counted.get(akind, 0))
        yield alerts
        # one spool_rejected alert per refused file, and alerts are never deleted: a counter
        yield CounterMetricFamily(
            "autotuner_spool_rejected",
            "Files refused in the spool (not regular, too large, incomplete, invalid SLA)",
            value=counted.get("spool_rejected", 0),
        )
        yield GaugeMetricFamily(
            "autotuner_alerts_given_up",
            "Alerts no webhook accepted within max_attempts (they are not retried)",
            value=s.alerts_given_up(),
        )
        when = GaugeMetricFamily(
            "autotuner_last_check_timestamp_seconds",
            "Unix time the last re-check of the promoted config finished",
            labels=["sla"],
        )
        met = GaugeMetricFamily(
            "autotuner_last_check_meets_sla",
            "1 if the last re-check met the SLA, else 0",
            labels=["sla"],
        )
        measured = GaugeMetricFamily(
            "autotuner_last_check_goodput",
            "Goodput the last re-check measured",
            labels=["sla"],
        )
        for job in s.last_rechecks():
            out = job.outcome or {}
            if "meets_sla" in out and out["meets_sla"] is None:
                continue  # measured nothing (the engine failed): no check to report
            when.add_metric([job.sla], float(job.finished or 0.0))
            met.add_metric([job.sla], 1.0 if out.get("meets_sla") else 0.0)
            if isinstance(out.get("goodput"), int | float):
                measured.add_metric([job.sla], float(out["goodput"]))
        yield from (when, met, measured)
        yield GaugeMetricFamily(
            "autotuner_alerts_undelivered",
            "Alerts not yet accepted by every webhook",
            value=s.alerts_pending(),
        )

        leased = GaugeMetricFamily(
            "autotuner_device_leased", "1 while a job holds the device", labels=["device"]
        )
        for dev in sorted(self.leases().get("held", {})):
            leased.add_metric([dev], 1.0)
        yield leased
        yield GaugeMetricFamily(
            "autotuner_daemon_start_time_seconds",
            "Unix time the daemon started",
            value=self.started,
        )
        yield GaugeMetricFamily(
            "autotuner_state_disk_full",
            "1 while writes under the state directory fail for lack of space (new work refused)",
            value=1.0 if self.disk_full() else 0.0,
        )


def make_registry(collector: StoreCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
