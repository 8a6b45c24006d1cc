"""Screenshots of the daemon's two pages for the docs: ``docs/daemon-jobs-screenshot.png``
(``/ui``, the jobs overview) and ``docs/daemon-study-screenshot.png`` (``/ui/studies/NAME``).

Run from the repository root, with the ``test`` extra (Playwright) and Debian's ``chromium``
installed (``.ci/run`` installs both); it starts no engine and takes about 20 s:

    python3 docs/screenshots.py             # writes the two PNGs into docs/
    python3 docs/screenshots.py --out DIR   # somewhere else

With ``--study DIR --name FILE.png`` it takes the page of one study instead: ``autotuner report
DIR --html`` written to a temporary file and opened from disk (how a reader opens the
``report.html`` of a bundle), its first screen saved as FILE.png in the output folder
(``docs/quickstart-screenshot.png`` is the CPU quick start's).

What the pages show is a fixture, built the way the daemon's page tests build theirs
(tests/unit/daemon): a state directory in a temporary folder, a stand-in engine registry
(engine ``vllm-0.26``, on the CPU so the job starts anywhere), the daemon's API served on
127.0.0.1 from a thread of this process (``Served`` of tests/unit/daemon/test_pages_browser.py),
and a "tune" job whose process prints the last lines of a real tune's log and then waits. Its
studies are two committed H200 studies, extracted from their tarballs under docs/benchmarks
into the daemon's study folders: the running job's (the interactive study, its re-queued
launch marked running: its launches are the job's progress, its page is a running study's) and
a promoted one (the lossy tier's, its promotion read from its bundle as the daemon reads it).
The finished jobs, the queue, an engine upgrade verdict and an alert are written through the
daemon and its store, as its own jobs would write them. The browser gives the read-only token
as the HTTP Basic password; the admin token is never used.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test fixtures are imported from the checkout

import optuna  # noqa: E402

from autotuner.daemon import jobs  # noqa: E402
from autotuner.daemon.hostlocks import LEASE_DIR_VAR  # noqa: E402
from autotuner.daemon.store import JobKind, JobState  # noqa: E402
from autotuner.engines import envs  # noqa: E402
from autotuner.records.trial import TrialRecord  # noqa: E402
from tests.unit.daemon.conftest import SLA, engine_env  # noqa: E402
from tests.unit.daemon.test_pages_browser import Served  # noqa: E402

BENCH = REPO / "docs" / "benchmarks"
RUNNING = "llama3-8b-h200-interactive"  # the running tune's SLA and study
PROMOTED = "llama3-8b-h200-lossy"
QUEUED = "llama3-70b-h200-fp8"
ENGINE, NEW_ENGINE = "vllm-0.26", "vllm-0.27"
TARBALLS = {
    RUNNING: BENCH / "h200-llama3-8b-interactive" / "llama3-8b-h200-interactive.tar.gz",
    PROMOTED: BENCH / "h200-llama3-8b-capacity" / "lossy" / "llama3-8b-h200-lossy.tar.gz",
}
# The running tune's last log lines: the interactive study's own (docs/benchmarks/
# h200-llama3-8b-interactive/tune.log), its re-queued launch starting again.
LOG = [
    "  -> raced out: missed the SLA at 17.5, trial 0's capacity: pruned after 1 level(s) (135 s)",
    "trial 4 (4/8, candidate, warm start, raced at 17.5 (trial 0's capacity)): "
    "{'max_num_batched_tokens': 4096}",
    "    engine starting, 15 s ...",
]
JOB = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(130))\n"
    f"print({chr(10).join(LOG)!r}, flush=True)\n"
    "time.sleep(600)\n"
)
WIDTH, HEIGHT = 1240, 1000  # the study page is cut at the viewport; the overview is whole


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("chromium is not installed: apt-get install -y chromium")


def _sla(name: str) -> str:
    return SLA.format(name=name).replace("eng-a", ENGINE)


def _extract(name: str, trials_dir: Path) -> None:
    trials_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(TARBALLS[name]) as tar:
        tar.extractall(trials_dir, filter="data")


def _start_requeued_launch(study_dir: Path) -> None:
    """The interactive study's re-queued launch (trial 4, waiting) taken up as a resumed tune
    takes it: running, with its config and role recorded as the study loop records them."""
    study = optuna.load_study(study_name=RUNNING, storage=f"sqlite:///{study_dir / 'study.db'}")
    trial = study.ask()
    tokens = trial.suggest_int("max_num_batched_tokens", 1024, 32768, log=True)  # trial 3's
    TrialRecord(
        params_full={"load_format": "dummy", "max_num_batched_tokens": tokens},
        role="candidate",
        race_level=study.trials[2].user_attrs["race_level"],
        race_incumbent=0,
    ).save(trial.set_user_attr)


def _finished(
    served: Served,
    kind: JobKind,
    state: JobState,
    exit_code: int,
    error: str | None = None,
    args: dict[str, Any] | None = None,
) -> int:
    """A job of the promoted SLA that ran and ended."""
    store = served.daemon.store
    job_id = store.enqueue(kind, PROMOTED, ENGINE, args=args)
    store.claim(job_id)
    store.finish(job_id, state, exit_code=exit_code, error=error)
    return job_id


def build(served: Served) -> None:
    """The fixture state: see the module's docstring."""
    daemon, layout = served.daemon, served.daemon.layout

    async def populate() -> None:
        # A promoted SLA: its tune done, an engine upgrade checked, a re-check that failed.
        tune = daemon.submit(_sla(PROMOTED), source=f"{PROMOTED}.yaml", base_dir=None)["job"]
        _extract(PROMOTED, layout.trials_dir(PROMOTED, ENGINE))
        daemon.store.claim(tune)
        daemon.store.finish(tune, "done", exit_code=0, outcome={"status": "met"})
        daemon.store.update_sla(
            PROMOTED,
            promotion=jobs.promotion_from(layout, PROMOTED, ENGINE, time.time()),
            summary=jobs.study_summary(layout, PROMOTED, ENGINE),
        )
        upgrade = {"old": ENGINE, "new": NEW_ENGINE}
        _finished(served, "regression", "done", 0, args=upgrade)
        daemon.store.add_verdict(PROMOTED, ENGINE, NEW_ENGINE, "no_change", {})
        why = "exit 3: the engine failed to start (out_of_memory)"
        recheck = _finished(served, "recheck", "failed", 3, error=why)
        daemon.alert(
            "job_failed",
            PROMOTED,
            "warning",
            f"{PROMOTED}: the re-check of the promoted config measured nothing ({why}); no "
            "verdict on the SLA: the promotion stays in force and no re-tune is queued",
            {"job": recheck, "exit_code": 3},
        )
        # The running tune, then what waits behind it.
        daemon.submit(_sla(RUNNING), source=f"{RUNNING}.yaml", base_dir=None)
        _extract(RUNNING, layout.trials_dir(RUNNING, ENGINE))
        _start_requeued_launch(layout.study_dir(RUNNING, ENGINE))
        await daemon.dispatch()
        daemon.submit(_sla(QUEUED), source=f"{QUEUED}.yaml", base_dir=None)
        daemon.store.enqueue("recheck", PROMOTED, ENGINE)

    served.call(populate())
    if len(daemon.running) != 1:
        raise SystemExit(f"expected one running job, found {len(daemon.running)}: {daemon.waiting}")


