"""`autotuner daemon` (run the service), `autotuner submit` and `autotuner status` (its clients).

Exit 0 on success; 2 for a bad config, a daemon already running on that state directory, a
daemon that can't be reached, or a refused submission; 130 when interrupted.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from autotuner.core.errors import BadInput
from autotuner.core.text import printable
from autotuner.daemon.config import ConfigError, DaemonConfig, load_config
from autotuner.records.daemon import DaemonInfo


def main_daemon(
    config_path: str | None,
    state_dir: str | None,
    host: str | None,
    port: int | None,
    allowed_paths: list[str] | None = None,
) -> int:
    from autotuner.daemon.main import serve

    try:
        config = load_config(
            config_path, state_dir=state_dir, host=host, port=port, allowed_paths=allowed_paths
        )
    except ConfigError as exc:  # its lines name the file and the field: no "error:" prefix
        print(exc, file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(config))
    except OSError as exc:  # the port is taken, the state directory is not writable
        raise BadInput(str(exc)) from exc


# --------------------------------------------------------------------------- client side


def _endpoint(state_dir: str | None, url: str | None, token_file: str | None) -> tuple[str, str]:
    root = Path(state_dir).expanduser() if state_dir else DaemonConfig().state_dir
    if url is None:
        info = DaemonInfo.read_or_none(root / "daemon.json")
        if info is None:
            raise ConfigError(
                f"no running daemon found in {root} (start `autotuner daemon`, or pass --url)"
            )
        url = info.url
    token_path = Path(token_file).expanduser() if token_file else root / "token"
    try:
        token = token_path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the API token {token_path}: {exc.strerror}") from None
    return url.rstrip("/"), token


def call(
    base: str, token: str, method: str, path: str, body: bytes | None = None
) -> tuple[int, Any]:
    req = urllib.request.Request(
        base + path,
        data=body,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/yaml"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"null")
        except ValueError:
            return exc.code, {"error": exc.reason, "errors": [str(exc.reason)]}


def main_submit(
    files: list[str],
    priority: int,
    schedule: str | None,
    state_dir: str | None,
    url: str | None,
    token_file: str | None,
) -> int:
    from urllib.parse import urlencode

    base, token = _endpoint(state_dir, url, token_file)
    ok = True
    for f in files:
        try:
            body = Path(f).read_bytes()
        except OSError as exc:
            print(f"{f}: cannot read: {exc.strerror}", file=sys.stderr)
            ok = False
            continue
        query = {"priority": str(priority), "source": Path(f).name}
        if schedule:
            query["schedule"] = schedule
        try:
            code, data = call(base, token, "POST", f"/v1/studies?{urlencode(query)}", body)
        except OSError as exc:
            raise BadInput(f"cannot reach the daemon at {base}: {exc}") from exc
        if code in (200, 201):
            verb = "queued" if data["created"] else "already registered; queued"
            print(f"{f}: {verb} as {data['sla']} on {data['engine']} (job {data['job']})")
        else:
            ok = False
            for msg in (data or {}).get("errors") or [str(data)]:
                print(msg, file=sys.stderr)
    return 0 if ok else 2


def _age(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M")


def _show(text: str = "") -> None:
    """One line of `status` (after a blank one if it starts with a newline): the daemon's
    answer quotes file names, logs, alerts and lock files from outside, so control
    characters, newlines included, are escaped before they reach the terminal."""
    blank = text.startswith("\n")
    print(("\n" if blank else "") + printable(text.removeprefix("\n")))


def main_status(
    state_dir: str | None, url: str | None, token_file: str | None, as_json: bool
) -> int:
    base, token = _endpoint(state_dir, url, token_file)
    try:
        code, data = call(base, token, "GET", "/v1/status")
    except OSError as exc:
        raise BadInput(f"cannot reach the daemon: {exc}") from exc
    if code != 200:
        raise BadInput(f"HTTP {code}: {data}")
    if as_json:
        print(json.dumps(data, indent=2))  # JSON escapes control characters
        return 0
    d = data["daemon"]
    bound = f" (bound to {d['bind']})" if d.get("bind") and d["bind"] not in d["url"] else ""
    _show(
        f"daemon pid {d['pid']} at {d['url']}{bound}, up since {_age(d['started'])}, "
        f"state {d['state_dir']}"
    )
    _show(f"\nrunning ({len(data['running'])}):")
    for j in data["running"]:
        _show(
            f"  job {j['id']} {j['kind']} {j['sla']} on {j['engine']} "
            f"[{', '.join(j['devices'])}] since {_age(j['started'])}"
        )
        for line in j.get("log_tail", []):
            _show(f"      {line}")
    _show(f"\nqueue ({len(data['queue'])}):")
    for j in data["queue"]:
        why = f" - waiting: {j['waiting_for']}" if j.get("waiting_for") else ""
        _show(
            f"  job {j['id']} {j['kind']} {j['sla']} on {j['engine']} "
            f"(priority {j['priority']}){why}"
        )
    leases = data["leases"]
    _show(f"\ndevices: leased {leases['held'] or 'none'}; draining {leases['draining'] or 'none'}")
    _show("\nSLAs:")
    for s in data["slas"]:
        p = s.get("promotion")
        prom = (
            f"{p['label']} on {p['engine']}, goodput {p['goodput'] or 0:.2f}, "
            f"{'meets' if p['meets_sla'] else 'MISSES'} the SLA ({_age(p['time'])})"
            if p
            else "nothing promoted yet"
        )
        _show(f"  {s['name']}: {prom}; next check {_age(s['next_check'])} ({s['schedule']})")
    checks = data.get("engine_checks") or {}
    if checks:
        _show("\nengine checks (autotuner doctor):")
    for name, c in sorted(checks.items()):
        _show(f"  {name} ({c['engine'] or 'not probed'}): {c['verdict']} ({c['checked']})")
        for f in c["problems"][:5]:
            _show(f"      {f['status']} {f['check']}: {f['found']}")
    refused = data.get("spool") or {}
    if refused.get("rejected"):
        _show(f"\nspool: {refused['rejected']} files refused (see spool/failed/*.error.txt)")
        for r in refused.get("recent", []):
            first = (r.get("errors") or ["refused"])[0]
            _show(f"  {_age(r['time'])} {r['file']}: {first}")
    _show("\nlast alerts:")
    for a in data["alerts"][:5]:
        sent = "sent" if a["delivered"] == 1 else ("gave up" if a["delivered"] < 0 else "pending")
        _show(f"  {_age(a['time'])} {a['severity']} {a['kind']}: {a['summary']} [{sent}]")
    if not data["alerts"]:
        _show("  none")
    return 0
