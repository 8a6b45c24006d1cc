"""Profile one config with the engine's own profiler: a launch of its own, after the search.

The profiler's overhead must not touch a measured capacity, so profiling never shares a
launch with a load level: the engine is started once more with the profiler configured by its
adapter (:meth:`~autotuner.engines.base.EngineAdapter.profiler`), served the SLA's warm-up
requests, then a short run at the SLA's own load with the capture started after the warm-up
and stopped when the last request ends. The traces are aggregated by
:mod:`autotuner.measure.kernels`; ``run_dir`` keeps ``engine.log``, ``traces/`` and
``kernel_breakdown.json``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import aiohttp

from autotuner.core.paths import atomic_write_text
from autotuner.core.types import ParamValue
from autotuner.engines.base import EngineAdapter, EngineLaunchError, ProfilerSetup
from autotuner.measure.bench import arrival_of, build_plan
from autotuner.measure.kernels import KernelBreakdown, TraceError, aggregate, read_trace
from autotuner.measure.launch import make_engine
from autotuner.measure.loadgen import run_load
from autotuner.sla.spec import Sla

Say = Callable[[str], None]


def enabled(sla: Sla) -> bool:
    """Whether a tune profiles: ``tune.profile``, by default on for GPU targets only (on a
    CPU engine it is one more engine start per config for the quick start to wait for)."""
    return sla.tune.profile if sla.tune.profile is not None else sla.target.kind == "gpu"


class ProfileFailed(RuntimeError):
    """No breakdown came of a profiling launch; the message says why (for the log line)."""


@dataclass(frozen=True)
class ProfileWindow:
    """How long a capture runs: ``requests`` at the SLA's own load after its warm-up."""

    requests: int = 16
    trace_wait_s: float = 300.0  # for the workers to finish writing their traces
    http_timeout_s: float = 600.0  # stop_profile returns once the traces are written


class _Capture:
    """Entered after the warm-up (run_load's ``around``): starts and stops the profiler."""

    def __init__(self, urls: Sequence[str], setup: ProfilerSetup, timeout_s: float) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.setup = setup
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.started = 0.0
        self.window_s = 0.0

    async def _post(self, path: str) -> None:
        """POST ``path`` to every server of the config (replicas), together."""
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            await asyncio.gather(*(self._one(session, url + path) for url in self.urls))

    async def _one(self, session: aiohttp.ClientSession, url: str) -> None:
        async with session.post(url) as resp:
            if resp.status != 200:
                body = (await resp.text())[:300]
                raise ProfileFailed(f"POST {url} answered HTTP {resp.status}: {body}")

    async def __aenter__(self) -> _Capture:
        await self._post(self.setup.start_path)
        self.started = time.monotonic()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.window_s = time.monotonic() - self.started
        await self._post(self.setup.stop_path)


def worker_traces(trace_dir: Path, skip: Sequence[str]) -> list[Path]:
    """The workers' trace files in ``trace_dir`` (files named with a ``skip`` part are not)."""
    if not trace_dir.is_dir():
        return []
    return sorted(
        p
        for p in trace_dir.rglob("*")
        if p.is_file()
        and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
        and not any(s in p.name for s in skip)
    )


async def _settled(trace_dir: Path, skip: Sequence[str], wait_s: float) -> list[Path]:
    """The trace files once some exist and their sizes stopped changing (or ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    last: dict[Path, int] = {}
    while time.monotonic() < deadline:
        now = {p: p.stat().st_size for p in worker_traces(trace_dir, skip)}
        if now and now == last:
            return sorted(now)
        last = now
        await asyncio.sleep(1.0)
    return sorted(last)


def profile_config(
    params: Mapping[str, ParamValue],
    sla: Sla,
    *,
    engine: EngineAdapter,
    python: Path,
    version: str,
    model_dir: Path,
    run_dir: Path,
    cuda_devices: list[str] | None,
    window: ProfileWindow | None = None,
    say: Say = print,
) -> KernelBreakdown:
    """Launch ``params`` under ``engine``'s profiler (the adapter of the SLA's engine kind),
    capture one window, always stop it.

    Raises :class:`ProfileFailed` when the engine version has no profiler the adapter can
    drive, the launch fails, the capture is refused, or no readable trace appears.
    """
    window = window or ProfileWindow()
    adapter = engine
    trace_dir = (run_dir / "traces").absolute()
    setup = adapter.profiler(version, trace_dir)
    if setup is None:
        raise ProfileFailed(f"{adapter.display_name} {version} has no profiler the tuner drives")
    if trace_dir.exists():  # an earlier profile of this config: its traces are not ours
        shutil.rmtree(trace_dir)
    trace_dir.mkdir(parents=True)
    # The launch a trial makes (layout, replicas, CPU binding), the profiler's flags added.
    process = make_engine(
        sla,
        python,
        model_dir,
        params,
        run_dir / "engine.log",
        cuda_devices,
        engine=adapter,
        tuner_args=setup.args,
        tuner_env=setup.env,
    )
    plan = build_plan(
        sla, model_dir, arrival_of(sla), requests=window.requests, roles=adapter.roles
    )

    async def go() -> tuple[list[Path], float]:
        try:
            endpoint = await process.launch()
        except EngineLaunchError as exc:
            raise ProfileFailed(f"the profiling launch failed: {exc}") from None
        try:
            say(f"    engine healthy after {endpoint.startup_s:.0f} s; profiling")
            capture = _Capture(endpoint.urls, setup, window.http_timeout_s)
            try:
                result = await run_load(endpoint.urls, endpoint.model, plan, around=capture)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ProfileFailed(f"the profiler did not answer: {exc!r}") from None
            if not result.ok:
                raise ProfileFailed(
                    f"no request succeeded in the profiled window: {result.errors()}"
                )
            files = await _settled(trace_dir, setup.skip, window.trace_wait_s)
            return files, capture.window_s
        finally:
            await process.stop()

    run_dir.mkdir(parents=True, exist_ok=True)
    files, window_s = asyncio.run(go())
    if not files:
        raise ProfileFailed(f"the engine wrote no trace into {trace_dir}")
    try:
        breakdown = aggregate([read_trace(f) for f in files], window_s=window_s)
    except TraceError as exc:
        raise ProfileFailed(str(exc)) from None
    atomic_write_text(run_dir / "kernel_breakdown.json", json.dumps(breakdown.to_dict(), indent=1))
    return breakdown
