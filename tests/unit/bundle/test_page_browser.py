"""The study page in a real browser: Debian's ``chromium``, driven headless by Playwright for
Python pointed at the system browser (``executable_path``; Playwright's own browser download is
not used). .ci/run installs both; without them these tests skip loudly, except in CI
(``CI=true``), where they fail.

A committed H200 study and a study promoted by the project's own code render with no console
error, the decision sentence, the launch table (a click on a header sorts it) and the charts;
a hostile study's markup renders as text and runs nothing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotuner.bundle import page

from .test_page import HOSTILE, INTERACTIVE, committed_study, hostile_study, promoted_study

INSTALL = (
    "install them with `apt-get install -y chromium` and `pip install -e '.[test]'` "
    "(playwright; .ci/run does both)"
)


def _missing(why: str) -> None:
    why = f"{why}, so the study page was NOT tested in a browser: {INSTALL}"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    _missing("chromium is not installed")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = _chromium()
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


class Opened:
    """A page opened from a file, with the console errors and uncaught exceptions it raised."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.tab = browser.new_page(viewport={"width": 1240, "height": 900})
        self.tab.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.tab.on("pageerror", lambda e: self.errors.append(str(e)))
        self.tab.on("request", lambda r: self.requests.append(r.url))
        self.tab.goto(path.as_uri())
        self.tab.wait_for_load_state("load")


def _write(study: optuna.Study, study_dir: Path, tmp_path: Path) -> Path:
    return page.write(study, study_dir, tmp_path / "report.html")


def _column(tab: Any, index: int) -> list[float]:
    values = tab.eval_on_selector_all(
        "#launches tbody tr",
        f"rows => rows.map(r => parseFloat(r.cells[{index}].getAttribute('data-value')))",
    )
    return [float(v) for v in values]


def test_a_committed_study_renders_with_its_decision_table_and_charts(
    browser: Any, tmp_path: Path
) -> None:
    study, study_dir = committed_study(tmp_path)
    opened = Opened(browser, _write(study, study_dir, tmp_path))
    tab = opened.tab
    assert opened.errors == []
    assert tab.inner_text("#decision") == (
        "Serve the engine defaults (baseline). Confirmed capacity 21.9 req/s (mean of 3 "
        "replicates). trial-1 against it: +32.2 % [+11.4 %, +56.9 %] at 95 % from 3 pairs "
        "(better)."
    )
    assert "confirmed: 3 replicate pairs" in tab.inner_text("#rests-on")
    assert tab.locator("#launches tbody tr").count() == 9
    # Charts: the Pareto chart, the latency breakdown, a capacity search per launch.
    assert tab.locator("#pareto svg .point").count() == 3
    assert tab.locator("#latency svg rect.bar").count() > 0
    assert tab.locator(".launch svg g.level").count() > 9
    assert tab.locator("#pareto svg").bounding_box()["width"] > 300
    # Sorting: a click on "capacity" sorts the rows ascending, a second click descending.
    header = tab.locator("#launches thead th", has_text="capacity")
    header.click()
    up = _column(tab, 4)
    assert up == sorted(up) and len(set(up)) > 1
    assert header.get_attribute("aria-sort") == "ascending"
    header.click()
    assert _column(tab, 4) == sorted(up, reverse=True)
    # Back by launch number.
    tab.locator("#launches thead th", has_text="#").click()
    assert tab.locator("#launches tbody tr").first.get_attribute("id") == "row-trial-0"
    # Offline: the file itself is the only thing loaded.
    assert [u for u in opened.requests if not u.startswith("file://")] == []


def test_a_raced_out_launch_reads_as_pruned_at_its_one_level(browser: Any, tmp_path: Path) -> None:
    study, study_dir = committed_study(tmp_path, INTERACTIVE)
    opened = Opened(browser, _write(study, study_dir, tmp_path))
    tab = opened.tab
    assert opened.errors == []
    cells = tab.locator("#row-trial-2 td").all_inner_texts()
    assert cells[3:6] == ["pruned (raced out)", "none", "missed 17.5 req/s"]
    assert cells[-1].startswith("raced out: missed the SLA at the incumbent's capacity")
    assert tab.locator("#row-trial-0 td").all_inner_texts()[3] == "met"
    # Its capacity search: the one level it ran, and the incumbent's capacity marked.
    panel = tab.locator("#launch-trial-2")
    assert "pruned (raced out)" in panel.locator("h3").inner_text()
    assert panel.locator("svg g.level").count() == 1
    assert panel.locator("svg g.race text").text_content() == "trial 0's capacity"
    # Sorted by capacity, it sits with the launches that have none, below those that met.
    tab.locator("#launches thead th", has_text="capacity").click()
    order = tab.eval_on_selector_all("#launches tbody tr", "rows => rows.map(r => r.id)")
    assert order.index("row-trial-2") < order.index("row-trial-0")


def test_a_promoted_unit_study_renders_without_errors(browser: Any, tmp_path: Path) -> None:
    _, study_dir = promoted_study(tmp_path)
    opened = Opened(browser, study_dir / "promoted" / "report.html")
    assert opened.errors == []
    assert opened.tab.inner_text("#decision").startswith("Serve trial 4: it holds +")
    assert opened.tab.locator("#replicates tr").count() == 4  # header and 3 pairs
    assert "max_num_seqs" in opened.tab.inner_text("#params")


def test_a_hostile_study_renders_as_text_and_runs_nothing(browser: Any, tmp_path: Path) -> None:
    study, study_dir = hostile_study(tmp_path)
    opened = Opened(browser, _write(study, study_dir, tmp_path))
    tab = opened.tab
    assert tab.evaluate("typeof window.__pwned") == "undefined"
    assert opened.errors == []
    table = tab.inner_text("#launches")
    assert HOSTILE in table  # the parameter value, as text
    assert "<script>window.__pwned=2</script>\\x07" in tab.inner_text("body")  # the engine name
    tab.locator("#launches details summary").first.click()
    assert "ERROR <script>window.__pwned=3</script> 'q' \\x07\\x1b[31m" in tab.inner_text(
        "#launches details pre"
    )
    assert tab.locator("script").count() == 1  # the page's own
