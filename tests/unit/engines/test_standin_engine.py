"""The stand-in engine (tests/unit/engines/standin_engine) passes the whole engine contract.

It proves "one package per engine": an engine kind that lives entirely in one package outside
``autotuner/engines``, registered from here, runs every contract test (imported below) with
its own ``adapter``, ``samples`` and ``space_dir``, and serves a completion when launched.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from autotuner.engines import registry
from autotuner.engines.base import EngineAdapter, EngineLaunchError, LaunchCause, LaunchSpec
from autotuner.engines.process import ServerProcess
from autotuner.space import DeclaredOptions, newest_declarations
from tests.unit.engines.standin_engine import ADAPTER, SPACE_DIR, logs
from tests.unit.engines.test_engine_contract import *  # noqa: F403
from tests.unit.engines.test_engine_contract import Samples

# A request or a start that takes longer than this is a hang, not a slow machine.
BOUND_S = 60.0


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-in is in the registry for this module's tests only.

    The SLA's option check reads an engine's space from ``search_spaces/`` only
    (``sla.allowed`` calls ``space.newest_declarations`` without a folder, and the registry
    has no place for one): for the stand-in, whose space is in its package, that one lookup
    is pointed at :data:`SPACE_DIR`. Tuning has the same gap (``load_space_for`` finds a
    space through ``space_file``, in ``search_spaces/`` too); no test here tunes.
    """
    registry.kinds()  # the built-in engines first, so the stand-in is not the only one
    monkeypatch.setitem(registry._ADAPTERS, ADAPTER.kind, ADAPTER)
    real = newest_declarations

    def declarations(engine: str, *, directory: Path | None = None) -> DeclaredOptions:
        if engine == ADAPTER.space_name and directory is None:
            directory = SPACE_DIR
        return real(engine, directory=directory)

    monkeypatch.setattr("autotuner.sla.allowed.newest_declarations", declarations)
    yield


@pytest.fixture
def adapter() -> EngineAdapter:
    return ADAPTER


@pytest.fixture
def samples() -> Samples:
    return Samples(logs.SAMPLE_LOGS, ({"max_concurrency": 8}, ["--max-concurrency", "8"]))


@pytest.fixture
def space_dir() -> Path:
    return SPACE_DIR


def test_the_registry_finds_the_standin_while_registered() -> None:
    assert registry.get("standin") is ADAPTER
    assert "standin" in registry.kinds()
    assert registry.default_kind() != "standin"


def test_the_package_does_not_import_another_engine() -> None:
    package = SPACE_DIR
    for path in package.glob("*.py"):
        assert "autotuner.engines.vllm" not in path.read_text(), path.name


def _launch_spec(tmp_path: Path, extra: tuple[str, ...] = ()) -> LaunchSpec:
    return LaunchSpec(
        python=Path(sys.executable),
        model=tmp_path / "no-model",
        served_name="tiny",
        params={"max_concurrency": 4, "ttft_s": 0.001, "itl_s": 0.001},
        log_path=tmp_path / "engine.log",
        extra_args=extra,
        startup_timeout_s=BOUND_S,
    )


async def _serve_one(tmp_path: Path) -> tuple[str, list[int], int]:
    proc = ADAPTER.process(_launch_spec(tmp_path))
    assert isinstance(proc, ServerProcess)
    try:
        endpoint = await asyncio.wait_for(proc.launch(), BOUND_S)
        pids = [p.pid for p in proc.processes()]
        assert endpoint.base_url.startswith("http://127.0.0.1:")
        timeout = aiohttp.ClientTimeout(total=BOUND_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            body = {"model": endpoint.model, "prompt": "one two three", "max_tokens": 4}
            async with session.post(endpoint.base_url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                data = await resp.json()
        return data["choices"][0]["text"], pids, endpoint.pid
    finally:
        await proc.stop()
        assert proc.returncode() is not None


def test_the_standin_serves_a_completion_end_to_end(tmp_path: Path) -> None:
    text, pids, pid = asyncio.run(_serve_one(tmp_path))
    assert text.split() == ["t0", "t1", "t2", "t3"]
    assert pid in pids
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert alive == []
    log = (tmp_path / "engine.log").read_text()
    assert "served as tiny" in log


def test_a_failed_start_is_classified_from_the_standins_log(tmp_path: Path) -> None:
    # An argument the stand-in does not know: it exits at start, and its own argparse line
    # is what the adapter's log patterns classify.
    proc = ADAPTER.process(_launch_spec(tmp_path, ("--bogus", "1")))
    with pytest.raises(EngineLaunchError) as info:
        asyncio.run(asyncio.wait_for(proc.launch(), BOUND_S))
    assert info.value.cause == LaunchCause.UNKNOWN_FLAG
    assert info.value.returncode == 2
    assert any("unrecognized arguments: --bogus 1" in line for line in info.value.root_cause)
    assert proc.returncode() is not None
