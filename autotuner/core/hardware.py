"""Hardware profile of a target: its GPUs as NVML reports them, or the host CPU.

``probe(target)`` returns a frozen :class:`HardwareProfile`. For a GPU target it reads, for
each listed device (an index like ``"0"`` or a UUID like ``"GPU-8f3c..."``; NVML indices, which
follow PCI bus order): name, UUID, index, compute capability, memory total/free, SM and memory
max clocks, power limit, PCIe generation/width (max and current), ECC mode, and the driver and
CUDA driver versions. Every profile also carries the host CPU (model, usable cores, memory, NUMA
nodes, kernel, ISA flags), which is what a CPU target runs on.

Errors are :class:`HardwareError` with a message meant for the user: NVML not installed or not
starting (no driver), a GPU that does not exist (the message lists those that do).

All NVML calls sit in :func:`_nvml_gpus`; tests pass a small fake module as ``probe(..., nvml=)``.
Queries a device does not support (clocks on some VMs, ECC on consumer boards) become ``None``
and show as ``N/A`` in the CSV.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import platform
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import psutil

from autotuner.core.errors import BadInput
from autotuner.core.paths import atomic_write_text

__all__ = [
    "CSV_COLUMNS",
    "CpuInfo",
    "GpuInfo",
    "HardwareError",
    "HardwareProfile",
    "probe",
    "probe_cpu",
]

GIB = 1 << 30
NA = "N/A"

# The ISA flags that decide engine features (FP8 KV cache and AMX kernels on the CPU engine).
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "asimd", "sve")


class DeviceTarget(Protocol):
    """Where an engine runs, as the SLA's ``target`` gives it: ``kind`` "cpu" or "gpu" and the
    GPU indices or UUIDs (empty for CPU)."""

    @property
    def kind(self) -> str: ...

    @property
    def devices(self) -> list[str]: ...


class HardwareError(BadInput, RuntimeError):
    """The target's hardware can't be probed (no NVML, no driver, no such GPU)."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML sees it; ``None`` where the device does not report a value."""

    index: int
    uuid: str
    name: str
    compute_capability: tuple[int, int]
    memory_total: int  # bytes (NVML; CUDA sees ~0.6 GiB less)
    memory_free: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    power_limit_w: float | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    pcie_gen_current: int | None = None
    pcie_width_current: int | None = None
    ecc_enabled: bool | None = None


@dataclass(frozen=True)
class CpuInfo:
    """The host CPU and memory. ``numa_memory`` is MemTotal per NUMA node (bytes),
    ``numa_free`` MemFree per NUMA node (bytes; empty where not known)."""

    model: str
    cores: int  # CPUs this process may run on (sched_getaffinity)
    logical_cpus: int
    memory_total: int
    memory_available: int
    numa_memory: tuple[int, ...] = ()
    numa_node_of_first_cpu: int | None = None
    kernel: str = ""
    flags: frozenset[str] = field(default_factory=frozenset)
    numa_free: tuple[int, ...] = ()

    @property
    def numa_nodes(self) -> int:
        return max(1, len(self.numa_memory))

    @property
    def isa(self) -> list[str]:
        return [f for f in _ISA_FLAGS if f in self.flags]


