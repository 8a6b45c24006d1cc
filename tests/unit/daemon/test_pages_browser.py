"""The daemon's pages in a real browser: Debian's ``chromium``, driven headless by Playwright for
Python pointed at the system browser (``executable_path``). .ci/run installs both; without them
these tests skip loudly, except in CI (``CI=true``), where they fail.

The daemon serves its API on 127.0.0.1 from a thread of this process and runs a real job (a
child process standing in for ``autotuner tune``); the job's progress is what the daemon reads
from the study it keeps under its state directory, and the test moves it on by finishing a
launch in that study. The page, polling, must show the change: waited for in the DOM with a
bounded timeout, never with a sleep.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import optuna
import pytest
from aiohttp.test_utils import TestServer
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from autotuner.daemon import jobs
from autotuner.daemon.api import make_app
from autotuner.daemon.service import Daemon
from tests.unit.bundle.test_page import promoted_study

from .conftest import SLA, make_daemon

T = TypeVar("T")
INSTALL = (
    "install them with `apt-get install -y chromium` and `pip install -e '.[test]'` "
    "(playwright; .ci/run does both)"
)
# The job: what a tune does to the daemon (a child process that runs until it is stopped).
JOB = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(130))\n"
    "print('engine <script>window.__pwned=1</script> started', flush=True)\n"
    "time.sleep(300)\n"
)
WAIT_MS = 20_000  # for the page's poll to show a change (it polls every second)


def _missing(why: str) -> None:
    why = f"{why}, so the daemon's pages were NOT tested in a browser: {INSTALL}"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    if executable is None:
        _missing("chromium is not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright Python package is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


class Served:
    """A daemon and its app on 127.0.0.1, on an event loop of their own thread (the store is
    used from the thread that opened it; the browser is driven from the test's)."""

    def __init__(self, state: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def open_daemon() -> Daemon:
            return make_daemon(state)

        self.daemon = self.call(open_daemon())
        self.server = TestServer(make_app(self.daemon), host="127.0.0.1")
        self.call(self.server.start_server())
        self.base = f"http://127.0.0.1:{self.server.port}"

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def close(self) -> None:
        async def close_daemon() -> None:
            self.daemon.close()

        try:
            self.call(self.daemon.stop())  # SIGTERM to the job, waited for
            self.call(self.server.close())
            self.call(close_daemon())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
            self.loop.close()


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setattr(jobs, "tune_argv", lambda *a: [sys.executable, "-c", JOB])
    s = Served(tmp_path / "state")
    try:
        yield s
    finally:
        s.close()
    assert not s.daemon.running  # no job process left behind


def _finish_a_launch(study: optuna.Study, seqs: int) -> None:
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            value=float(seqs),
            params={"max_num_seqs": seqs},
            distributions={"max_num_seqs": IntDistribution(1, 1024)},
        )
    )


def test_a_running_jobs_progress_changes_between_two_polls(browser: Any, served: Served) -> None:
    daemon = served.daemon

    async def start() -> int:
        daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
        await daemon.dispatch()
        (job_id,) = daemon.running
        return job_id

    job_id = served.call(start())
    study_dir = daemon.layout.study_dir("p", "eng-a")
    study_dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name="p", storage=f"sqlite:///{study_dir / 'study.db'}")
    _finish_a_launch(study, 8)

    # No credentials: 401 (a browser asks for them; headless, the navigation fails); the admin
    # token in the URL: 403, with the read-only credentials too.
    bare = browser.new_context()
    try:
        with pytest.raises(Exception, match="ERR_INVALID_AUTH_CREDENTIALS"):
            bare.new_page().goto(f"{served.base}/ui")
        assert bare.request.get(f"{served.base}/ui").status == 401
    finally:
        bare.close()

    context = browser.new_context(
        http_credentials={"username": "viewer", "password": daemon.metrics_token}
    )
    errors: list[str] = []
    requests: list[str] = []
    try:
        tab = context.new_page()
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.on("request", lambda r: requests.append(r.url))
        refused = tab.goto(f"{served.base}/ui?token={daemon.token}")
        assert refused is not None and refused.status == 403
        assert daemon.token not in tab.content()
        requests.clear()
        errors.clear()  # the refusal's "Failed to load resource"
        assert tab.goto(f"{served.base}/ui?refresh=1").status == 200
        progress = f"#job-{job_id} .progress"
        assert tab.inner_text(progress).startswith("1 launch finished (complete 1)")
        # The job's log line, markup and all, is text; nothing of it ran.
        tab.wait_for_selector(f"#job-{job_id} pre.log")
        assert "<script>window.__pwned=1</script>" in tab.inner_text(f"#job-{job_id} pre.log")
        first = tab.inner_text("#as-of")

        _finish_a_launch(study, 16)  # the study moves on, as a tune's launch ends
        tab.wait_for_function(
            "sel => (document.querySelector(sel) || {}).textContent"
            " && document.querySelector(sel).textContent.includes('2 launches finished')",
            arg=progress,
            timeout=WAIT_MS,
        )
        assert tab.inner_text(progress).startswith("2 launches finished (complete 2)")
        assert tab.inner_text("#as-of") != first
        assert tab.evaluate("typeof window.__pwned") == "undefined"
        assert errors == []
        assert {u.split("/ui")[0] for u in requests} == {served.base}
        assert len(requests) >= 2  # the page and at least one poll

        # The study page of the running job reloads itself while the job runs.
        r = context.request.get(f"{served.base}/ui/studies/p?refresh=2")
        assert r.headers.get("refresh") == "2"
    finally:
        context.close()


def test_a_study_page_runs_its_own_script_under_the_policy(browser: Any, served: Served) -> None:
    daemon = served.daemon
    name = "promote-unit"  # the study test_page promotes

    async def register() -> None:
        daemon.store.add_sla(name, SLA.format(name=name), "0 2 * * *", "eng-a")

    served.call(register())
    promoted_study(daemon.layout.trials_dir(name, "eng-a"))
    context = browser.new_context(
        http_credentials={"username": "viewer", "password": daemon.metrics_token}
    )
    errors: list[str] = []
    try:
        tab = context.new_page()
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        response = tab.goto(f"{served.base}/ui/studies/{name}")
        assert response is not None and response.status == 200
        assert "sha256-" in response.headers["content-security-policy"]
        assert tab.inner_text("#decision").startswith("Serve trial 4: it holds +")
        header = tab.locator("#launches thead th", has_text="capacity")
        header.click()  # the sorting script ran: the policy allows it by its hash
        assert header.get_attribute("aria-sort") == "ascending"
        assert errors == []
    finally:
        context.close()
