"""What the doctor reads of the GPUs: NVML (``pynvml``), else ``nvidia-smi``.

:func:`scan` returns a :class:`GpuScan` of the listed devices (None: every GPU): name,
compute capability, memory (total, free, held by other processes), ECC (mode, pending mode,
volatile uncorrected errors), clocks (SM now and at most, slowdown reasons), PCIe link (now vs
at most), MIG mode, and the driver with the newest CUDA it supports. When the tuner's Python
has no ``pynvml``, the same facts come from ``nvidia-smi --query-gpu=... --format=csv`` (a
fixed argv, never a shell); it reports no slowdown reasons or ECC error counts.

A device the query does not support (ECC on consumer boards, clocks on some VMs) reads None.
Tests pass a fake module as ``scan(..., nvml=)`` and a fake runner as ``smi=``.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotuner.core.hardware import nvml_handles, nvml_known, nvml_text

__all__ = ["GpuProcess", "GpuScan", "GpuState", "scan"]

MIB = 1 << 20
SMI_TIMEOUT_S = 30.0

# Clock slowdown reasons that mean the hardware is protecting itself (nvmlClocksEventReason*);
# idle, application-clock and power-cap reasons are normal on a healthy GPU.
SLOWDOWN_BITS: dict[int, str] = {
    0x8: "hardware slowdown (power brake or temperature)",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class GpuState:
    """One GPU now; ``None`` where the device or the source does not report a value."""

    index: int
    uuid: str
    name: str
    compute_capability: tuple[int, int] | None
    memory_total: int
    memory_free: int | None = None
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    ecc_uncorrected: int | None = None  # volatile (since the last reboot)
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    slowdowns: tuple[str, ...] = ()
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    mig_current: bool | None = None
    mig_pending: bool | None = None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class GpuScan:
    """The GPUs asked for, or why none could be read (``error``)."""

    source: str  # "nvml", "nvidia-smi" or "none"
    gpus: tuple[GpuState, ...] = ()
    driver: str | None = None
    cuda_max: tuple[int, int] | None = None  # newest CUDA the driver supports
    error: str | None = None
    missing: tuple[str, ...] = field(default_factory=tuple)  # asked-for devices not found
    known: tuple[str, ...] = ()  # every GPU of the machine, "0 NVIDIA H200 (GPU-...)"


def cuda_of(number: int) -> tuple[int, int]:
    """NVML's CUDA driver version number: 12080 -> (12, 8)."""
    return number // 1000, number % 1000 // 10


# --------------------------------------------------------------------------- NVML