@dataclass(frozen=True)
class HardwareProfile:
    """What a target runs on. ``device`` is ``"gpu"`` with ``gpus`` listed, else ``"cpu"``."""

    device: Literal["cpu", "gpu"]
    cpu: CpuInfo
    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    hostname: str = ""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """The lowest compute capability of the target's GPUs (what every rank must support)."""
        return min((g.compute_capability for g in self.gpus), default=None)

    @property
    def device_memory_total(self) -> int:
        """Memory one engine rank budgets from: the smallest GPU, or (CPU) the NUMA node of
        the first usable core, as the CPU engine does; the whole host without NUMA info.
        0 for a GPU target where no GPU was found (doctor reports that, it does not crash)."""
        if self.device == "gpu":
            return min((g.memory_total for g in self.gpus), default=0)
        node = self.cpu.numa_node_of_first_cpu
        if node is not None and 0 <= node < len(self.cpu.numa_memory):
            return self.cpu.numa_memory[node]
        return self.cpu.memory_total

    @property
    def device_memory_free(self) -> int | None:
        """Free memory at probe time: the least free GPU; on a CPU target, of the memory
        :attr:`device_memory_total` counts: the free memory of the NUMA node the budget comes
        from (the host's available memory, which spans every node, would read more than that
        node's total on a host of two nodes), else the host's available memory."""
        if self.device == "gpu":
            free = [g.memory_free for g in self.gpus]
            return None if any(f is None for f in free) else min(f for f in free if f is not None)
        node = self.cpu.numa_node_of_first_cpu
        if node is not None and 0 <= node < len(self.cpu.numa_memory):
            if node < len(self.cpu.numa_free):
                return self.cpu.numa_free[node]
            # No per-node figure: at most the node's total.
            return min(self.cpu.memory_available, self.cpu.numa_memory[node])
        return self.cpu.memory_available

    def to_csv_rows(self) -> list[dict[str, str]]:
        """One row per device (each GPU, or the CPU); the same columns either way."""
        c = self.cpu
        host = {
            "driver_version": _na(self.driver_version),
            "cuda_driver_version": _na(self.cuda_driver_version),
            "cpu_model": c.model,
            "cpu_cores": str(c.cores),
            "cpu_isa": " ".join(c.isa) or NA,
            "host_memory_total_bytes": str(c.memory_total),
            "numa_nodes": str(c.numa_nodes),
            "kernel": c.kernel or NA,
            "hostname": self.hostname or NA,
        }
        if self.device == "cpu":
            row = dict.fromkeys(CSV_COLUMNS, NA)
            row.update(host)
            row.update(
                device="cpu",
                name=c.model,
                # Both of the same memory: the NUMA node the engine budgets from (the host's
                # total is host_memory_total_bytes).
                memory_total_bytes=str(self.device_memory_total),
                memory_free_bytes=_na(self.device_memory_free),
            )
            return [row]
        rows = []
        for g in self.gpus:
            row = {
                "device": f"gpu{g.index}",
                "index": str(g.index),
                "uuid": g.uuid,
                "name": g.name,
                "compute_capability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
                "memory_total_bytes": str(g.memory_total),
                "memory_free_bytes": _na(g.memory_free),
                "sm_clock_max_mhz": _na(g.sm_clock_max_mhz),
                "mem_clock_max_mhz": _na(g.mem_clock_max_mhz),
                "power_limit_w": _na(g.power_limit_w),
                "pcie_gen_max": _na(g.pcie_gen_max),
                "pcie_width_max": _na(g.pcie_width_max),
                "pcie_gen_current": _na(g.pcie_gen_current),
                "pcie_width_current": _na(g.pcie_width_current),
                "ecc_enabled": _na(g.ecc_enabled),
                **host,
            }
            rows.append({k: row[k] for k in CSV_COLUMNS})
        return rows

    def write_csv(self, path: Path) -> None:
        """Write :meth:`to_csv_rows` to ``path`` atomically (header + one row per device)."""
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.to_csv_rows())
        atomic_write_text(Path(path), buf.getvalue())

    def summary(self) -> str:
        """A few human lines: the devices, then the host."""
        c = self.cpu
        host = (
            f"host: {c.model}, {c.cores} of {c.logical_cpus} CPUs usable, "
            f"{c.memory_total / GIB:.1f} GiB RAM ({c.memory_available / GIB:.1f} available), "
            f"{c.numa_nodes} NUMA node(s), kernel {c.kernel or '?'}"
        )
        if self.device == "cpu":
            isa = "/".join(c.isa) or "no AVX-512/AMX"
            node = self.device_memory_total / GIB
            return f"cpu target ({isa}; engine budgets from {node:.1f} GiB)\n{host}"
        lines = []
        for g in self.gpus:
            parts = [
                f"sm_{g.compute_capability[0]}{g.compute_capability[1]}",
                f"{g.memory_total / GIB:.1f} GiB",
            ]
            if g.memory_free is not None:
                parts.append(f"{g.memory_free / GIB:.1f} GiB free")
            if g.sm_clock_max_mhz is not None:
                parts.append(f"SM {g.sm_clock_max_mhz} MHz")
            if g.power_limit_w is not None:
                parts.append(f"{g.power_limit_w:.0f} W")
            if g.pcie_gen_max is not None and g.pcie_width_max is not None:
                now = (
                    f" (now gen{g.pcie_gen_current} x{g.pcie_width_current})"
                    if g.pcie_gen_current is not None
                    else ""
                )
                parts.append(f"PCIe gen{g.pcie_gen_max} x{g.pcie_width_max}{now}")
            if g.ecc_enabled is not None:
                parts.append(f"ECC {'on' if g.ecc_enabled else 'off'}")
            lines.append(f"gpu{g.index}: {g.name} [{g.uuid}] " + ", ".join(parts))
        lines.append(f"driver {self.driver_version or '?'}, CUDA {self.cuda_driver_version or '?'}")
        lines.append(host)
        return "\n".join(lines)


