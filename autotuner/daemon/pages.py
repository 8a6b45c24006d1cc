"""The daemon's pages: what a browser may read, and nothing it may change.

``GET /ui`` is the jobs overview (the running jobs with their live progress, the queue, the
schedules, recent jobs, verdicts and alerts); ``GET /ui/studies/NAME`` is the study's report
page (:mod:`autotuner.bundle.page`, the same page as ``autotuner report --html``).

Credentials: the read-only token (``STATE_DIR/metrics_token``) as the password of HTTP Basic
authentication (any user name), or as ``Authorization: Bearer``. The admin token is refused
here (403) in either form, so it is never typed into a browser nor kept in its password store;
a request that carries a token in its query string (``?token=``, ``?access_token=`` or any
value equal to one of the tokens) is refused (403) whatever its header says, because URLs end
up in histories, logs and Referer headers. No credentials, or wrong ones: 401 with a Basic
challenge, so the browser asks for them.

Every page is rendered by Jinja2 with autoescape on, every string shown with its control
characters escaped (:func:`autotuner.bundle.page.clean`), and sent with a
Content-Security-Policy that allows no source outside the daemon: the overview's only script is
the one with the response's nonce, and it fetches nothing but the page itself (it polls it and
swaps the live part); the study page allows only the sorting script of its template (by hash).
A study page whose SLA has a running or queued job reloads itself (``Refresh``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web
from markupsafe import Markup

from autotuner import __version__
from autotuner.bundle import page as study_page
from autotuner.daemon import jobs, tokens
from autotuner.daemon.service import Daemon

PREFIX = "/ui"
_TEMPLATES = Path(__file__).resolve().parent / "templates"
REFRESH_S = 5  # how often a page polls while a job runs (?refresh=N: 1 to MAX_REFRESH_S)
MAX_REFRESH_S = 3600
# Query parameters that carry a token in the usual conventions: refused on sight.
TOKEN_PARAMS = frozenset({"token", "access_token", "auth", "authorization", "api_key", "key"})
REALM = 'Basic realm="autotuner (read-only token)", charset="UTF-8"'

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_page(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def _refuse(status: int, message: str, *, challenge: bool = False) -> web.Response:
    resp = web.Response(status=status, text=message + "\n", content_type="text/plain")
    if challenge:
        resp.headers["WWW-Authenticate"] = REALM
    _harden(resp)
    return resp


def _token_in_url(request: web.Request, known: Mapping[tokens.Scope, str]) -> bool:
    """A token-carrying query parameter, or a query value or path segment equal to a token."""
    if any(name.lower() in TOKEN_PARAMS for name in request.query):
        return True
    for value in [*request.query.values(), *request.path.split("/")]:
        try:
            raw = value.strip().encode("ascii")
        except UnicodeEncodeError:
            continue
        for token in known.values():
            if hmac.compare_digest(raw, token.encode("ascii")):
                return True
    return False


def _presented(header: str) -> str | None:
    """The token an Authorization header presents (Basic: its password), or None."""
    scheme, _, rest = header.partition(" ")
    rest = rest.strip()
    if scheme.lower() == "bearer":
        return rest or None
    if scheme.lower() != "basic" or not rest:
        return None
    try:
        decoded = base64.b64decode(rest, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, colon, password = decoded.partition(":")
    return password if colon and password else None


async def guard(request: web.Request, handler: Handler, daemon: Daemon) -> web.StreamResponse:
    """Let a page request through with the read-only token; refuse everything else."""
    known: dict[tokens.Scope, str] = {"admin": daemon.token, "metrics": daemon.metrics_token}
    if _token_in_url(request, known):
        return _refuse(
            403,
            "a token in the URL is refused: URLs are kept in histories, logs and Referer "
            "headers. Open the page without it and give the read-only token "
            "(STATE_DIR/metrics_token) as the password when the browser asks.",
        )
    if request.method not in ("GET", "HEAD"):
        return _refuse(405, "the pages are read-only")
    given = _presented(request.headers.get("Authorization", ""))
    if given is None:
        return _refuse(
            401,
            "the pages need the read-only token (STATE_DIR/metrics_token) as the password "
            "(any user name)",
            challenge=True,
        )
    try:
        scope = tokens.scope_of(given, known)
    except tokens.MalformedToken:
        scope = None
    if scope == "admin":
        return _refuse(
            403,
            "the admin token is not accepted by the pages: give the read-only token "
            "(STATE_DIR/metrics_token)",
        )
    if scope is None or not tokens.allows(scope, request.method, request.path):
        return _refuse(401, "wrong token: the pages take the read-only token", challenge=True)
    resp = await handler(request)
    _harden(resp)
    return resp


def _harden(resp: web.StreamResponse) -> None:
    resp.headers.setdefault("Content-Security-Policy", "default-src 'none'")
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "no-referrer"
    resp.headers["X-Frame-Options"] = "DENY"
    resp.headers["Cache-Control"] = "no-store"


def _csp(script: str) -> str:
    return (
        f"default-src 'none'; script-src {script}; style-src 'unsafe-inline'; img-src data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=lambda v: (
            study_page.clean(v) if isinstance(v, str) and not isinstance(v, Markup) else v
        ),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["ago"] = _ago
    return env


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _ago(t: float | None) -> str:
    if t is None:
        return "-"
    s = max(0.0, time.time() - t)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


@cache
def _report_script_hashes() -> str:
    """CSP sources for the study page's own scripts: the hash of each <script> of its
    template (they hold no template expressions, so the page carries them as written)."""
    source = (study_page._TEMPLATES / "report.html.j2").read_text(encoding="utf-8")
    found = []
    for body in re.findall(r"<script>(.*?)</script>", source, flags=re.S):
        digest = base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode()
        found.append(f"'sha256-{digest}'")
    return " ".join(found) or "'none'"


def _refresh(request: web.Request) -> int:
    raw = request.query.get("refresh", "")
    if raw.isdigit() and len(raw) <= 6 and 1 <= int(raw) <= MAX_REFRESH_S:
        return int(raw)
    if raw:
        raise web.HTTPBadRequest(text=f"refresh must be 1 to {MAX_REFRESH_S} seconds\n")
    return REFRESH_S


def _progress(layout: jobs.Layout, job: Mapping[str, Any]) -> dict[str, Any]:
    """A running job's progress as its files say now: a tune's launches by state."""
    if job.get("kind") != "tune":
        return {}
    summary = jobs.study_summary(layout, str(job["sla"]), str(job["engine"]))
    by_state: dict[str, int] = summary.get("trials") or {}
    # The brackets break the finished count down: running and waiting trials are not in it
    # (a running one is named after it).
    done = {s: n for s, n in by_state.items() if s not in ("RUNNING", "WAITING")}
    return {
        "finished": sum(done.values()),
        "by_state": {s.lower(): n for s, n in sorted(done.items())},
        "running": summary.get("running") or [],
        "best_max_load": summary.get("best_max_load"),
        "best_goodput": summary.get("best_goodput"),
        "error": summary.get("error"),
    }


def _overview_data(daemon: Daemon) -> dict[str, Any]:
    """What the overview shows, read on the event loop (the store is not shared across
    threads); the study files are read later, off it."""
    status = daemon.status()
    recent = daemon.store.jobs(states=("done", "failed", "cancelled"), limit=15)
    return {
        "status": status,
        "recent": [j.to_dict() for j in recent],
        "verdicts": daemon.store.verdicts(limit=15),
        "alerts": daemon.list_alerts(limit=15),
    }


def _render_overview(layout: jobs.Layout, data: dict[str, Any], refresh: int, nonce: str) -> str:
    running = [{**j, "progress": _progress(layout, j)} for j in data["status"]["running"]]
    return (
        _environment()
        .get_template("overview.html.j2")
        .render(
            d=data["status"],
            running=running,
            recent=data["recent"],
            verdicts=data["verdicts"],
            alerts=data["alerts"],
            refresh=refresh,
            nonce=nonce,
            version=__version__,
            now=time.time(),
        )
    )


def _render_study(layout: jobs.Layout, name: str, engine: str) -> tuple[int, str]:
    import optuna

    from autotuner.search.storage import check_sqlite

    study_dir = layout.study_dir(name, engine)
    db = study_dir / "study.db"
    if not db.is_file():
        return 404, ""
    url = f"sqlite:///{db}"
    try:
        check_sqlite(url)
        study = optuna.load_study(study_name=name, storage=url)
        return 200, study_page.render(study_page.build(study, study_dir))
    except Exception as exc:  # a study that can't be read gets a page that says so
        return 500, f"{type(exc).__name__}: {exc}"


def add_routes(router: web.UrlDispatcher, daemon: Daemon) -> None:
    """The pages' routes; :func:`guard` must run before them (api.make_app's middleware)."""

    async def overview(request: web.Request) -> web.Response:
        refresh = _refresh(request)
        nonce = secrets.token_urlsafe(18)
        data = _overview_data(daemon)
        html = await asyncio.to_thread(_render_overview, daemon.layout, data, refresh, nonce)
        resp = web.Response(text=html, content_type="text/html", charset="utf-8")
        resp.headers["Content-Security-Policy"] = _csp(f"'nonce-{nonce}'")
        return resp

    async def study(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        row = daemon.store.get_sla(name)
        refresh = _refresh(request)
        if row is None:
            return _message(404, "No such SLA", f"no SLA named {name!r}")
        running = any(j.sla == name for j in (r.job for r in daemon.running.values()))
        queued = any(j.sla == name for j in daemon.store.jobs(states=("queued",), limit=200))
        status, html = await asyncio.to_thread(_render_study, daemon.layout, name, row.engine)
        if status == 404:
            why = "a job of it is queued" if queued else "no tune has started"
            resp = _message(200, f"{name}: no study yet", f"{name} on {row.engine}: {why}.")
        elif status == 500:
            resp = _message(500, f"{name}: the study can't be read", html)
        else:
            resp = web.Response(text=html, content_type="text/html", charset="utf-8")
            resp.headers["Content-Security-Policy"] = _csp(_report_script_hashes())
        if running or queued:  # the page of a study being tuned reloads until it ends
            resp.headers["Refresh"] = str(refresh)
        return resp

    router.add_get(PREFIX, overview)
    router.add_get(PREFIX + "/", overview)
    router.add_get(PREFIX + "/studies/{name}", study)


def _message(status: int, title: str, text: str) -> web.Response:
    html = _environment().get_template("message.html.j2").render(title=title, text=text)
    resp = web.Response(status=status, text=html, content_type="text/html", charset="utf-8")
    resp.headers["Content-Security-Policy"] = _csp("'none'")
    return resp
