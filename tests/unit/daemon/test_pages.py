"""The daemon's pages (/ui): who may read them, what the overview lists, and that whatever came
from a user, a file or an engine is shown as text. tests/unit/daemon/test_pages_browser.py
opens them in a real browser."""

from __future__ import annotations

import asyncio
import base64
import re
from pathlib import Path
from typing import Any

from autotuner.daemon.service import Daemon
from tests.unit.bundle.test_page import promoted_study

from .conftest import SLA, api_client, bearer

HOSTILE = "<script>window.__pwned=1</script>\"'&\x07"


def basic(password: str, user: str = "viewer") -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _get(d: Daemon, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any, str]:
    client = await api_client(d)
    try:
        r = await client.get(path, headers=headers or {})
        return r.status, r.headers, await r.text()
    finally:
        await client.close()


def test_pages_refuse_without_credentials_and_with_wrong_ones(daemon: Daemon) -> None:
    for path in ("/ui", "/ui/studies/p"):
        status, headers, _ = _run(_get(daemon, path))
        assert status == 401
        assert headers["WWW-Authenticate"].startswith("Basic ")
        status, headers, _ = _run(_get(daemon, path, basic("not-the-token")))
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
        status, _, _ = _run(_get(daemon, path, {"Authorization": "Basic !!!"}))
        assert status == 401


def test_the_admin_token_is_refused_in_the_query_string_and_as_the_password(
    daemon: Daemon,
) -> None:
    ro = basic(daemon.metrics_token)
    for query in (f"token={daemon.token}", f"x={daemon.token}", "access_token=abc"):
        for headers in (None, ro, bearer(daemon.token)):
            status, _, text = _run(_get(daemon, f"/ui?{query}", headers))
            assert status == 403, (query, headers)
            assert "a token in the URL is refused" in text
            assert daemon.token not in text
    # The read-only token in a URL is refused too, and a token as a path segment.
    status, _, _ = _run(_get(daemon, f"/ui?t={daemon.metrics_token}", ro))
    assert status == 403
    status, _, text = _run(_get(daemon, f"/ui/studies/{daemon.token}", ro))
    assert status == 403 and daemon.token not in text
    # The admin token as a Basic password, or a bearer token: the pages are not its place.
    for headers in (basic(daemon.token), bearer(daemon.token)):
        status, _, text = _run(_get(daemon, "/ui", headers))
        assert status == 403 and "read-only token" in text

    # A page never changes anything.
    async def post() -> int:
        client = await api_client(daemon)
        try:
            return (await client.post("/ui", headers=ro)).status
        finally:
            await client.close()

    assert _run(post()) == 405
    # The read-only token still opens nothing of the API beyond /metrics.
    status, _, _ = _run(_get(daemon, "/v1/status", bearer(daemon.metrics_token)))
    assert status == 403


def test_the_overview_lists_a_queued_job_and_a_hostile_name_as_text(daemon: Daemon) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    # A name no submission can carry (an older daemon's row, a hand-edited database), an
    # engine name and an alert with markup and a control byte.
    daemon.store.add_sla(HOSTILE, SLA.format(name="x"), "0 2 * * *", "eng-a")
    hostile_job = daemon.store.enqueue("tune", HOSTILE, "eng-a")
    daemon.alert("job_failed", HOSTILE, "warning", f"job failed: {HOSTILE}", {})
    for headers in (basic(daemon.metrics_token), bearer(daemon.metrics_token)):
        status, resp, html = _run(_get(daemon, "/ui", headers))
        assert status == 200
        assert resp["Content-Type"].startswith("text/html")
        csp = resp["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "'unsafe-inline'" not in csp.split("style-src")[0]
        nonce = re.search(r"'nonce-([^']+)'", csp)
        assert nonce is not None
        assert resp["Cache-Control"] == "no-store"
        assert 'id="queue"' in html and 'id="queued-1"' in html and ">p</a>" in html
        assert f'id="queued-{hostile_job}"' in html
        assert "<script>window.__pwned" not in html
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;&#34;&#39;&amp;\\x07" in html
        # The only script is the page's own, carrying this response's nonce.
        assert re.findall(r"<script[^>]*>", html) == [f'<script nonce="{nonce[1]}">']
        assert "http://" not in html and "https://" not in html
        assert daemon.token not in html and daemon.metrics_token not in html


def test_a_study_page_renders(daemon: Daemon) -> None:
    name = "promote-unit"
    daemon.store.add_sla(name, SLA.format(name=name), "0 2 * * *", "eng-a")
    ro = basic(daemon.metrics_token)
    status, _, html = _run(_get(daemon, f"/ui/studies/{name}", ro))
    assert status == 200 and "no study yet" in html  # registered, nothing tuned
    promoted_study(daemon.layout.trials_dir(name, "eng-a"))
    status, resp, html = _run(_get(daemon, f"/ui/studies/{name}", ro))
    assert status == 200
    assert 'id="decision"' in html and "Serve trial 4" in html
    csp = resp["Content-Security-Policy"]
    assert "script-src 'sha256-" in csp and "unsafe-inline" not in csp.split("style-src")[0]
    assert "Refresh" not in resp  # nothing of it runs or waits
    daemon.store.enqueue("recheck", name, "eng-a")
    status, resp, _ = _run(_get(daemon, f"/ui/studies/{name}?refresh=7", ro))
    assert status == 200 and resp["Refresh"] == "7"  # reloads until its job ends
    status, _, html = _run(_get(daemon, "/ui/studies/%3Cb%3Enope", ro))
    assert status == 404 and "&lt;b&gt;nope" in html and "<b>nope" not in html


def test_the_templates_ship_with_the_package() -> None:
    from autotuner.daemon import pages

    assert (pages._TEMPLATES / "overview.html.j2").is_file()
    text = Path(__file__).resolve().parents[3].joinpath("pyproject.toml").read_text()
    assert '"autotuner.daemon" = ["templates/*.j2"]' in text


def test_a_running_trial_is_not_counted_among_the_finished(
    monkeypatch: Any, tmp_path: Path
) -> None:
    """The overview's "N launches finished (state n, ...)": the breakdown adds up to N, and a
    running or waiting trial is in neither (the page names a running one after it)."""
    from autotuner.daemon import jobs, pages

    summary = {"trials": {"COMPLETE": 2, "FAIL": 1, "PRUNED": 1, "RUNNING": 1, "WAITING": 2}}
    monkeypatch.setattr(jobs, "study_summary", lambda *a: summary)
    progress = pages._progress(jobs.Layout(tmp_path), {"kind": "tune", "sla": "s", "engine": "e"})
    assert progress["finished"] == 4
    assert progress["by_state"] == {"complete": 2, "fail": 1, "pruned": 1}