CSV_COLUMNS: list[str] = [
    "device",
    "index",
    "uuid",
    "name",
    "compute_capability",
    "memory_total_bytes",
    "memory_free_bytes",
    "sm_clock_max_mhz",
    "mem_clock_max_mhz",
    "power_limit_w",
    "pcie_gen_max",
    "pcie_width_max",
    "pcie_gen_current",
    "pcie_width_current",
    "ecc_enabled",
    "driver_version",
    "cuda_driver_version",
    "cpu_model",
    "cpu_cores",
    "cpu_isa",
    "host_memory_total_bytes",
    "numa_nodes",
    "kernel",
    "hostname",
]


def _na(v: object) -> str:
    if v is None:
        return NA
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


# --------------------------------------------------------------------------- CPU


def _cpuinfo() -> tuple[str, frozenset[str]]:
    """Model name and ISA flags from /proc/cpuinfo (x86 and Arm spellings)."""
    model, flags = "", frozenset[str]()
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if not model and key in ("model name", "hardware", "cpu model", "processor") and value:
            if not value.isdigit():  # Arm's "processor : 0" is an index
                model = value
        elif not flags and key in ("flags", "features"):
            flags = frozenset(value.split())
    return model or platform.processor() or platform.machine() or "unknown CPU", flags


def _numa() -> tuple[tuple[int, ...], int | None]:
    """MemTotal of each NUMA node, and the node of the first CPU we may run on."""
    base = Path("/sys/devices/system/node")
    totals: dict[int, int] = {}
    for meminfo in base.glob("node*/meminfo"):
        m = re.search(r"MemTotal:\s+(\d+)\s*kB", meminfo.read_text(errors="replace"))
        node = meminfo.parent.name[4:]
        if m and node.isdigit():
            totals[int(node)] = int(m[1]) * 1024
    if not totals or sorted(totals) != list(range(len(totals))):
        return (), None
    first_node: int | None = None
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cpus:
        links = list(Path(f"/sys/devices/system/cpu/cpu{cpus[0]}").glob("node[0-9]*"))
        if links:
            first_node = int(links[0].name[4:])
    return tuple(totals[i] for i in range(len(totals))), first_node


def _numa_free(nodes: int) -> tuple[int, ...]:
    """MemFree of NUMA nodes 0 to ``nodes`` - 1 (bytes); empty when one cannot be read."""
    out = []
    for i in range(nodes):
        try:
            text = Path(f"/sys/devices/system/node/node{i}/meminfo").read_text(errors="replace")
        except OSError:
            return ()
        m = re.search(r"MemFree:\s+(\d+)\s*kB", text)
        if m is None:
            return ()
        out.append(int(m[1]) * 1024)
    return tuple(out)


def probe_cpu() -> CpuInfo:
    """The host CPU; cheap (a few small files under /proc and /sys)."""
    model, flags = _cpuinfo()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    vm = psutil.virtual_memory()
    numa_memory, first_node = _numa()
    return CpuInfo(
        model=model,
        cores=cores or os.cpu_count() or 1,
        logical_cpus=os.cpu_count() or 1,
        memory_total=int(vm.total),
        memory_available=int(vm.available),
        numa_memory=numa_memory,
        numa_node_of_first_cpu=first_node,
        kernel=platform.release(),
        flags=flags,
        numa_free=_numa_free(len(numa_memory)),
    )


# --------------------------------------------------------------------------- GPU


def nvml_text(v: Any) -> str:
    """NVML strings: bytes from older bindings, str from newer ones."""
    return v.decode() if isinstance(v, bytes) else str(v)


