"""A study reads well in optuna-dashboard (issue 15, item 16): named objectives, feasibility and
each measured metric as a number it can sort by.

The study is made by the real study loop (tests/unit/search/test_study.py's harness: a synthetic
response surface instead of engines) and read back through the dashboard's own WSGI app and
the REST route its web page calls, as a user opening ``optuna-dashboard sqlite:///...`` would.
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import optuna
import optuna_dashboard
import pytest
from optuna.trial import TrialState

from autotuner.records.trial import TrialRecord
from tests.unit.search.test_study import Harness


def _get(app: Any, path: str) -> Any:
    """GET ``path`` from a WSGI app and decode its JSON answer."""
    status: list[str] = []
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8080",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.errors": sys.stderr,
    }
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status and status[0].startswith("200"), (status, body[:500])
    return json.loads(body)


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> tuple[optuna.Study, dict[str, Any]]:
    """A study of the baseline and three configs, one of them (1 sequence) infeasible, as
    the dashboard's page loads it."""
    h = Harness(tmp_path_factory.mktemp("study"), [1, 8, 32], budget=4)
    study = h.study()
    runner = h.runner(study)
    runner.prune = lambda params: None  # the harness prunes 1 sequence; measure it here
    runner.loop()
    app = optuna_dashboard.wsgi(optuna.storages.RDBStorage(h.url))
    return study, _get(app, f"/api/studies/{study._study_id}")


def _attrs(trial: dict[str, Any]) -> dict[str, str]:
    return {a["key"]: a["value"] for a in trial["user_attrs"]}


def test_the_dashboard_names_the_objectives(
    dashboard: tuple[optuna.Study, dict[str, Any]],
) -> None:
    study, view = dashboard
    assert view["objective_names"] == ["goodput", "p99_ttft_ms"]  # the SLA's, in its order
    assert study.metric_names == ["goodput", "p99_ttft_ms"]


def test_the_dashboard_shows_each_trials_feasibility_and_constraint_margins(
    dashboard: tuple[optuna.Study, dict[str, Any]],
) -> None:
    study, view = dashboard
    by_number = {t["number"]: t for t in view["trials"]}
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert {bool(all(v <= 0 for v in t.constraints.values())) for t in complete} == {True, False}
    for t in complete:
        shown = _attrs(by_number[t.number])
        met = all(v <= 0 for v in t.constraints.values())
        assert shown["feasible"] == ("1" if met else "0"), t.number
        for key, value in t.constraints.items():  # Optuna's own constraints, as margins
            assert float(shown[f"constraint:{key}"]) == value
        assert TrialRecord.from_trial(t).constraints == t.constraints


def test_the_dashboard_can_sort_trials_by_each_measured_metric(
    dashboard: tuple[optuna.Study, dict[str, Any]],
) -> None:
    study, view = dashboard
    sortable = {a["key"] for a in view["union_user_attrs"] if a["sortable"]}
    wanted = {"metric:goodput", "metric:p99_ttft_ms", "metric:request_rate", "feasible"}
    assert wanted <= sortable
    assert "constraint:p99_ttft_ms" in sortable
    by_number = {t["number"]: t for t in view["trials"]}
    for t in study.trials:
        if t.state != TrialState.COMPLETE:
            continue
        shown = _attrs(by_number[t.number])
        measured = TrialRecord.from_trial(t).metrics  # the JSON attribute stays as it was
        assert float(shown["metric:goodput"]) == measured["goodput"]
        assert json.loads(shown["metrics"]) == measured