def _nvml_state(nvml: Any, h: Any) -> GpuState:
    error = nvml.NVMLError

    def opt(name: str, *args: Any) -> Any:
        fn = getattr(nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(h, *args)
        except error:
            return None

    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    cc = opt("nvmlDeviceGetCudaComputeCapability")
    ecc = opt("nvmlDeviceGetEccMode")
    mig = opt("nvmlDeviceGetMigMode")
    reasons = opt("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:
        reasons = opt("nvmlDeviceGetCurrentClocksThrottleReasons")
    procs = opt("nvmlDeviceGetComputeRunningProcesses") or []
    sm, mem_type = getattr(nvml, "NVML_CLOCK_SM", 1), 1  # uncorrected
    return GpuState(
        index=int(nvml.nvmlDeviceGetIndex(h)),
        uuid=nvml_text(nvml.nvmlDeviceGetUUID(h)),
        name=nvml_text(nvml.nvmlDeviceGetName(h)),
        compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
        memory_total=int(mem.total),
        memory_free=int(mem.free),
        ecc_current=None if ecc is None else bool(ecc[0]),
        ecc_pending=None if ecc is None else bool(ecc[1]),
        ecc_uncorrected=opt("nvmlDeviceGetTotalEccErrors", mem_type, 0),  # 0: volatile
        sm_clock_mhz=opt("nvmlDeviceGetClockInfo", sm),
        sm_clock_max_mhz=opt("nvmlDeviceGetMaxClockInfo", sm),
        slowdowns=tuple(why for bit, why in SLOWDOWN_BITS.items() if int(reasons or 0) & bit),
        pcie_gen=opt("nvmlDeviceGetCurrPcieLinkGeneration"),
        pcie_gen_max=opt("nvmlDeviceGetMaxPcieLinkGeneration"),
        pcie_width=opt("nvmlDeviceGetCurrPcieLinkWidth"),
        pcie_width_max=opt("nvmlDeviceGetMaxPcieLinkWidth"),
        mig_current=None if mig is None else bool(mig[0]),
        mig_pending=None if mig is None else bool(mig[1]),
        processes=tuple(
            GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
            for p in procs
        ),
    )


def _scan_nvml(nvml: Any, devices: Sequence[str] | None) -> GpuScan:
    error = nvml.NVMLError
    try:
        nvml.nvmlInit()
    except error as e:
        return GpuScan("none", error=f"NVML could not start ({nvml_text(e)})")
    try:
        count = int(nvml.nvmlDeviceGetCount())
        wanted = devices if devices is not None else [str(i) for i in range(count)]
        handles, missing = nvml_handles(nvml, wanted)
        gpus = tuple(_nvml_state(nvml, h) for h in handles)
        known = nvml_known(nvml) if missing else []
        driver = cuda = None
        with contextlib.suppress(error):
            driver = nvml_text(nvml.nvmlSystemGetDriverVersion())
        with contextlib.suppress(error):
            cuda = cuda_of(int(nvml.nvmlSystemGetCudaDriverVersion()))
        return GpuScan("nvml", gpus, driver, cuda, missing=tuple(missing), known=tuple(known))
    except error as e:
        return GpuScan("nvml", error=f"NVML query failed: {nvml_text(e)}")
    finally:
        with contextlib.suppress(error):
            nvml.nvmlShutdown()


# --------------------------------------------------------------------------- nvidia-smi

SMI_FIELDS = (
    "index",
    "uuid",
    "name",
    "compute_cap",
    "memory.total",
    "memory.free",
    "driver_version",
    "ecc.mode.current",
    "ecc.mode.pending",
    "clocks.sm",
    "clocks.max.sm",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "mig.mode.current",
    "mig.mode.pending",
)
SMI_GPU_ARGV = ("--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader,nounits")
SMI_APPS_ARGV = ("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")

# Runs nvidia-smi with these arguments and returns its stdout; raises OSError on failure.
SmiRunner = Callable[[Sequence[str]], str]


def run_smi(args: Sequence[str]) -> str:
    """``nvidia-smi ARGS`` (argv, no shell, time-out); OSError when it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise OSError("nvidia-smi not found on PATH")
    try:
        proc = subprocess.run(
            [exe, *args],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise OSError(f"nvidia-smi did not answer within {SMI_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        raise OSError(f"nvidia-smi exited {proc.returncode}: {last[0]}")
    return proc.stdout


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _flag(text: str) -> bool | None:
    text = text.strip().lower()
    return {"enabled": True, "disabled": False}.get(text)


def _cc(text: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    return (int(m[1]), int(m[2])) if m else None


def _scan_smi(smi: SmiRunner, devices: Sequence[str] | None) -> GpuScan:
    try:
        rows = [r.split(",") for r in smi(SMI_GPU_ARGV).strip().splitlines() if r.strip()]
        header = smi(())  # the banner carries "CUDA Version: 12.8"
    except OSError as e:
        return GpuScan("none", error=str(e))
    try:
        apps_text = smi(SMI_APPS_ARGV)
    except OSError:
        apps_text = ""
    apps: dict[str, list[GpuProcess]] = {}
    for line in apps_text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1].isdigit():
            used = _int(parts[2])
            apps.setdefault(parts[0], []).append(
                GpuProcess(int(parts[1]), None if used is None else used * MIB)
            )
    gpus: list[GpuState] = []
    driver = None
    for row in rows:
        if len(row) != len(SMI_FIELDS):
            return GpuScan("nvidia-smi", error=f"unexpected nvidia-smi line: {','.join(row)!r}")
        f = dict(zip(SMI_FIELDS, (c.strip() for c in row), strict=True))
        driver = f["driver_version"]
        total, free = _int(f["memory.total"]), _int(f["memory.free"])
        gpus.append(
            GpuState(
                index=int(f["index"]),
                uuid=f["uuid"],
                name=f["name"],
                compute_capability=_cc(f["compute_cap"]),
                memory_total=(total or 0) * MIB,
                memory_free=None if free is None else free * MIB,
                ecc_current=_flag(f["ecc.mode.current"]),
                ecc_pending=_flag(f["ecc.mode.pending"]),
                sm_clock_mhz=_int(f["clocks.sm"]),
                sm_clock_max_mhz=_int(f["clocks.max.sm"]),
                pcie_gen=_int(f["pcie.link.gen.current"]),
                pcie_gen_max=_int(f["pcie.link.gen.max"]),
                pcie_width=_int(f["pcie.link.width.current"]),
                pcie_width_max=_int(f["pcie.link.width.max"]),
                mig_current=_flag(f["mig.mode.current"]),
                mig_pending=_flag(f["mig.mode.pending"]),
                processes=tuple(apps.get(f["uuid"], ())),
            )
        )
    m = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", header)
    cuda = (int(m[1]), int(m[2])) if m else None
    picked, missing = _pick(gpus, devices)
    known = tuple(f"{g.index} {g.name} ({g.uuid})" for g in gpus)
    return GpuScan("nvidia-smi", tuple(picked), driver, cuda, missing=tuple(missing), known=known)


def _pick(gpus: list[GpuState], devices: Sequence[str] | None) -> tuple[list[GpuState], list[str]]:
    if devices is None:
        return gpus, []
    picked, missing = [], []
    for dev in devices:
        hit = [g for g in gpus if (str(g.index) == dev if dev.isdigit() else g.uuid == dev)]
        if hit:
            picked.append(hit[0])
        else:
            missing.append(dev)
    return picked, missing


# --------------------------------------------------------------------------- entry


def _import_nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def scan(
    devices: Sequence[str] | None, *, nvml: Any = None, smi: SmiRunner | None = None
) -> GpuScan:
    """The GPUs ``devices`` (indices or UUIDs; None: all). NVML first (``nvml``: the module
    or a stand-in; default: ``pynvml`` if importable), else ``nvidia-smi`` (``smi``: a
    stand-in for :func:`run_smi`)."""
    mod = nvml if nvml is not None else (None if smi is not None else _import_nvml())
    if mod is None:
        return _scan_smi(smi or run_smi, devices)
    found = _scan_nvml(mod, devices)
    if found.source == "none" and nvml is None and shutil.which("nvidia-smi"):
        return _scan_smi(run_smi, devices)  # a binding without its library: ask the tool
    return found