def nvml_handles(nvml: Any, devices: Sequence[str]) -> tuple[list[Any], list[str]]:
    """NVML handles of ``devices`` (indexes or UUIDs), and the devices NVML does not know."""
    count = int(nvml.nvmlDeviceGetCount())
    handles, missing = [], []
    for dev in devices:
        try:
            if dev.isdigit():
                if int(dev) >= count:
                    raise LookupError
                handles.append(nvml.nvmlDeviceGetHandleByIndex(int(dev)))
            else:
                handles.append(nvml.nvmlDeviceGetHandleByUUID(dev))
        except (nvml.NVMLError, LookupError):
            missing.append(dev)
    return handles, missing


def nvml_known(nvml: Any) -> list[str]:
    """Every GPU NVML sees, as ``index name (uuid)``, for an error that names a missing one."""
    known = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        name, uuid = nvml.nvmlDeviceGetName(h), nvml.nvmlDeviceGetUUID(h)
        known.append(f"{i} {nvml_text(name)} ({nvml_text(uuid)})")
    return known


def _nvml_gpus(nvml: Any, devices: list[str]) -> tuple[list[GpuInfo], str | None, str | None]:
    """Every NVML call of the module: the listed devices, driver and CUDA driver versions.

    NVML must be initialised by the caller. Raises :class:`HardwareError` for unknown devices.
    """
    error = nvml.NVMLError

    def opt(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except error:
            return None

    handles, missing = nvml_handles(nvml, devices)
    if missing:
        listed = "; ".join(nvml_known(nvml)) or "none"
        raise HardwareError(f"GPU {missing[0]} not found; this machine has: {listed}")
    gpus = []
    for h in handles:
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        ecc = opt(nvml.nvmlDeviceGetEccMode, h)
        power_mw = opt(nvml.nvmlDeviceGetPowerManagementLimit, h)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
        gpus.append(
            GpuInfo(
                index=int(nvml.nvmlDeviceGetIndex(h)),
                uuid=nvml_text(nvml.nvmlDeviceGetUUID(h)),
                name=nvml_text(nvml.nvmlDeviceGetName(h)),
                compute_capability=(int(major), int(minor)),
                memory_total=int(mem.total),
                memory_free=int(mem.free),
                sm_clock_max_mhz=opt(nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM),
                mem_clock_max_mhz=opt(nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_MEM),
                power_limit_w=None if power_mw is None else power_mw / 1000.0,
                pcie_gen_max=opt(nvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
                pcie_width_max=opt(nvml.nvmlDeviceGetMaxPcieLinkWidth, h),
                pcie_gen_current=opt(nvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                pcie_width_current=opt(nvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                ecc_enabled=None if ecc is None else bool(ecc[0]),
            )
        )
    driver = opt(nvml.nvmlSystemGetDriverVersion)
    cuda = opt(nvml.nvmlSystemGetCudaDriverVersion)  # e.g. 12080 -> "12.8"
    cuda_text = None if cuda is None else f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
    return gpus, None if driver is None else nvml_text(driver), cuda_text


def _import_nvml() -> Any:
    try:
        import pynvml
    except ImportError as e:
        raise HardwareError(
            "the target lists GPUs but NVML is not available: install nvidia-ml-py"
        ) from e
    return pynvml


def probe(target: DeviceTarget, *, nvml: Any = None) -> HardwareProfile:
    """Profile ``target``: its GPUs via NVML (``nvml``: the ``pynvml`` module or a stand-in),
    or the CPU for a cpu target. Raises :class:`HardwareError` when a GPU can't be reached."""
    cpu = probe_cpu()
    host = socket.gethostname()
    if target.kind == "cpu":
        return HardwareProfile(device="cpu", cpu=cpu, hostname=host)
    mod = nvml if nvml is not None else _import_nvml()
    try:
        mod.nvmlInit()
    except mod.NVMLError as e:
        raise HardwareError(
            f"NVML could not start ({nvml_text(e)}): no NVIDIA driver, or no GPU visible here"
        ) from e
    try:
        gpus, driver, cuda = _nvml_gpus(mod, list(target.devices))
    except mod.NVMLError as e:
        raise HardwareError(f"NVML query failed: {nvml_text(e)}") from e
    finally:
        with contextlib.suppress(mod.NVMLError):
            mod.nvmlShutdown()
    return HardwareProfile(
        device="gpu",
        cpu=cpu,
        gpus=tuple(gpus),
        driver_version=driver,
        cuda_driver_version=cuda,
        hostname=host,
    )
