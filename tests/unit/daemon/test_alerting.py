"""Alerts that fire and metrics that say what they measure (issue 15, item 15).

The daemon's state after a tune that found nothing, a failed re-check and an empty re-tune is
scraped from its collector and handed to ``promtool test rules`` with the shipped rules, so the
test proves the alert a user would get, not only the number. promtool comes with Debian's
``prometheus`` package (.ci/run installs it); without it these tests skip loudly, except in CI
(``CI=true``), where they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import optuna
import pytest
import yaml
from optuna.distributions import IntDistribution
from optuna.trial import create_trial
from prometheus_client.parser import text_string_to_metric_families

from autotuner.daemon import alerts, jobs, outcomes
from autotuner.daemon.metrics import METRIC_NAMES, make_registry, render
from autotuner.daemon.service import Daemon
from autotuner.daemon.store import Job

from .conftest import SLA

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
CASES = Path(__file__).resolve().parent / "promtool"
DOC = ROOT / "docs" / "daemon.md"
TARGET = {"job": "autotuner", "instance": "d:8787"}  # what Prometheus adds to each series


# What a skip says (README's Development section says the same): the README's test command
# does not install system packages, .ci/run does.
PROMTOOL_INSTALL = "sudo apt-get install -y --no-install-recommends prometheus"
PROMTOOL_MISSING = (
    "promtool is not installed, so the alert rules were NOT tested: install it with "
    f"`{PROMTOOL_INSTALL}` (Debian and Ubuntu ship promtool in the prometheus package; "
    "elsewhere put promtool from a Prometheus release on PATH), then run pytest again; "
    ".ci/run installs it, and with CI=true these tests fail instead of skipping"
)


def _promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    why = PROMTOOL_MISSING
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def _scrape(d: Daemon) -> dict[str, list[tuple[dict[str, str], float]]]:
    """/metrics as Prometheus would read it, once the daemon's loop has handled its alerts
    (no webhook configured: they count as delivered)."""

    async def deliver() -> None:
        async with aiohttp.ClientSession() as session:
            await alerts.deliver_due(d.store, [], session)

    asyncio.run(deliver())
    text = render(make_registry(d.collector())).decode()
    return {
        f.name: [(dict(s.labels), s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
        if f.samples
    }


def _sample(scraped: dict[str, list[tuple[dict[str, str], float]]], name: str, sla: str) -> float:
    (value,) = [v for labels, v in scraped.get(name, []) if labels.get("sla") == sla]
    return value


def _job(d: Daemon, kind: str, sla: str = "p") -> Job:
    job_id = d.store.enqueue(kind, sla, "eng-a")
    assert d.store.claim(job_id)
    job = d.store.job(job_id)
    assert job is not None
    return job


def _tune_ended(d: Daemon, code: int, sla: str = "p") -> None:
    """A tune job of ``sla`` exited with ``code``; the daemon reads what it left."""
    job = _job(d, "tune", sla)
    d.store.finish(job.id, "done", exit_code=code, outcome=outcomes.tune_done(d, job, code))


def _recheck_ended(d: Daemon, code: int, sla: str = "p") -> None:
    job = _job(d, "recheck", sla)
    d.store.finish(job.id, "done", exit_code=code, outcome=outcomes.recheck_done(d, job, code))


def _bundle(d: Daemon, meets_sla: bool, sla: str = "p") -> None:
    """The promoted bundle a tune leaves (only what the daemon reads)."""
    bundle = d.layout.bundle(sla, "eng-a")
    bundle.mkdir(parents=True, exist_ok=True)
    manifest = {
        "created": "2026-12-01T02:00:00+00:00",
        "promoted": {"label": "trial-2", "params": {"max_num_seqs": 32}, "meets_sla": meets_sla},
        "measurements": {
            "confirmation": {"load": 3.0, "spread": {"trial-2": {"goodput": {"mean": 2.6}}}}
        },
    }
    (bundle / "optimization_manifest.json").write_text(json.dumps(manifest))


def _fired(
    scraped: dict[str, list[tuple[dict[str, str], float]]],
    tmp_path: Path,
    at_minutes: int,
    expected: dict[str, list[dict[str, str]]],
) -> None:
    """Feed what was scraped, held constant, to promtool with the shipped rules; it checks
    that at ``at_minutes`` exactly the ``expected`` alerts fire (alert -> their labels)."""
    promtool = _promtool()
    series = [{"series": 'up{job="autotuner", instance="d:8787"}', "values": "1x120"}]
    for name, samples in scraped.items():
        for labels, value in samples:
            body = ", ".join(f'{k}="{v}"' for k, v in sorted({**labels, **TARGET}.items()))
            series.append({"series": f"{name}{{{body}}}", "values": f"{value!r}x120"})
    names = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    checks = [
        {
            "eval_time": f"{at_minutes}m",
            "alertname": name,
            "exp_alerts": [{"exp_labels": lab} for lab in expected.get(name, [])],
        }
        for name in names
    ]
    tmp_path.mkdir(parents=True, exist_ok=True)
    _stripped_rules(tmp_path / "alerts.yml")
    test = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}],
    }
    (tmp_path / "live_test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    run = subprocess.run(
        [promtool, "test", "rules", "live_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _stripped_rules(dest: Path) -> None:
    """The shipped rules without annotations: rule tests then compare labels only."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    dest.write_text(yaml.safe_dump(rules, sort_keys=False))


