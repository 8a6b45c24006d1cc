"""One doctor run: every check for an SLA (or an engine environment alone), as a report.

Order: the engine environment (does it probe, does its build fit the target), the GPUs
(NVML or nvidia-smi), torch in the engine's interpreter (a subprocess), the SLA's features
against the engine version and the hardware, then the host. Nothing is launched.
A check that cannot run because an earlier one failed (no engine version: no feature check)
is left out; the earlier failure is in the report.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotuner.core import hardware, paths
from autotuner.core.types import ParamValue
from autotuner.doctor import features, host, memory_fit
from autotuner.doctor.engine_findings import REINSTALL, torch_findings
from autotuner.doctor.gpu import GpuScan, SmiRunner, scan
from autotuner.doctor.gpu_findings import MemoryShare, gpu_findings
from autotuner.doctor.torchprobe import PROBE_TIMEOUT_S, probe_torch
from autotuner.engines import envs
from autotuner.engines.base import EngineAdapter
from autotuner.records.doctor import DoctorReport, Finding, exit_code_of
from autotuner.sla.spec import Sla
from autotuner.space import SearchSpace

__all__ = ["diagnose"]


def _engine_python(sla: Sla | None, engine: envs.EngineEnv | str | None) -> tuple[Path, str]:
    """The interpreter to check, and how it was chosen."""
    if isinstance(engine, envs.EngineEnv):  # the daemon: the registered one, never an override
        return engine.python, f"engine env {engine.name!r}"
    if sla is not None:
        return envs.resolve_python(sla.engine.name, sla.engine.python, sla.engine.kind)
    if engine is not None:  # named: that entry, whatever $AUTOTUNER_VLLM_PYTHON says
        env = envs.get(engine)
        return env.python, f"engine env {env.name!r}"
    return envs.resolve_python(None, None)


def kind_of(sla: Sla | None, engine: envs.EngineEnv | str | None) -> str | None:
    """The engine kind a doctor run checks: the SLA's, else the engine environment's (None:
    the default kind, also for a name that is not registered: the run reports that)."""
    if sla is not None:
        return sla.engine.kind
    if isinstance(engine, envs.EngineEnv):
        return engine.kind
    if engine is not None:
        try:
            return envs.get(engine).kind
        except envs.EngineEnvError:
            return None
    return None


def memory_share(adapter: EngineAdapter, hw: hardware.HardwareProfile) -> MemoryShare:
    """The engine's memory-share option and its default on ``hw``, from the adapter (an
    engine without such an option: a share of 0.9 is assumed)."""
    option = adapter.roles.memory_fraction
    default = adapter.defaults(hw).get(option) if option is not None else None
    return MemoryShare(
        option or "memory share",
        float(default) if isinstance(default, int | float) else 0.9,
    )


def _target(sla: Sla | None, device: str | None) -> tuple[str, list[str] | None]:
    """``("cpu" | "gpu", devices)``; devices None: every GPU (an engine checked alone)."""
    if sla is not None:
        return sla.target.kind, list(sla.target.devices)
    return ("gpu", None) if device == "gpu" else ("cpu", None)


def _profile(kind: str, gpus: GpuScan | None) -> hardware.HardwareProfile:
    infos = tuple(
        hardware.GpuInfo(
            index=g.index,
            uuid=g.uuid,
            name=g.name,
            compute_capability=g.compute_capability,
            memory_total=g.memory_total,
            memory_free=g.memory_free,
        )
        for g in (gpus.gpus if gpus is not None else ())
        if g.compute_capability is not None
    )
    return hardware.HardwareProfile(
        device="gpu" if kind == "gpu" else "cpu",
        cpu=hardware.probe_cpu(),
        gpus=infos,
        driver_version=None if gpus is None else gpus.driver,
    )


def _highest(
    space: SearchSpace | None, fixed: list[features.Fixed], name: str | None
) -> ParamValue:
    """The largest value of option ``name`` a launch may get: fixed, searched, or the default
    (None: the engine has no such option)."""
    if name is None:
        return None
    if space is None:
        return features.value_of(fixed, name)
    if name in space.fixed:
        return space.fixed[name]
    if name in space.names:
        p = space.param(name)
        values = list(p.choices) if p.choices is not None else [p.high]
        nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        return max(nums) if nums else None
    return space.defaults.get(name)


def diagnose(
    sla: Sla | None,
    *,
    subject: str,
    adapter: EngineAdapter,
    engine: envs.EngineEnv | str | None = None,
    trials_dir: Path = Path("trials"),
    nvml: Any = None,
    smi: SmiRunner | None = None,
    torch_timeout_s: float = PROBE_TIMEOUT_S,
) -> DoctorReport:
    """Check ``sla`` (or, without one, the engine environment ``engine``: a name, a registered
    entry, or None for the only one) before any launch. ``adapter``: the adapter of the engine
    kind checked (the caller resolves it: :func:`kind_of`). ``nvml`` / ``smi`` stand in for
    ``pynvml`` / ``nvidia-smi`` in tests."""
    out: list[Finding] = []
    python: Path | None = None
    version = engine_text = device = None
    dist = ""
    try:
        python, how = _engine_python(sla, engine)
        dist, version = envs.probe_version(python)
        device = adapter.env_traits.device_of(dist, version)
        engine_text = f"{dist} {version}"
        out.append(Finding(check="engine", status="ok", found=how))
    except envs.EngineEnvError as e:
        out.append(
            Finding(
                check="engine",
                status="fatal",
                found=str(e),
                action=f"`autotuner engine list` shows what is registered; {REINSTALL}",
            )
        )
    target_kind, devices = _target(sla, device)
    target = (
        "cpu"
        if target_kind == "cpu"
        else ("all GPUs" if devices is None else "gpu " + ",".join(devices))
    )
    if device is not None and device != target_kind:
        out.append(
            Finding(
                check="engine.device",
                status="fatal",
                found=f"{engine_text} is a {device} build, the target is {target}",
                action=f"use an engine environment built for {target_kind}",
            )
        )
    gpus = scan(devices, nvml=nvml, smi=smi) if target_kind == "gpu" else None
    hw = _profile(target_kind, gpus)
    fixed = features.fixed_options(sla, adapter) if sla is not None else []
    space: SearchSpace | None = None
    feature_out: list[Finding] = []
    if sla is not None and version is not None:
        feature_out, space = features.feature_findings(sla, version, hw, adapter)
    roles = adapter.roles
    share = memory_share(adapter, hw)
    mem_util = _highest(space, fixed, roles.memory_fraction)
    util = float(mem_util) if isinstance(mem_util, int | float) else None
    ranks = host.ranks_of([_highest(space, fixed, roles.tensor_parallel)]) * host.ranks_of(
        [_highest(space, fixed, roles.pipeline_parallel)]
    )
    if gpus is not None:
        out += gpu_findings(gpus, mem_util=util, share=share)
    if python is not None and version is not None:
        facts = probe_torch(
            python,
            distribution=dist,
            gpu=gpus is not None,
            cuda_devices=[g.uuid for g in gpus.gpus] or devices if gpus is not None else None,
            timeout_s=torch_timeout_s,
        )
        wanted = len(gpus.gpus) if gpus is not None else 0
        out += torch_findings(facts, engine=engine_text or "", scan=gpus, gpus_wanted=wanted)
    out += feature_out
    if sla is not None and space is not None:
        fit = memory_fit.baseline_fit(sla, space, adapter, hw)
        out += [fit] if fit is not None else []
    model_dir = None
    if sla is not None and sla.model.path is not None:
        model_dir = sla.resolve_path(sla.model.path)
    out += host.disk_findings(host.places(model_dir, trials_dir, paths.home(), adapter))
    out.append(host.shm_finding(ranks))
    out += host.cpu_findings(
        hw.cpu, device=target_kind, ranks=ranks, mem_util=util, option=share.option
    )
    out.append(host.load_finding(target_kind))
    return DoctorReport(
        subject=subject,
        engine=engine_text,
        target=target,
        checked=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        exit_code=exit_code_of(out),
        findings=out,
    )


MARK = {"ok": "ok   ", "warning": "WARN ", "fatal": "FATAL"}
VERDICT = {
    0: "all checks passed",
    1: "warnings: a launch may work, see above",
    2: "a launch would fail: fix the FATAL lines first",
}


def render(report: DoctorReport) -> str:
    """The report for people: one line per finding, its action indented below."""
    lines = [f"doctor: {report.subject} (engine {report.engine or '?'}, target {report.target})"]
    for f in report.findings:
        lines.append(f"  {MARK[f.status]} {f.check}: {f.found}")
        if f.action and f.status != "ok":
            lines.append(f"         -> {f.action}")
    lines.append(f"{VERDICT[report.exit_code]} (exit {report.exit_code})")
    return "\n".join(lines)