def shoot(served: Served, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    token = served.daemon.metrics_token  # the read-only token, never the admin one
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            context = browser.new_context(
                viewport={"width": WIDTH, "height": HEIGHT},
                http_credentials={"username": "viewer", "password": token},
            )
            tab = context.new_page()
            errors: list[str] = []
            tab.on("pageerror", lambda e: errors.append(str(e)))
            pages = {
                "daemon-jobs-screenshot.png": "/ui",
                "daemon-study-screenshot.png": f"/ui/studies/{RUNNING}",
            }
            for name, path in pages.items():
                response = tab.goto(served.base + path)
                if response is None or response.status != 200:
                    raise SystemExit(f"{path}: {response.status if response else 'no answer'}")
                tab.wait_for_load_state("load")
                target = out / name
                tab.screenshot(path=str(target), full_page=path == "/ui")
                written.append(target)
            if errors:
                raise SystemExit(f"the pages raised errors: {errors}")
        finally:
            browser.close()
    return written


def shoot_study(study: Path, target: Path) -> Path:
    """The first screen of ``study``'s page, rendered by ``autotuner report --html``."""
    import subprocess

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="autotuner-page-") as tmp:
        page = Path(tmp) / "report.html"
        cmd = [sys.executable, "-m", "autotuner", "report", str(study), "--html", str(page)]
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
            try:
                tab = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
                errors: list[str] = []
                tab.on("pageerror", lambda e: errors.append(str(e)))
                tab.goto(page.as_uri())
                tab.wait_for_load_state("load")
                tab.screenshot(path=str(target))
                if errors:
                    raise SystemExit(f"the page raised errors: {errors}")
            finally:
                browser.close()
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="folder for the PNGs")
    parser.add_argument("--study", type=Path, help="a study's directory: take its page instead")
    parser.add_argument("--name", default="study-screenshot.png", help="the study page's PNG")
    args = parser.parse_args()
    if args.study is not None:
        print(f"wrote {shoot_study(args.study, args.out / args.name)}")
        return
    # The stand-in engine registry and tune command (what the page tests monkeypatch).
    registry = {e.name: e for e in (engine_env(ENGINE, "0.26.0"), engine_env(NEW_ENGINE, "0.27.0"))}

    def get(name: str) -> envs.EngineEnv:
        if name not in registry:
            raise envs.EngineEnvError(f"no engine {name}")
        return registry[name]

    envs.list_envs = lambda: list(registry.values())
    envs.get = get
    jobs.tune_argv = lambda *a, **k: [sys.executable, "-c", JOB]
    with tempfile.TemporaryDirectory(prefix="autotuner-screenshots-") as tmp:
        # Device locks of its own: the fixture never waits for, nor holds up, a real daemon.
        os.environ[LEASE_DIR_VAR] = str(Path(tmp) / "leases")
        served = Served(Path(tmp) / "state")
        try:
            build(served)
            for path in shoot(served, args.out):
                print(f"wrote {path}")
        finally:
            served.close()


if __name__ == "__main__":
    main()
