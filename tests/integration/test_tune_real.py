"""`autotuner tune` end to end on the real CPU vLLM: a study of 3 launches, interrupted with
kill -9 in the middle of a trial, resumed by running the same command again, then decided
and promoted. Checks the study (nothing finished is repeated, nothing lost), the processes
(no orphan engine), the capacity of every launch (within the resolution, or the budget that
stopped it is named), and the bundle (every artifact there, and the manifest's numbers are
the ones the trials measured). Run once more, the finished study reprints its decision and
launches nothing.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotuner.records.trial import CapacityRecord
from autotuner.search.study import feasible

from .conftest import cpu_sla, run_cli, tagged_processes, wait_until

pytestmark = pytest.mark.slow


def write_study_sla(tmp_path: Path) -> Path:
    workload = {
        "input_tokens": 64,
        "output_tokens": 16,
        "arrival": {"process": "poisson", "rate": 3.0},
        "requests": 16,
        "seed": 2,
    }
    sla = cpu_sla(
        "it-tune",
        workload,
        objectives=[{"maximize": "goodput"}, {"minimize": "p99_ttft_ms"}],
        search={
            "params": {
                "max_num_seqs": {"values": [2, 64]},
                "stream_interval": {"values": [1, 4]},
                "enable_chunked_prefill": {"fixed": True},
                "max_num_batched_tokens": {"values": [512, 2048]},
                "long_prefill_token_threshold": False,
                "block_size": False,
                "enable_prefix_caching": False,
                "performance_mode": False,
            }
        },
        tune={
            # 3: the baseline, the trial the kill interrupts (run again on resume) and one that
            # the resumed study starts afresh (a fourth cost a launch, ~60 s, and showed nothing
            # the third does not)
            "trials": 3,
            "sampler": "random",
            "seed": 3,
            "max_levels": 2,
            "confirm": {"candidates": 1, "replicates": 1},
        },
    )
    path = tmp_path / "it-tune.yaml"
    path.write_text(yaml.safe_dump(sla, sort_keys=False))
    return path


def test_tune_survives_kill_9_resumes_and_promotes(
    cli_env: dict[str, str], tag: str, tmp_path: Path
) -> None:
    sla = write_study_sla(tmp_path)
    trials_dir = tmp_path / "trials"
    cmd = [sys.executable, "-m", "autotuner", "tune", str(sla), "--trials-dir", str(trials_dir)]

    # 1. Start the study; kill -9 the tuner once the second trial's engine serves load.
    first = subprocess.Popen(
        cmd, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen: list[str] = []
    try:
        assert first.stdout is not None
        second_trial = False
        for line in first.stdout:
            seen.append(line)
            second_trial = second_trial or line.startswith("trial 1 ")
            if second_trial and "engine healthy" in line:
                break
        else:
            pytest.fail("tune ended before its second trial ran:\n" + "".join(seen[-40:]))
        first.kill()
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    wait_until(lambda: not tagged_processes(tag), 30, "the killed tuner's engine to be reaped")

    study_dir = trials_dir / "it-tune"
    url = f"sqlite:///{study_dir / 'study.db'}"
    before = {t.number: t for t in optuna.load_study(study_name="it-tune", storage=url).trials}
    assert before[0].state == TrialState.COMPLETE and before[0].user_attrs["role"] == "baseline"
    assert before[1].state == TrialState.RUNNING  # what a crash leaves behind

    # 2. The same command resumes, finishes the budget, confirms and promotes.
    r = run_cli(["tune", str(sla), "--trials-dir", str(trials_dir)], cli_env, timeout_s=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert "trial 1 was interrupted" in r.stdout

    study = optuna.load_study(study_name="it-tune", storage=url)
    trials = study.trials
    assert trials[0].datetime_complete == before[0].datetime_complete  # not re-run
    assert trials[1].state == TrialState.FAIL and trials[1].user_attrs["interrupted"]
    requeued = [t for t in trials if t.user_attrs.get("requeued_from") == 1]
    assert len(requeued) == 1 and requeued[0].params == before[1].params
    launched = [
        t for t in trials
        if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs
    ]  # fmt: skip
    assert len(launched) == 3
    keys = [t.user_attrs["config_key"] for t in launched]
    assert len(set(keys)) == len(keys), "a finished config was launched again"
    # The baseline's engine was started exactly once, before the kill.
    log = (study_dir / "trial-000" / "engine.log").read_text()
    assert log.count("# autotuner launch") == 1

    # 3. The bundle: every artifact, consistent with what the trials measured.
    bundle = study_dir / "promoted"
    names = {p.name for p in bundle.iterdir()}
    assert {
        "optimization_manifest.json",
        "hardware_profile.csv",
        "latency_breakdown.svg",
        "pareto.svg",
        "pareto.csv",
        "fallback_plan.md",
        "deploy",
    } <= names
    manifest = json.loads((bundle / "optimization_manifest.json").read_text())
    promoted = manifest["promoted"]
    chosen = trials[promoted["trial"]]
    assert promoted["params"] == chosen.user_attrs["params_full"]
    trial_json = json.loads((study_dir / chosen.user_attrs["result_file"]).read_text())
    assert manifest["measurements"]["search"]["at_sla_load"] == trial_json["levels"][0]["metrics"]
    # Every launch measured its capacity: a bracket within the resolution, or the record
    # names the budget that stopped it (two levels per launch here).
    for t in launched:
        cap = json.loads((study_dir / t.user_attrs["result_file"]).read_text())["capacity"]
        assert cap["unit"] == "req/s" and cap["resolution"] == 0.03, cap
        # The same record (the study's attributes leave out a field never set, the file
        # writes it as null).
        assert CapacityRecord.model_validate(t.user_attrs["capacity"]) == (
            CapacityRecord.model_validate(cap)
        )
        if cap["low"] > 0 and cap["high"] is not None and cap["stopped_by"] == "resolution":
            assert (cap["high"] - cap["low"]) / cap["low"] <= 0.03 + 1e-9, cap
        elif cap["stopped_by"] == "budget":
            assert "tune.max_levels = 2" in cap["note"], cap
        else:  # missed (or could not be shown to meet) the SLA at its own load
            assert cap["low"] == 0 and cap["stopped_by"] in ("infeasible_at_start", "undecided")
            # A miss on latency or errors measured how far below it holds (one level left).
            held = cap.get("sustainable")
            if held is not None:
                assert held["target"] == 3.0 and held["levels"] == 1, held
                assert held["value"] in (0.0, pytest.approx(3.0 / 1.5)), held
    assert manifest["measurements"]["search"]["capacity"] == trial_json["capacity"]
    # The decision is made on capacity: one replicate cannot measure the spread, so no
    # confirmation launch is spent, and the decision says why.
    decision = manifest["decision"]
    assert decision["basis"] == "capacity" and decision["confirmed"] is False
    assert "no launch spent" in decision["reason"] or "without confirmation" in decision["reason"]
    assert manifest["measurements"]["confirmation"]["replicates"] == []
    assert not (study_dir / "confirm").exists()
    assert manifest["provenance"]["engine_version"].startswith("vllm")
    assert manifest["provenance"]["search_space"]["hash"]
    assert manifest["decision"]["reason"]
    assert 1 in [d["trial"] for d in manifest["decisions"]["interrupted"]]
    rows = list(csv.DictReader((bundle / "hardware_profile.csv").open()))
    assert rows and rows[0]["device"] == "cpu"
    for svg in ("pareto.svg", "latency_breakdown.svg"):
        assert ET.parse(bundle / svg).getroot().tag.endswith("svg")
    pareto = list(csv.DictReader((bundle / "pareto.csv").open()))
    assert {int(p["trial"]) for p in pareto} == {t.number for t in launched}
    plan = (bundle / "fallback_plan.md").read_text()
    assert "Fallback plan" in plan and "(single run)" in plan
    # Another measured config is always offered: the baseline beside a promoted candidate, or
    # the next best feasible one beside a kept baseline (never "No fallback was measured").
    if not promoted["is_baseline"] or sum(feasible(t) for t in launched) >= 2:
        assert "## 1. " in plan and "No fallback was measured" not in plan
    serve = bundle / "deploy" / "serve.sh"
    assert subprocess.run(["bash", "-n", str(serve)]).returncode == 0
    assert "127.0.0.1" in serve.read_text()

    # 4. The report reads it all back.
    rep = run_cli(["report", str(study_dir)], cli_env, timeout_s=60)
    assert rep.returncode == 0 and "promoted:" in rep.stdout and "interrupted" in rep.stdout

    # 5. Run again: the study is finished, so its decision is reprinted and nothing launched.
    launches = sum(p.read_text().count("# autotuner launch") for p in study_dir.rglob("engine.log"))
    again = run_cli(["tune", str(sla), "--trials-dir", str(trials_dir)], cli_env, timeout_s=300)
    assert again.returncode == r.returncode, again.stdout[-3000:] + again.stderr[-2000:]
    assert "is finished" in again.stdout and f"bundle: {bundle}" in again.stdout
    after = sum(p.read_text().count("# autotuner launch") for p in study_dir.rglob("engine.log"))
    assert after == launches
    assert json.loads((bundle / "optimization_manifest.json").read_text()) == manifest