# --------------------------------------------------------------------------- an SLA no config meets


def test_an_sla_no_config_meets_raises_an_alert_and_exports_sla_feasible_0(
    daemon: Daemon,
) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    assert "autotuner_sla_feasible" not in _scrape(daemon)  # nothing known before a tune ends
    _tune_ended(daemon, 1)  # nothing met the SLA, so nothing was promoted (no bundle)
    assert [a["kind"] for a in daemon.store.alerts()] == ["sla_infeasible"]
    assert _sample(_scrape(daemon), "autotuner_sla_feasible", "p") == 0.0


def test_promtool_fires_sla_not_met_for_an_sla_no_config_meets(
    daemon: Daemon, tmp_path: Path
) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    _tune_ended(daemon, 1)
    scraped = _scrape(daemon)
    sla_not_met = {"sla": "p", "severity": "critical", **TARGET}
    _fired(scraped, tmp_path, 31, {"AutotunerSlaNotMet": [sla_not_met]})


# --------------------------------------------------------------------------- a failed re-check


def test_a_failed_recheck_fires_a_rule_and_an_empty_retune_exports_sla_feasible_0(
    daemon: Daemon, tmp_path: Path
) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    _bundle(daemon, meets_sla=True)
    _tune_ended(daemon, 0)
    assert _sample(_scrape(daemon), "autotuner_sla_feasible", "p") == 1.0
    promoted_at = daemon.store.get_sla("p").promotion.time  # type: ignore[union-attr]

    _recheck_ended(daemon, 1)  # the nightly re-check missed the SLA: a re-tune is queued
    assert daemon.store.pending("p", "tune") is not None
    recheck_failed = {"sla": "p", "severity": "critical", **TARGET}
    _fired(_scrape(daemon), tmp_path / "a", 1, {"AutotunerRecheckFailed": [recheck_failed]})

    # The re-tune finds nothing to promote; its old bundle is still on disk.
    (daemon.layout.study_dir("p", "eng-a") / "no_promotion.json").write_text("{}")
    _tune_ended(daemon, 1)
    scraped = _scrape(daemon)
    assert _sample(scraped, "autotuner_sla_feasible", "p") == 0.0
    row = daemon.store.get_sla("p")
    assert row is not None and row.promotion is not None
    assert row.promotion.time == promoted_at  # nothing new was promoted
    assert daemon.store.alerts()[0]["kind"] == "sla_infeasible"
    expected = {"AutotunerRecheckFailed": [recheck_failed], "AutotunerSlaNotMet": [recheck_failed]}
    _fired(scraped, tmp_path / "b", 31, expected)

    # A later re-tune promotes a config that meets the SLA: both are over.
    _bundle(daemon, meets_sla=True)
    manifest = daemon.layout.bundle("p", "eng-a") / "optimization_manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "created": "2026-12-02T02:00:00+00:00"}))
    time.sleep(0.01)  # the promotion is recorded after the failed re-check ended
    _tune_ended(daemon, 0)
    scraped = _scrape(daemon)
    assert _sample(scraped, "autotuner_sla_feasible", "p") == 1.0
    _fired(scraped, tmp_path / "c", 31, {})


