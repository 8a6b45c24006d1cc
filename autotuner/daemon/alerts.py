"""Alert delivery: JSON webhooks in Alertmanager's webhook format, retried with backoff.

Alerts are rows in the store first and delivered after, so an alert raised just before a
crash is still sent after the restart. The payload has the shape Alertmanager posts to its
webhook receivers (``version: "4"``, ``alerts: [{labels, annotations, startsAt, ...}]``), so
receivers written for Alertmanager accept it unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp

from autotuner.daemon.config import Webhook
from autotuner.daemon.store import Store

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 600.0
MAX_CONCURRENT_DELIVERIES = 4  # alerts posted at once (each to every hook)
MAX_QUEUED_DELIVERIES = 64  # due alerts queued beside them; the rest wait in the store


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


async def post(
    hooks: Sequence[Webhook], session: aiohttp.ClientSession, body: Mapping[str, Any]
) -> list[str]:
    """POST ``body`` to every hook at once (each within its ``timeout_s``); what went wrong."""

    async def one(hook: Webhook) -> str | None:
        try:
            async with session.post(
                hook.url,
                json=body,
                headers=hook.headers,
                timeout=aiohttp.ClientTimeout(total=hook.timeout_s),
            ) as resp:
                return None if resp.status // 100 == 2 else f"{hook.url}: HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return f"{hook.url}: {type(exc).__name__}: {exc}"

    return [e for e in await asyncio.gather(*(one(h) for h in hooks)) if e is not None]


def _record(
    store: Store, hooks: Sequence[Webhook], alert: Mapping[str, Any], errors: list[str]
) -> bool:
    """Store how delivering ``alert`` went; True when every hook accepted it."""
    attempts = int(alert["attempts"]) + 1
    if not errors:
        store.alert_sent(alert["id"], True, next_try=0.0, error=None)
        return True
    if attempts >= max(h.max_attempts for h in hooks):
        store.give_up_alert(alert["id"], "; ".join(errors))
    else:
        store.alert_sent(
            alert["id"], False, next_try=time.time() + backoff(attempts), error="; ".join(errors)
        )
    return False


async def deliver_due(
    store: Store,
    hooks: Sequence[Webhook],
    session: aiohttp.ClientSession,
    external_url: str = "",
) -> int:
    """Send every alert that is due to every webhook, one after the other; returns how many
    were delivered. (The daemon's loop uses :class:`Deliverer` instead, off the loop.)

    An alert counts as delivered when every webhook accepted it (2xx); otherwise it is tried
    again later (all hooks again: receivers must tolerate duplicates, as with Alertmanager).
    """
    sent = 0
    for alert in store.undelivered(time.time()):
        if not hooks:
            store.alert_sent(alert["id"], True, next_try=0.0, error="no webhook configured")
            continue
        errors = await post(hooks, session, payload(alert, external_url))
        sent += _record(store, hooks, alert, errors)
    return sent


class Deliverer:
    """Alert delivery beside the daemon's loop, never in it: a webhook that does not answer
    delays its alerts, not the spool, the queue or a job's start.

    ``kick`` (called by the loop, cheap) queues the alerts that are due; ``concurrency``
    workers post them, each alert to every hook at once, and store the result, which sets
    the alert's next try (backoff) or gives it up. The queue is bounded: alerts beyond it
    wait in the store for a later kick. Alerts the store could not take (its disk is full)
    are in ``unstored`` (the daemon's, shared: :func:`memory_alert`), retried the same way,
    their delivery state kept there.
    """

    def __init__(
        self,
        store: Store,
        hooks: Sequence[Webhook],
        session: aiohttp.ClientSession,
        external_url: Callable[[], str],
        *,
        concurrency: int = MAX_CONCURRENT_DELIVERIES,
        queue_size: int = MAX_QUEUED_DELIVERIES,
        unstored: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        self.store = store
        self.hooks = list(hooks)
        self.session = session
        self.external_url = external_url
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=queue_size)
        self._queued: set[int] = set()  # ids queued or being posted
        self._hold: dict[int, float] = {}  # id -> not before: its result could not be stored
        # negative ids: alerts only in memory (see memory_alert)
        self._unstored = unstored if unstored is not None else {}
        self._workers = [asyncio.create_task(self._work()) for _ in range(concurrency)]

    def kick(self) -> int:
        """Queue what is due (without waiting); returns how many were queued."""
        now = time.time()
        due = [a for a in self._unstored.values() if a["next_try"] <= now]
        due += self.store.undelivered(now)
        queued = 0
        for alert in due:
            key = int(alert["id"])
            if key in self._queued or self._hold.get(key, 0.0) > now:
                continue
            if not self.hooks:  # nothing to send to: done
                self._finish(alert, [])
                continue
            try:
                self._queue.put_nowait(alert)
            except asyncio.QueueFull:
                break  # the rest stays due: a later kick queues it
            self._queued.add(key)
            queued += 1
        return queued

    async def close(self) -> None:
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            alert = await self._queue.get()
            key = int(alert["id"])
            try:
                errors = await post(self.hooks, self.session, payload(alert, self.external_url()))
                self._finish(alert, errors)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. the store's disk is full: try later, not now
                logger.warning("alert %s: delivery not recorded: %s", key, exc)
                self._hold[key] = time.time() + backoff(int(alert["attempts"]) + 1)
            finally:
                self._queued.discard(key)
                self._queue.task_done()

    def _finish(self, alert: Mapping[str, Any], errors: list[str]) -> None:
        key = int(alert["id"])
        self._hold.pop(key, None)
        if key >= 0:
            if self.hooks:
                _record(self.store, self.hooks, alert, errors)
            else:
                self.store.alert_sent(key, True, next_try=0.0, error="no webhook configured")
            return
        held = self._unstored.get(key)
        if held is None:  # stored meanwhile: the store's copy is delivered from now on
            return
        attempts = int(held["attempts"]) + 1
        if not errors:
            held.update(delivered=1, attempts=attempts, next_try=float("inf"), last_error=None)
        elif attempts >= max(h.max_attempts for h in self.hooks):
            held.update(delivered=-1, attempts=attempts, next_try=float("inf"))
            held["last_error"] = "; ".join(errors)
        else:
            held.update(attempts=attempts, next_try=time.time() + backoff(attempts))
            held["last_error"] = "; ".join(errors)


MAX_UNSTORED = 100  # alerts kept in memory while the store can't take them


def memory_alert(
    unstored: dict[int, dict[str, Any]],
    kind: str,
    sla: str,
    severity: str,
    summary: str,
    details: Mapping[str, Any],
) -> int:
    """Keep an alert the store could not take in ``unstored`` (bounded: the oldest go first);
    returns its id, negative so it never meets a stored one."""
    key = min(unstored, default=0) - 1
    unstored[key] = {
        "id": key,
        "time": time.time(),
        "kind": kind,
        "sla": sla,
        "severity": severity,
        "summary": summary,
        "details": dict(details),
        "delivered": 0,
        "attempts": 0,
        "next_try": 0.0,
        "last_error": None,
    }
    while len(unstored) > MAX_UNSTORED:
        del unstored[max(unstored)]
    return key
