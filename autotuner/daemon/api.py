"""The daemon's HTTP API (aiohttp). Every request needs ``Authorization: Bearer <token>``,
except the read-only pages under ``/ui`` (:mod:`autotuner.daemon.pages`, with their own rule:
the read-only token, as an HTTP Basic password or a bearer token, never the admin token).

The admin token is in ``<state_dir>/token``, the read-only one (``GET /metrics`` only) in
``<state_dir>/metrics_token`` (both mode 0600; :mod:`autotuner.daemon.tokens`): no header or
a malformed one gives 401, a wrong token 403, the metrics token anywhere else 403. Bodies
larger than ``max_request_bytes`` get 413 before they are read; numbers in queries and paths
outside their bounds get 400. An SLA is validated on a thread of its own, so a slow parse
never stalls the other requests, and at most ``PARSE_SLOTS`` such threads run at once (a 503
with ``Retry-After`` when they are taken by parses that outlived their time limit, or too many
submissions wait): a body that is not YAML (415) or comes while no slot will be free is
refused before it is read. While the state directory's disk is full, every change is 507.
``GET /v1/openapi.json`` describes every route.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from autotuner import __version__
from autotuner.daemon import actions, pages, submissions, tokens, workers
from autotuner.daemon.errors import SubmitError
from autotuner.daemon.metrics import make_registry, render
from autotuner.daemon.offload import ParsesBusy
from autotuner.daemon.service import Daemon
from autotuner.daemon.submissions import MAX_EXTRA_TRIALS, MAX_PRIORITY

PARSE_TIMEOUT_S = 60.0  # an SLA whose validation (and wait for a slot) takes longer: 503
RETRY_AFTER_S = 30  # what a 503 for busy validation slots suggests
# Bodies an SLA may come in: YAML by any of its names, plain text, JSON (YAML's subset), and
# what curl and generic clients send without being told. Anything else is refused unread.
SLA_CONTENT_TYPES = frozenset(
    {
        "application/yaml",
        "application/x-yaml",
        "text/yaml",
        "text/x-yaml",
        "text/plain",
        "application/json",
        "application/octet-stream",
        "application/x-www-form-urlencoded",
    }
)
MAX_LIMIT = 100_000  # ?limit= of the listings
MAX_ID = 2**63 - 1  # SQLite's largest integer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DAEMON: web.AppKey[Daemon] = web.AppKey("daemon", Daemon)
REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)


def _error(status: int, messages: list[str]) -> web.Response:
    return web.json_response(
        {"error": messages[0] if messages else "", "errors": messages}, status=status
    )


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    daemon = request.app[DAEMON]
    if pages.is_page(request.path):
        return await pages.guard(request, handler, daemon)
    header = request.headers.get("Authorization", "")
    if not header:
        resp = _error(
            401, [f"missing 'Authorization: Bearer <token>' (token file: {daemon.root / 'token'})"]
        )
        resp.headers["WWW-Authenticate"] = 'Bearer realm="autotuner"'
        return resp
    scheme, _, given = header.partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given:
        return _error(403, ["invalid token"])
    try:
        scope = tokens.scope_of(given, {"admin": daemon.token, "metrics": daemon.metrics_token})
    except tokens.MalformedToken as exc:
        resp = _error(401, [f"malformed bearer token: {exc}"])
        resp.headers["WWW-Authenticate"] = 'Bearer realm="autotuner", error="invalid_token"'
        return resp
    if scope is None:
        return _error(403, ["invalid token"])
    if not tokens.allows(scope, request.method, request.path):
        return _error(403, ["this token may only read /metrics and the pages under /ui"])
    return await handler(request)


@web.middleware
async def _size_limit(request: web.Request, handler: Handler) -> web.StreamResponse:
    limit = request.app[DAEMON].config.max_request_bytes
    if request.content_length is not None and request.content_length > limit:
        return _error(413, [f"request body of {request.content_length} bytes exceeds {limit}"])
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, [f"request body exceeds {limit} bytes"])


@web.middleware
async def _disk_full(request: web.Request, handler: Handler) -> web.StreamResponse:
    """507 for a change while the state directory's disk is full (before the body is read),
    and for one that finds it full: the daemon goes on, reads still work."""
    daemon = request.app[DAEMON]
    if request.method not in ("GET", "HEAD", "OPTIONS") and daemon.disk.full is not None:
        return _error(507, [daemon.disk.message()])
    try:
        return await handler(request)
    except Exception as exc:
        if not daemon.disk.note(exc, f"{request.method} {request.path}"):
            raise
        return _error(507, [daemon.disk.message()])


def _bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": message, "errors": [message]}), content_type="application/json"
    )


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if len(raw) > 40:  # int() of a huge string is slow, and the value is out of bounds anyway
        raise _bad_request(f"{name} must be an integer between {low} and {high}")
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"{name} must be an integer", "errors": []}),
            content_type="application/json",
        ) from None
    if not low <= value <= high:
        raise _bad_request(f"{name} must be an integer between {low} and {high}, got {value}")
    return value


async def submit(request: web.Request) -> web.Response:
    daemon = request.app[DAEMON]
    # every check before any write: a bad priority must not leave an SLA without its job
    priority = _int_param(request, "priority", 0, -MAX_PRIORITY, MAX_PRIORITY)
    source = request.query.get("source", "submission.yaml")
    # Refused before the body is read: a type no SLA comes in, or no validation slot soon.
    if request.content_type not in SLA_CONTENT_TYPES:
        found = request.content_type
        return _error(415, [f"{source}: an SLA is YAML (application/yaml), not {found}"])
    busy = daemon.parses.busy()
    if busy is not None:
        return _busy(source, busy)
    body = await request.read()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return _error(400, ["body must be UTF-8 YAML"])
    try:
        prepared = await daemon.parses.run(
            PARSE_TIMEOUT_S,
            submissions.prepare,
            daemon.config,
            text,
            source=source,
            base_dir=None,
            schedule=request.query.get("schedule"),
        )
        result = daemon.register(prepared, priority=priority)
    except SubmitError as exc:
        return _error(exc.status, exc.messages)
    except ParsesBusy as exc:
        return _busy(source, str(exc))
    except TimeoutError:
        return _error(503, [f"{source}: validating it took over {PARSE_TIMEOUT_S:.0f} s"])
    return web.json_response(result, status=201 if result["created"] else 200)


def _busy(source: str, why: str) -> web.Response:
    resp = _error(503, [f"{source}: not validated now: {why}; try again later"])
    resp.headers["Retry-After"] = str(RETRY_AFTER_S)
    return resp


async def list_studies(request: web.Request) -> web.Response:
    return web.json_response(request.app[DAEMON].status()["slas"])


async def get_study(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    study = actions.study(request.app[DAEMON], name)
    if study is None:
        return _error(404, [f"no SLA named {name!r}"])
    return web.json_response(study)


async def delete_study(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if not actions.delete_sla(request.app[DAEMON], name):
        return _error(404, [f"no SLA named {name!r}"])
    return web.json_response({"deleted": name})


async def action(request: web.Request) -> web.Response:
    """POST /v1/studies/{name}/tune or /check: queue a re-tune or a re-check now."""
    daemon = request.app[DAEMON]
    name, what = request.match_info["name"], request.match_info["action"]
    try:
        if what == "tune":
            extra = _int_param(request, "trials", 0, 0, MAX_EXTRA_TRIALS)
            job = actions.tune_now(daemon, name, extra=extra)
        else:
            job = actions.check_now(daemon, name)
    except SubmitError as exc:
        return _error(exc.status, exc.messages)
    return web.json_response({"job": job}, status=202)


async def list_jobs(request: web.Request) -> web.Response:
    states = tuple(s for s in request.query.get("state", "").split(",") if s)
    limit = _int_param(request, "limit", 200, 0, MAX_LIMIT)
    jobs = actions.jobs(request.app[DAEMON], states, limit=limit)
    return web.json_response([j.to_dict() for j in jobs])


async def get_job(request: web.Request) -> web.Response:
    job = actions.job(request.app[DAEMON], _job_id(request))
    if job is None:
        return _error(404, ["no such job"])
    return web.json_response(job.to_dict())


async def cancel_job(request: web.Request) -> web.Response:
    state = workers.cancel(request.app[DAEMON], _job_id(request))
    if state is None:
        return _error(404, ["no such job"])
    if state not in ("queued", "running"):
        return _error(409, [f"job already {state}"])
    return web.json_response(
        {"was": state, "now": "cancelled" if state == "queued" else "stopping"}
    )


def _job_id(request: web.Request) -> int:
    raw = request.match_info["id"]
    try:
        value = int(raw) if len(raw) <= 40 else None
    except ValueError:
        raise web.HTTPNotFound() from None
    if value is None or not -MAX_ID <= value <= MAX_ID:
        raise _bad_request(f"job id out of range: at most {MAX_ID}")
    return value


async def status(request: web.Request) -> web.Response:
    return web.json_response(request.app[DAEMON].status())


async def list_alerts(request: web.Request) -> web.Response:
    limit = _int_param(request, "limit", 100, 0, MAX_LIMIT)
    return web.json_response(request.app[DAEMON].list_alerts(limit=limit))


async def list_engines(request: web.Request) -> web.Response:
    return web.json_response(actions.engines(request.app[DAEMON]))


async def metrics(request: web.Request) -> web.Response:
    body = render(request.app[REGISTRY])
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(OPENAPI)


def make_app(daemon: Daemon) -> web.Application:
    app = web.Application(
        middlewares=[_auth, _size_limit, _disk_full],
        client_max_size=daemon.config.max_request_bytes,
    )
    app[DAEMON] = daemon
    app[REGISTRY] = make_registry(daemon.collector())
    r = app.router
    r.add_post("/v1/studies", submit)
    r.add_get("/v1/studies", list_studies)
    r.add_get("/v1/studies/{name}", get_study)
    r.add_delete("/v1/studies/{name}", delete_study)
    r.add_post("/v1/studies/{name}/{action:tune|check}", action)
    r.add_get("/v1/jobs", list_jobs)
    r.add_get("/v1/jobs/{id}", get_job)
    r.add_post("/v1/jobs/{id}/cancel", cancel_job)
    r.add_delete("/v1/jobs/{id}", cancel_job)
    r.add_get("/v1/status", status)
    r.add_get("/v1/alerts", list_alerts)
    r.add_get("/v1/engines", list_engines)
    r.add_get("/v1/openapi.json", openapi)
    r.add_get("/metrics", metrics)
    pages.add_routes(r, daemon)
    return app


def _op(summary: str, **extra: Any) -> dict[str, Any]:
    return {"summary": summary, "responses": {"200": {"description": "OK"}}, **extra}


_NAME = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
_ID = [
    {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": {"type": "integer", "minimum": -MAX_ID, "maximum": MAX_ID},
    }
]
_LIMIT = {
    "name": "limit",
    "in": "query",
    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
}

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "autotuner daemon", "version": __version__},
    "components": {
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "basic": {"type": "http", "scheme": "basic"},
        }
    },
    "security": [{"bearer": []}],
    "paths": {
        "/v1/studies": {
            "post": _op(
                "Submit an SLA (YAML body); queues its study",
                parameters=[
                    {
                        "name": "priority",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": -MAX_PRIORITY,
                            "maximum": MAX_PRIORITY,
                        },
                    },
                    {
                        "name": "schedule",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "cron expression of the nightly re-check",
                    },
                    {
                        "name": "source",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "file name used in error messages",
                    },
                ],
                requestBody={"content": {"application/yaml": {"schema": {"type": "string"}}}},
                responses={
                    "201": {"description": "registered and queued"},
                    "200": {"description": "already registered with the same content"},
                    "400": {"description": "invalid SLA: one message per problem"},
                    "409": {"description": "a different SLA has that name"},
                    "413": {"description": "body too large"},
                    "415": {"description": "not a YAML body (Content-Type)"},
                    "503": {"description": "validation busy or too slow; Retry-After"},
                    "507": {"description": "the state directory's disk is full"},
                },
            ),
            "get": _op("List SLAs with their promotion and study summary"),
        },
        "/v1/studies/{name}": {
            "get": _op(
                "One SLA: definition, promotion, fallback, jobs, verdicts", parameters=_NAME
            ),
            "delete": _op("Unregister an SLA and cancel its jobs (files stay)", parameters=_NAME),
        },
        "/v1/studies/{name}/tune": {
            "post": _op(
                "Queue a re-tune now",
                parameters=[
                    *_NAME,
                    {
                        "name": "trials",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_EXTRA_TRIALS},
                        "description": "launches to add to the study's budget",
                    },
                ],
            )
        },
        "/v1/studies/{name}/check": {"post": _op("Queue a re-check now", parameters=_NAME)},
        "/v1/jobs": {
            "get": _op(
                "Jobs, newest first",
                parameters=[
                    {
                        "name": "state",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "comma-separated: queued,running,done,failed,cancelled",
                    },
                    _LIMIT,
                ],
            )
        },
        "/v1/jobs/{id}": {
            "get": _op("One job", parameters=_ID),
            "delete": _op("Cancel a job (a running one is stopped cleanly)", parameters=_ID),
        },
        "/v1/jobs/{id}/cancel": {"post": _op("Cancel a job", parameters=_ID)},
        "/v1/status": {"get": _op("Queue, running jobs, device leases, promotions, alerts")},
        "/v1/alerts": {
            "get": _op("Alerts, newest first, with delivery state", parameters=[_LIMIT])
        },
        "/v1/engines": {"get": _op("Engine environments and the versions last seen")},
        "/v1/openapi.json": {"get": _op("This description")},
        "/ui": {
            "get": _op(
                "The jobs overview, an HTML page for a browser (read-only token as the HTTP "
                "Basic password; the admin token and any token in the query string are refused)",
                security=[{"basic": []}],
            )
        },
        "/ui/studies/{name}": {
            "get": _op(
                "The study's report page (HTML), as `autotuner report --html` writes it",
                parameters=_NAME,
                security=[{"basic": []}],
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics (text exposition format); the read-only metrics token "
                "(STATE_DIR/metrics_token) is enough here and nowhere else"
            )
        },
    },
}
