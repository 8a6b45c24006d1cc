"""The GPU checks: what :func:`autotuner.doctor.gpu.scan` read, judged for a launch."""

from __future__ import annotations

from dataclasses import dataclass

from autotuner.doctor.gpu import GpuScan, GpuState
from autotuner.records.doctor import Finding

GIB = 1 << 30


@dataclass(frozen=True)
class MemoryShare:
    """The engine's option for the share of a device's memory it claims at start-up (its
    memory-fraction role), and the engine's default share."""

    option: str
    default: float


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def gpu_findings(scan: GpuScan, *, mem_util: float | None, share: MemoryShare) -> list[Finding]:
    """Findings for a GPU target. ``mem_util`` is the highest memory share (``share.option``,
    vLLM's ``gpu_memory_utilization``) a launch may ask for (None: not known, e.g. an engine
    checked without an SLA: the engine default ``share.default``, and a shortfall is a
    warning): vLLM refuses to start when less than that share of the GPU is free."""
    if scan.error is not None:
        return [
            Finding(
                check="gpu",
                status="fatal",
                found=f"no GPU could be read: {scan.error}",
                action="check that the NVIDIA driver is loaded (`nvidia-smi`), or use "
                "target: cpu with a CPU build of the engine",
            )
        ]
    out: list[Finding] = []
    if scan.missing:
        out.append(
            Finding(
                check="gpu",
                status="fatal",
                found=f"GPU {', '.join(scan.missing)} not found; this machine has: "
                + ("; ".join(scan.known) or "none"),
                action="fix the SLA's target (an index from `nvidia-smi -L` or a GPU UUID)",
            )
        )
    elif not scan.gpus:
        out.append(
            Finding(
                check="gpu",
                status="fatal",
                found="no GPU on this machine",
                action="use target: cpu with a CPU build of the engine",
            )
        )
    cuda = "?" if scan.cuda_max is None else f"{scan.cuda_max[0]}.{scan.cuda_max[1]}"
    out.append(
        Finding(
            check="driver",
            status="ok" if scan.driver else "warning",
            found=f"NVIDIA driver {scan.driver or '?'}, supports CUDA up to {cuda} "
            f"(read with {scan.source})",
            action=None if scan.driver else "the driver version could not be read",
        )
    )
    for g in scan.gpus:
        util = share.default if mem_util is None else mem_util
        out += _one_gpu(g, util, share.option, known=mem_util is not None)
    return out


def _one_gpu(g: GpuState, mem_util: float, option: str, *, known: bool) -> list[Finding]:
    at = f"gpu{g.index}"
    cc = "sm_?" if g.compute_capability is None else "sm_{}{}".format(*g.compute_capability)
    free = "" if g.memory_free is None else f", {_gib(g.memory_free)} free"
    out = [
        Finding(
            check=at, status="ok", found=f"{g.name} [{g.uuid}], {cc}, {_gib(g.memory_total)}{free}"
        )
    ]
    if g.mig_current:
        out.append(
            Finding(
                check=f"{at}.mig",
                status="fatal",
                found="MIG mode is on: CUDA sees only its MIG instances, not the whole GPU the "
                "tuner leases",
                action=f"turn it off (`nvidia-smi -i {g.index} -mig 0`, then reset the GPU) or "
                "pick a GPU without MIG",
            )
        )
    elif g.mig_pending:
        out.append(
            Finding(
                check=f"{at}.mig",
                status="warning",
                found="MIG mode turns on at the next GPU reset",
                action=f"`nvidia-smi -i {g.index} -mig 0` before resetting, to keep the whole GPU",
            )
        )
    else:
        out.append(Finding(check=f"{at}.mig", status="ok", found="MIG off"))
    out.append(_ecc(g, at))
    out.append(_clocks(g, at))
    out.append(_pcie(g, at))
    out.append(_memory(g, at, mem_util, option, known=known))
    return out


