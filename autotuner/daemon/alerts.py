"""Alert delivery: JSON webhooks in Alertmanager's webhook format, retried with backoff.

Alerts are rows in the store first and delivered after, so an alert raised just before a
crash is still sent after the restart. The payload has the shape Alertmanager posts to its
webhook receivers (``version: "4"``, ``alerts: [{labels, annotations, startsAt, ...}]``), so
receivers written for Alertmanager accept it unchanged.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp

from autotuner.daemon.config import Webhook
from autotuner.daemon.store import Store

MAX_BACKOFF_S = 600.0


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def payload(alert: Mapping[str, Any], external_url: str = "") -> dict[str, Any]:
    """One stored alert as an Alertmanager webhook message."""
    labels = {
        "alertname": "Autotuner" + "".join(w.title() for w in str(alert["kind"]).split("_")),
        "kind": str(alert["kind"]),
        "sla": str(alert["sla"]),
        "severity": str(alert["severity"]),
    }
    details = alert.get("details") or {}
    for key in ("old_engine", "new_engine", "engine", "verdict"):
        if key in details:
            labels[key] = str(details[key])
    annotations = {
        "summary": str(alert["summary"]),
        "description": json.dumps(details, sort_keys=True)[:4000],
    }
    fingerprint = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
    item = {
        "status": "firing",
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(float(alert["time"])),
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": external_url,
        "fingerprint": fingerprint,
        "id": alert["id"],
        "details": details,
    }
    return {
        "version": "4",
        "groupKey": f"autotuner/{alert['sla']}/{alert['kind']}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "autotuner",
        "groupLabels": {"alertname": labels["alertname"]},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": external_url,
        "alerts": [item],
    }


def backoff(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``: 2, 4, 8, ... capped."""
    return float(min(MAX_BACKOFF_S, 2.0 ** max(1, attempts)))


async def deliver_due(
    store: Store,
    hooks: Sequence[Webhook],
    session: aiohttp.ClientSession,
    external_url: str = "",
) -> int:
    """Send every alert that is due to every webhook. Returns how many were delivered.

    An alert counts as delivered when every webhook accepted it (2xx); otherwise it is tried
    again later (all hooks again: receivers must tolerate duplicates, as with Alertmanager).
    """
    sent = 0
    for alert in store.undelivered(time.time()):
        if not hooks:
            store.alert_sent(alert["id"], True, next_try=0.0, error="no webhook configured")
            continue
        body = payload(alert, external_url)
        errors = []
        for hook in hooks:
            try:
                async with session.post(
                    hook.url,
                    json=body,
                    headers=hook.headers,
                    timeout=aiohttp.ClientTimeout(total=hook.timeout_s),
                ) as resp:
                    if resp.status // 100 != 2:
                        errors.append(f"{hook.url}: HTTP {resp.status}")
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                errors.append(f"{hook.url}: {type(exc).__name__}: {exc}")
        attempts = int(alert["attempts"]) + 1
        if not errors:
            store.alert_sent(alert["id"], True, next_try=0.0, error=None)
            sent += 1
        elif attempts >= max(h.max_attempts for h in hooks):
            store.give_up_alert(alert["id"], "; ".join(errors))
        else:
            store.alert_sent(
                alert["id"],
                False,
                next_try=time.time() + backoff(attempts),
                error="; ".join(errors),
            )
    return sent
