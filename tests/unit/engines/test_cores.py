"""On a CPU target the load generator keeps a core: the engine's processes run on the others."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from autotuner.engines import registry
from autotuner.engines.cores import CoreShare, share_cores
from autotuner.engines.process import ServerProcess
from autotuner.engines.replicas import ReplicaSet
from autotuner.measure import launch
from autotuner.sla.spec import parse_sla
from tests.unit.engines.standin_engine import ADAPTER as STANDIN
from tests.unit.engines.test_standin_engine import BOUND_S, _launch_spec

VLLM = registry.get("vllm")


def test_the_last_core_is_kept_when_every_rank_still_has_one() -> None:
    assert share_cores([0, 1], 1) == CoreShare((0,), (1,))
    assert share_cores([5, 1, 3, 3], 2) == CoreShare((1, 3), (5,))  # sorted, once each
    # No core to spare: the engine gets them all and the load generator shares them.
    assert share_cores([0, 1], 2) == CoreShare((0, 1), ())
    assert share_cores([7], 1) == CoreShare((7,), ())
    with pytest.raises(ValueError, match="at least one rank"):
        share_cores([0, 1], 0)


def _sla(target: Any = "cpu", env: dict[str, str] | None = None, **more: Any) -> Any:
    doc = {
        "model": {"synth": "tiny-llama"},
        "target": target,
        "engine": {"env": env or {}},
        "workload": {
            "input_tokens": 8,
            "output_tokens": 4,
            "arrival": {"process": "poisson", "rate": 1},
            "requests": 2,
        },
        **more,
    }
    return parse_sla(yaml.safe_dump(doc))


def _engine(sla: Any, tmp_path: Path, params: dict[str, Any] | None = None) -> Any:
    return launch.make_engine(
        sla, Path("/py"), tmp_path, params or {}, tmp_path / "engine.log", engine=VLLM
    )


def test_a_cpu_engine_runs_on_all_cores_but_the_load_generators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "usable_cpus", lambda: [0, 1, 2, 3])
    assert _engine(_sla(), tmp_path).cpus == (0, 1, 2)
    # Two replicas: each its own part of the engine's cores, the last core still kept.
    sla = _sla(search={"data_parallel": "replicas"})
    two = _engine(sla, tmp_path, {"data_parallel_size": 2})
    assert isinstance(two, ReplicaSet)
    assert [s.cpus for s in two.servers] == [(0,), (1,)]  # type: ignore[attr-defined]
    # Where the SLA binds the engine's threads itself, the tuner pins nothing.
    assert VLLM.cpu_bind_env is not None
    assert _engine(_sla(env={VLLM.cpu_bind_env: "2,3"}), tmp_path).cpus is None
    # A GPU target's engine is not pinned.
    assert _engine(_sla(target={"gpu": 0}), tmp_path).cpus is None


def test_on_two_cores_one_rank_leaves_a_core_to_keep_and_two_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "usable_cpus", lambda: [0, 1])
    assert _engine(_sla(), tmp_path).cpus == (0,)
    two = _engine(_sla(search={"data_parallel": "replicas"}), tmp_path, {"data_parallel_size": 2})
    assert [s.cpus for s in two.servers] == [(0,), (1,)]


def _affinities(proc: Any) -> list[list[int]]:
    """Launch ``proc``; the CPU cores of each of its processes; stop it."""

    async def run() -> list[list[int]]:
        try:
            await asyncio.wait_for(proc.launch(), BOUND_S)
            return [p.cpu_affinity() for p in proc.processes()]
        finally:
            await proc.stop()

    return asyncio.run(run())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_the_server_runs_on_the_given_cores_and_the_tuner_keeps_its_own(tmp_path: Path) -> None:
    core = min(os.sched_getaffinity(0))
    proc = STANDIN.process(dataclasses.replace(_launch_spec(tmp_path), cpus=(core,)))
    assert isinstance(proc, ServerProcess)

    affinities = _affinities(proc)
    assert affinities and all(a == [core] for a in affinities), affinities
    assert f"the engine runs on CPU cores {core}" in (tmp_path / "engine.log").read_text()
    assert psutil.Process().cpu_affinity() == sorted(os.sched_getaffinity(0))  # ours unchanged


def test_cores_that_cannot_be_set_leave_the_tuners_and_the_log_says_so(tmp_path: Path) -> None:
    proc = STANDIN.process(dataclasses.replace(_launch_spec(tmp_path), cpus=(4095,)))

    mine = sorted(os.sched_getaffinity(0))
    assert all(a == mine for a in _affinities(proc))
    cores = ",".join(map(str, mine))
    log = (tmp_path / "engine.log").read_text()
    assert f"the engine runs on CPU cores {cores} (asked for (4095,))" in log