def _ecc(g: GpuState, at: str) -> Finding:
    if g.ecc_current is None:
        return Finding(check=f"{at}.ecc", status="ok", found="ECC not supported or not reported")
    found = f"ECC {'on' if g.ecc_current else 'off'}"
    if g.ecc_uncorrected:
        return Finding(
            check=f"{at}.ecc",
            status="warning",
            found=f"{found}, {g.ecc_uncorrected} uncorrected memory errors since the last reboot",
            action="see `nvidia-smi -q -d ECC`; a GPU with uncorrected errors can crash a run: "
            "reset it, or have it checked",
        )
    if g.ecc_pending is not None and g.ecc_pending != g.ecc_current:
        return Finding(
            check=f"{at}.ecc",
            status="warning",
            found=f"{found}, turning {'on' if g.ecc_pending else 'off'} at the next reboot",
            action="reboot before tuning: ECC changes the usable memory and the bandwidth",
        )
    return Finding(check=f"{at}.ecc", status="ok", found=found)


def _clocks(g: GpuState, at: str) -> Finding:
    now = "?" if g.sm_clock_mhz is None else f"{g.sm_clock_mhz}"
    top = "?" if g.sm_clock_max_mhz is None else f"{g.sm_clock_max_mhz}"
    found = f"SM clock {now} MHz now, {top} MHz at most"
    if g.slowdowns:
        return Finding(
            check=f"{at}.clocks",
            status="warning",
            found=f"{found}; slowed down: {', '.join(g.slowdowns)}",
            action="check cooling and power (`nvidia-smi -q -d PERFORMANCE`): measurements "
            "taken while the GPU protects itself are too low",
        )
    return Finding(check=f"{at}.clocks", status="ok", found=found)


def _pcie(g: GpuState, at: str) -> Finding:
    if g.pcie_width_max is None or g.pcie_gen_max is None:
        return Finding(check=f"{at}.pcie", status="ok", found="PCIe link not reported")
    found = (
        f"PCIe gen{g.pcie_gen} x{g.pcie_width} now, gen{g.pcie_gen_max} x{g.pcie_width_max} at most"
    )
    if g.pcie_width is not None and g.pcie_width < g.pcie_width_max:
        return Finding(
            check=f"{at}.pcie",
            status="warning",
            found=f"{found}: fewer lanes than the slot and card support",
            action="reseat the card or check the slot/riser: host-to-GPU copies run at a "
            "fraction of their speed",
        )
    note = ""
    if g.pcie_gen is not None and g.pcie_gen < g.pcie_gen_max:
        note = " (an idle GPU lowers its link generation to save power)"
    return Finding(check=f"{at}.pcie", status="ok", found=found + note)


def _memory(g: GpuState, at: str, mem_util: float, option: str, *, known: bool) -> Finding:
    others = list(g.processes)
    held = sum(p.used_bytes or 0 for p in others)
    who = ", ".join(
        f"pid {p.pid}" + ("" if p.used_bytes is None else f" {_gib(p.used_bytes)}") for p in others
    )
    if g.memory_free is not None and g.memory_free < mem_util * g.memory_total:
        return Finding(
            check=f"{at}.memory",
            status="fatal" if known else "warning",
            found=f"{_gib(g.memory_free)} free of {_gib(g.memory_total)}, less than "
            f"{option} {mem_util:g} asks for ({_gib(int(mem_util * g.memory_total))})"
            + (f"; held by {who}" if others else ""),
            action=f"stop the processes holding the GPU, or lower {option}: vLLM "
            "refuses to start when less than that share is free",
        )
    if others:
        return Finding(
            check=f"{at}.memory",
            status="warning",
            found=f"{len(others)} other process(es) hold {_gib(held)}: {who}",
            action="they compete for memory and compute while the tuner measures: stop them",
        )
    return Finding(check=f"{at}.memory", status="ok", found="no other process holds GPU memory")
