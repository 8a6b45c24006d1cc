"""Trials as Ray tasks: many GPUs, many nodes, one Optuna study.

Why Ray core tasks and not a Ray Tune ``Tuner``: the study already is an ask/tell loop over an
RDB storage with constraints, resumable and shared by every process that opens it. Ray Tune
would own the trial lifecycle (and its ``OptunaSearch`` drops Optuna's constraints, on which
feasibility rests here); what this tool needs from Ray is placement — "run this launch on a
node that has N free GPUs" — and that is exactly a task with ``num_gpus=N``. So each trial is
one task that runs :func:`autotuner.search.trial.run_trial` where Ray put it and returns the result
plus its artifacts, and the study loop on the head node stays the only writer of the study.

- Resources: a GPU target's trial asks for tensor x pipeline parallel GPUs (Ray sets
  ``CUDA_VISIBLE_DEVICES`` for it; the engine gets those ids); a CPU target's trial asks for
  ``cpus_per_trial`` CPUs (default: all of one node's, since a CPU engine measured next to
  another one measures both).
- Failures: tasks are never retried by Ray (``max_retries=0``): a lost worker or node fails
  that trial with cause ``worker_lost`` and the study goes on. The engine a dead worker
  started is reaped by its guard process, which watches the worker's PID.
- Artifacts: each task works in a temporary directory on its node and returns it as a
  gzipped tarball, unpacked into the study's trial directory on the head node.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import tarfile
import tempfile
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any, Literal

from autotuner.core.types import ParamValue
from autotuner.engines.base import EngineAdapter
from autotuner.search.executors import gpus_needed
from autotuner.search.trial import SearchSettings, TrialResult
from autotuner.sla.spec import Sla

logger = logging.getLogger(__name__)

WORKER_LOST = "worker_lost"


def _gpu_uuids(ids: list[str]) -> list[str]:
    """NVML UUIDs of the GPUs Ray gave this task (for the record: which GPU ran what)."""
    try:
        import pynvml

        from autotuner.core.hardware import nvml_text

        pynvml.nvmlInit()
        try:
            out = []
            for i in ids:
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(i))
                out.append(nvml_text(pynvml.nvmlDeviceGetUUID(handle)))
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        logger.debug("no NVML UUIDs for CUDA devices %s", ids, exc_info=True)
        return []


def remote_trial(
    sla: Sla,
    python: str,
    model_dir: str,
    params: dict[str, ParamValue],
    settings: SearchSettings,
    gpu: bool,
    adapter: EngineAdapter,
) -> tuple[TrialResult, bytes]:
    """The body of a Ray task (runs on the worker node); ``adapter`` is the study's, shipped
    with the task."""
    import ray

    from autotuner.measure.launch import resolve_model
    from autotuner.search.trial import run_trial

    model = Path(model_dir)
    if not (model / "config.json").is_file():
        model = resolve_model(sla, print)  # a generated model is generated on this node too
    cuda = [str(i) for i in ray.get_gpu_ids()] if gpu else None
    with tempfile.TemporaryDirectory(prefix="autotuner-trial-") as tmp:
        run_dir = Path(tmp) / "trial"
        result = run_trial(
            params,
            sla,
            python=Path(python),
            model_dir=model,
            run_dir=run_dir,
            cuda_devices=cuda,
            adapter=adapter,
            settings=settings,
            say=print,
        )
        extra = {
            **result.extra,
            "node": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "worker_pid": os.getpid(),
            "cuda_visible_devices": cuda,
        }
        if cuda:
            extra["gpu_uuids"] = _gpu_uuids(cuda)
        result = dataclasses.replace(result, extra=extra)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(run_dir, arcname=".")
    return result, buf.getvalue()


def _unpack(archive: bytes, trial_dir: Path) -> None:
    trial_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(trial_dir, filter="data")  # refuses absolute paths and links out


class RayExecutor:
    """Runs each trial as a Ray task with the resources its engine needs."""

    name = "ray"

    def __init__(
        self,
        sla: Sla,
        *,
        adapter: EngineAdapter,
        python: Path,
        model_dir: Path,
        settings: SearchSettings,
        address: str | None = None,
        cpus_per_trial: float | None = None,
        num_cpus: int | None = None,
        say: Any = print,
        task: Callable[..., tuple[TrialResult, bytes]] = remote_trial,
    ) -> None:
        import ray

        self._ray = ray
        self.sla = sla
        self.adapter = adapter
        self.python = str(python)
        self.model_dir = str(model_dir)
        self.settings = settings
        self.gpu = sla.target.kind != "cpu"
        self.say = say
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
            if address:
                kwargs["address"] = address
            elif num_cpus is not None:
                kwargs["num_cpus"] = num_cpus
            ray.init(**kwargs)
        resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
        nodes = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        per_node = max((n.get("Resources", {}).get("CPU", 1.0) for n in nodes), default=1.0)
        self.cpus_per_trial = float(cpus_per_trial or per_node)
        self.total_gpus = int(resources.get("GPU", 0))
        self.total_cpus = float(resources.get("CPU", 1.0))
        if self.gpu and self.total_gpus == 0:
            raise RuntimeError("the SLA targets GPUs but the Ray cluster has none")
        say(
            f"ray: {len(nodes)} node(s), {self.total_cpus:g} CPUs, {self.total_gpus} GPUs; "
            + (
                "one trial per GPU set"
                if self.gpu
                else f"{self.cpus_per_trial:g} CPUs per trial (CPU engines)"
            )
        )
        self._task = ray.remote(max_retries=0)(task)
        self._pending: dict[Any, tuple[dict[str, ParamValue], Path]] = {}

    def capacity(self) -> int:
        if self.gpu:
            return max(1, self.total_gpus)  # tasks needing 2+ GPUs wait in Ray's queue
        return max(1, int(self.total_cpus // self.cpus_per_trial))

    def submit(
        self,
        params: dict[str, ParamValue],
        trial_dir: Path,
        settings: SearchSettings | None = None,
        *,
        start_load: float | None = None,
    ) -> Hashable:
        settings = settings or self.settings
        if start_load is not None:  # a candidate raced against the incumbent
            settings = dataclasses.replace(settings, start_load=start_load)
        gpus = gpus_needed(params, self.adapter.roles) if self.gpu else 0
        ref = self._task.options(num_gpus=gpus, num_cpus=0 if self.gpu else self.cpus_per_trial)
        handle = ref.remote(
            self.sla,
            self.python,
            self.model_dir,
            params,
            settings,
            self.gpu,
            self.adapter,
        )
        self._pending[handle] = (params, trial_dir)
        return handle  # type: ignore[no-any-return]

    def wait_any(self) -> list[tuple[Hashable, TrialResult]]:
        ray = self._ray
        ready, _ = ray.wait(list(self._pending), num_returns=1)
        out: list[tuple[Hashable, TrialResult]] = []
        for ref in ready:
            params, trial_dir = self._pending.pop(ref)
            try:
                result, archive = ray.get(ref)
            except ray.exceptions.RayError as exc:
                out.append((ref, self._lost(params, trial_dir, exc)))
                continue
            _unpack(archive, trial_dir)
            result = dataclasses.replace(
                result,
                log_path=str(trial_dir / "engine.log"),
                extra={**result.extra, "executor": "ray"},
            )
            result.write(trial_dir / "trial.json")
            out.append((ref, result))
        return out

    def _lost(self, params: dict[str, ParamValue], trial_dir: Path, exc: Exception) -> TrialResult:
        from autotuner.measure.bench import arrival_of

        kind: Literal["rate", "concurrency"] = (
            "rate" if arrival_of(self.sla).open_loop else "concurrency"
        )
        # The reason keeps the first line; the whole error (a remote traceback) goes to the log.
        logger.info("Ray trial in %s lost: %s", trial_dir, exc)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        result = TrialResult(
            dict(params),
            "failed",
            kind,
            reason=f"the Ray worker running this trial was lost: {type(exc).__name__}: {first}",
            cause=WORKER_LOST,
            extra={"executor": "ray"},
        )
        trial_dir.mkdir(parents=True, exist_ok=True)
        result.write(trial_dir / "trial.json")
        return result

    def run_one(
        self, params: Mapping[str, ParamValue], trial_dir: Path, settings: SearchSettings
    ) -> TrialResult:
        """Submit one trial and wait for it (confirmation runs go one at a time)."""
        handle = self.submit(dict(params), trial_dir, settings)
        while True:
            for h, result in self.wait_any():
                if h == handle:
                    return result

    def close(self) -> None:
        for ref in list(self._pending):
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # already finished, or Ray is shutting down
                logger.debug("could not cancel Ray task %s", ref, exc_info=True)
        self._pending.clear()
