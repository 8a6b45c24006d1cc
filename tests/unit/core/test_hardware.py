"""Hardware profile: the CPU path for real, the NVML path against a small fake pynvml."""

from __future__ import annotations

import csv
import dataclasses
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from autotuner.core.hardware import (
    CSV_COLUMNS,
    GIB,
    CpuInfo,
    GpuInfo,
    HardwareError,
    HardwareProfile,
    probe,
    probe_cpu,
)
from autotuner.sla.spec import Target

H200_TOTAL = 150_754_820_096  # 143,771 MiB as NVML reports it


class FakeNvml:
    """The pynvml calls hardware._nvml_gpus makes, over a list of device dicts."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    class NVMLError(Exception):
        pass

    def __init__(self, devices: list[dict[str, Any]], *, init_fails: bool = False) -> None:
        self.devices = devices
        self.init_fails = init_fails
        self.initialised = False
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise self.NVMLError("Driver Not Loaded")
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.devices[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> dict[str, Any]:
        for d in self.devices:
            if d["uuid"] == uuid:
                return d
        raise self.NVMLError("Not Found")

    def _get(self, h: dict[str, Any], key: str) -> Any:
        if h.get(key) is None:
            raise self.NVMLError("Not Supported")
        return h[key]

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> Any:
        return h["name"]

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> str:
        return str(h["uuid"])

    def nvmlDeviceGetIndex(self, h: dict[str, Any]) -> int:
        return self.devices.index(h)

    def nvmlDeviceGetCudaComputeCapability(self, h: dict[str, Any]) -> Any:
        return h["cc"]

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> Any:
        return SimpleNamespace(total=h["total"], free=h["free"], used=h["total"] - h["free"])

    def nvmlDeviceGetMaxClockInfo(self, h: dict[str, Any], clock: int) -> Any:
        return self._get(h, "sm_clock" if clock == self.NVML_CLOCK_SM else "mem_clock")

    def nvmlDeviceGetPowerManagementLimit(self, h: dict[str, Any]) -> Any:
        return self._get(h, "power_mw")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: dict[str, Any]) -> Any:
        return self._get(h, "pcie")[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: dict[str, Any]) -> Any:
        return self._get(h, "pcie")[1]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: dict[str, Any]) -> Any:
        return self._get(h, "pcie")[2]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: dict[str, Any]) -> Any:
        return self._get(h, "pcie")[3]

    def nvmlDeviceGetEccMode(self, h: dict[str, Any]) -> list[int]:
        return [self._get(h, "ecc"), self._get(h, "ecc")]

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.124.06"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080


def h200(uuid: str = "GPU-aaaa", **extra: Any) -> dict[str, Any]:
    dev = {
        "name": "NVIDIA H200",
        "uuid": uuid,
        "cc": (9, 0),
        "total": H200_TOTAL,
        "free": H200_TOTAL - 500 * 2**20,
        "sm_clock": 1980,
        "mem_clock": 3201,
        "power_mw": 700_000,
        "pcie": (5, 16, 5, 16),
        "ecc": 1,
    }
    dev.update(extra)
    return dev


# --------------------------------------------------------------------------- CPU


def test_cpu_profile_is_real() -> None:
    prof = probe(Target())
    assert prof.device == "cpu"
    assert prof.gpus == ()
    assert prof.gpu_count == 0
    assert prof.compute_capability is None
    assert prof.cpu.cores == len(os.sched_getaffinity(0))
    assert prof.cpu.logical_cpus == os.cpu_count()
    assert prof.cpu.memory_total > 0
    assert 0 < prof.device_memory_total <= prof.cpu.memory_total
    assert prof.cpu.kernel
    assert prof.cpu.model and prof.cpu.model != "unknown CPU"
    if Path("/sys/devices/system/node/node0/meminfo").exists():
        assert prof.cpu.numa_nodes >= 1
        assert prof.cpu.numa_node_of_first_cpu is not None


def test_cpu_rows_and_csv(tmp_path: Path) -> None:
    prof = probe(Target())
    rows = prof.to_csv_rows()
    assert len(rows) == 1
    row = rows[0]
    assert list(row) == CSV_COLUMNS
    assert row["device"] == "cpu"
    assert row["uuid"] == row["compute_capability"] == row["pcie_gen_max"] == "N/A"
    assert row["cpu_cores"] == str(prof.cpu.cores)
    assert row["memory_total_bytes"] == str(prof.device_memory_total)
    out = tmp_path / "sub" / "hardware_profile.csv"
    prof.write_csv(out)
    with out.open() as f:
        assert list(csv.DictReader(f)) == rows
    assert prof.cpu.model in prof.summary()


def test_cpu_budget_comes_from_the_numa_node_of_the_first_core() -> None:
    cpu = CpuInfo(
        model="x",
        cores=4,
        logical_cpus=8,
        memory_total=64 * GIB,
        memory_available=60 * GIB,
        numa_memory=(32 * GIB, 31 * GIB),
        numa_node_of_first_cpu=1,
    )
    assert HardwareProfile(device="cpu", cpu=cpu).device_memory_total == 31 * GIB
    flat = CpuInfo(model="x", cores=4, logical_cpus=8, memory_total=64 * GIB, memory_available=0)
    assert HardwareProfile(device="cpu", cpu=flat).device_memory_total == 64 * GIB


# --------------------------------------------------------------------------- NVML


def test_gpu_profile_from_nvml() -> None:
    nvml = FakeNvml([h200("GPU-aaaa"), h200("GPU-bbbb")])
    prof = probe(Target(kind="gpu", devices=["1"]), nvml=nvml)
    assert nvml.shutdowns == 1
    assert prof.device == "gpu"
    assert prof.driver_version == "570.124.06"
    assert prof.cuda_driver_version == "12.8"
    (g,) = prof.gpus
    assert g == GpuInfo(
        index=1,
        uuid="GPU-bbbb",
        name="NVIDIA H200",
        compute_capability=(9, 0),
        memory_total=H200_TOTAL,
        memory_free=H200_TOTAL - 500 * 2**20,
        sm_clock_max_mhz=1980,
        mem_clock_max_mhz=3201,
        power_limit_w=700.0,
        pcie_gen_max=5,
        pcie_width_max=16,
        pcie_gen_current=5,
        pcie_width_current=16,
        ecc_enabled=True,
    )
    assert prof.compute_capability == (9, 0)
    assert prof.device_memory_total == H200_TOTAL
    row = prof.to_csv_rows()[0]
    assert list(row) == CSV_COLUMNS
    assert row["device"] == "gpu1"
    assert row["compute_capability"] == "9.0"
    assert row["power_limit_w"] == "700"
    assert row["ecc_enabled"] == "yes"
    summary = prof.summary()
    assert "gpu1: NVIDIA H200 [GPU-bbbb] sm_90, 140.4 GiB" in summary
    assert "PCIe gen5 x16 (now gen5 x16)" in summary
    assert "driver 570.124.06, CUDA 12.8" in summary


def test_gpu_by_uuid_and_several_gpus() -> None:
    nvml = FakeNvml([h200("GPU-aaaa"), h200("GPU-bbbb", cc=(8, 0), total=80 * GIB, name=b"A100")])
    prof = probe(Target(kind="gpu", devices=["GPU-bbbb", "0"]), nvml=nvml)
    assert [g.index for g in prof.gpus] == [1, 0]
    assert prof.gpus[0].name == "A100"  # old pynvml returns bytes
    assert prof.gpu_count == 2
    assert prof.compute_capability == (8, 0)  # the weakest GPU decides
    assert prof.device_memory_total == 80 * GIB
    assert [r["device"] for r in prof.to_csv_rows()] == ["gpu1", "gpu0"]


def test_unsupported_queries_become_na() -> None:
    dev = h200(sm_clock=None, mem_clock=None, power_mw=None, pcie=None, ecc=None)
    prof = probe(Target(kind="gpu", devices=["0"]), nvml=FakeNvml([dev]))
    g = prof.gpus[0]
    assert g.sm_clock_max_mhz is None and g.ecc_enabled is None and g.pcie_gen_max is None
    row = prof.to_csv_rows()[0]
    for col in ("sm_clock_max_mhz", "power_limit_w", "pcie_gen_max", "ecc_enabled"):
        assert row[col] == "N/A"
    assert "ECC" not in prof.summary()


@pytest.mark.parametrize("device", ["2", "GPU-zzzz"])
def test_unknown_gpu_is_a_clear_error(device: str) -> None:
    nvml = FakeNvml([h200("GPU-aaaa")])
    with pytest.raises(HardwareError, match=rf"GPU {device} not found; this machine has: 0 NVIDIA"):
        probe(Target(kind="gpu", devices=[device]), nvml=nvml)
    assert nvml.shutdowns == 1


def test_no_driver_is_a_clear_error() -> None:
    with pytest.raises(HardwareError, match=r"NVML could not start .*no NVIDIA driver"):
        probe(Target(kind="gpu", devices=["0"]), nvml=FakeNvml([], init_fails=True))


def test_no_gpus_is_a_clear_error() -> None:
    with pytest.raises(HardwareError, match="GPU 0 not found; this machine has: none"):
        probe(Target(kind="gpu", devices=["0"]), nvml=FakeNvml([]))


def test_missing_nvml_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(HardwareError, match="install nvidia-ml-py"):
        probe(Target(kind="gpu", devices=["0"]))


def test_cpu_target_never_touches_nvml() -> None:
    nvml = FakeNvml([h200()], init_fails=True)
    assert probe(Target(), nvml=nvml).device == "cpu"


def test_a_cpu_rows_free_memory_is_of_the_memory_its_total_counts() -> None:
    # Two NUMA nodes: the budget (memory_total_bytes) is node 1's 31 GiB; the host has 60 GiB
    # available over both nodes, which was written as memory_free_bytes (issue 29).
    cpu = CpuInfo(
        model="x",
        cores=4,
        logical_cpus=8,
        memory_total=64 * GIB,
        memory_available=60 * GIB,
        numa_memory=(32 * GIB, 31 * GIB),
        numa_node_of_first_cpu=1,
        numa_free=(30 * GIB, 29 * GIB),
    )
    (row,) = HardwareProfile(device="cpu", cpu=cpu).to_csv_rows()
    assert int(row["memory_total_bytes"]) == 31 * GIB
    assert int(row["memory_free_bytes"]) == 29 * GIB
    assert int(row["host_memory_total_bytes"]) == 64 * GIB
    # Without the nodes' free figures, free is capped at the node's total.
    older = dataclasses.replace(cpu, numa_free=())
    (row,) = HardwareProfile(device="cpu", cpu=older).to_csv_rows()
    assert int(row["memory_free_bytes"]) <= int(row["memory_total_bytes"])


def test_the_probed_cpu_never_reads_more_free_than_total() -> None:
    prof = HardwareProfile(device="cpu", cpu=probe_cpu())
    (row,) = prof.to_csv_rows()
    assert int(row["memory_free_bytes"]) <= int(row["memory_total_bytes"])