def test_a_retune_on_another_engine_that_finds_nothing_keeps_the_promotion_met(
    daemon: Daemon,
) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    _bundle(daemon, meets_sla=True)
    _tune_ended(daemon, 0)
    job_id = daemon.store.enqueue("tune", "p", "eng-b")  # a new engine: its study found nothing
    job = daemon.store.job(job_id)
    assert job is not None
    outcomes.tune_done(daemon, job, 1)
    row = daemon.store.get_sla("p")
    assert row is not None and row.promotion is not None and row.promotion.engine == "eng-a"
    assert _sample(_scrape(daemon), "autotuner_sla_feasible", "p") == 1.0


# --------------------------------------------------------------------------- goodput, not load


def _study(d: Daemon, sla: str = "p") -> None:
    """A study with one feasible trial that sustained 4 req/s offered and measured 3.1 req/s
    of goodput, and an infeasible one that measured more."""
    study = optuna.create_study(
        study_name=sla,
        storage=f"sqlite:///{d.layout.study_dir(sla, 'eng-a') / 'study.db'}",
        directions=["maximize"],
    )
    dist = {"max_num_seqs": IntDistribution(1, 64)}
    for seqs, goodput, load, margin in ((16, 3.1, 4.0, -0.2), (64, 9.0, 12.0, 0.5)):
        study.add_trial(
            create_trial(
                values=[goodput],
                params={"max_num_seqs": seqs},
                distributions=dist,
                user_attrs={
                    "role": "candidate",
                    "status": "complete",
                    "max_load": load,
                    "metrics": {"goodput": goodput},
                },
                constraints={"p99_ttft_ms": margin},
            )
        )


def test_best_goodput_is_the_measured_goodput_and_the_offered_load_has_its_own_series(
    daemon: Daemon,
) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    daemon.layout.study_dir("p", "eng-a").mkdir(parents=True)
    _study(daemon)
    summary = jobs.study_summary(daemon.layout, "p", "eng-a")
    assert summary["best_goodput"] == 3.1 and summary["best_max_load"] == 4.0
    _tune_ended(daemon, 1)
    scraped = _scrape(daemon)
    assert _sample(scraped, "autotuner_best_goodput", "p") == 3.1
    assert _sample(scraped, "autotuner_best_max_load", "p") == 4.0


# --------------------------------------------------------------------------- docs


def _documented() -> set[str]:
    return set(re.findall(r"^\| `(autotuner_\w+)` \|", DOC.read_text(encoding="utf-8"), re.M))


def test_every_exported_family_is_documented(daemon: Daemon) -> None:
    daemon.submit(SLA.format(name="p"), source="p.yaml", base_dir=None)
    # As /metrics names them: a counter family's samples end in _total.
    exported = {
        f"{f.name}_total" if f.type == "counter" else f.name for f in daemon.collector().collect()
    }
    assert exported == set(METRIC_NAMES)
    assert exported - _documented() == set(), "exported but not in docs/daemon.md"
    assert _documented() - exported == set(), "in docs/daemon.md but not exported"


# --------------------------------------------------------------------------- promtool cases


def _case_files() -> list[Path]:
    return sorted(CASES.glob("*_test.yml"))


def test_every_alert_rule_has_a_promtool_case_where_it_fires() -> None:
    rules = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    firing: set[str] = set()
    for path in _case_files():
        data: dict[str, Any] = yaml.safe_load(path.read_text())
        assert data["rule_files"] == ["alerts.yml"], path
        for group in data["tests"]:
            for check in group.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    firing.add(check["alertname"])
    assert rules - firing == set(), "alert rules without a promtool case that fires them"
    assert firing - rules == set(), "promtool cases for rules that do not exist"


def test_promtool_checks_the_rules_and_passes_every_case(tmp_path: Path) -> None:
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    _stripped_rules(tmp_path / "alerts.yml")
    for path in _case_files():
        shutil.copy(path, tmp_path / path.name)
    run = subprocess.run(
        [promtool, "test", "rules", *(p.name for p in _case_files())],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_without_promtool_the_skip_says_how_to_install_it_and_so_does_the_readme(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        _promtool()
    assert PROMTOOL_INSTALL in str(skipped.value) and "run pytest again" in str(skipped.value)
    development = (ROOT / "README.md").read_text().split("## Development", 1)[1]
    assert "promtool" in development and PROMTOOL_INSTALL in development
