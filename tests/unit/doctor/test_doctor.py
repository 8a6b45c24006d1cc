"""`autotuner doctor`: the GPU paths with NVML answers recorded from an H200 (a fake pynvml and
a fake nvidia-smi), the torch checks on recorded probe answers, the SLA feature checks, the
host checks, and bad input. The real CPU engine environment: tests/integration/test_doctor_real.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from autotuner.cli.main import main
from autotuner.core.hardware import CpuInfo, GpuInfo, HardwareProfile
from autotuner.doctor import features, host
from autotuner.doctor.engine_findings import torch_findings
from autotuner.doctor.gpu import SMI_APPS_ARGV, SMI_GPU_ARGV, GpuScan, scan
from autotuner.doctor.gpu_findings import gpu_findings
from autotuner.doctor.run import memory_share
from autotuner.doctor.torchprobe import TorchFacts
from autotuner.engines import registry
from autotuner.records.doctor import DoctorReport, Finding, exit_code_of
from autotuner.sla.spec import parse_sla
from tests.unit.core.test_hardware import H200_TOTAL, FakeNvml, h200

GIB = 1 << 30
VLLM = registry.get("vllm")
# vLLM's memory share option and its default, as the doctor asks the adapter for them.
SHARE = memory_share(VLLM, HardwareProfile("cpu", CpuInfo("x", 1, 1, GIB, GIB)))
OPTION = SHARE.option


class DoctorNvml(FakeNvml):
    """FakeNvml plus the calls only the doctor makes, answered as an H200 answered them."""

    def nvmlDeviceGetClockInfo(self, h: dict[str, Any], clock: int) -> int:
        return int(h.get("sm_now", 345))

    def nvmlDeviceGetEccMode(self, h: dict[str, Any]) -> list[int]:
        ecc = self._get(h, "ecc")
        return [ecc, h.get("ecc_pending", ecc)]

    def nvmlDeviceGetTotalEccErrors(self, h: dict[str, Any], kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)  # uncorrected, volatile
        return int(h.get("ecc_errors", 0))

    def nvmlDeviceGetMigMode(self, h: dict[str, Any]) -> list[int]:
        return list(h.get("mig", (0, 0)))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: dict[str, Any]) -> int:
        return int(h.get("reasons", 0x1))  # 0x1: GPU idle

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in h.get("procs", [])]


def by_check(findings: Sequence[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


# --------------------------------------------------------------------------- GPUs via NVML


def test_a_healthy_h200_is_all_ok() -> None:
    gpus = scan(["0"], nvml=DoctorNvml([h200("GPU-aaaa", pcie=(5, 16, 1, 16))]))
    assert gpus.source == "nvml"
    assert gpus.driver == "570.124.06"
    assert gpus.cuda_max == (12, 8)
    (g,) = gpus.gpus
    assert g.name == "NVIDIA H200"
    assert g.compute_capability == (9, 0)
    assert g.memory_total == H200_TOTAL == 143771 << 20
    found = by_check(gpu_findings(gpus, mem_util=None, share=SHARE))
    assert all(f.status == "ok" for f in found.values()), found
    assert "CUDA up to 12.8" in found["driver"].found
    assert "sm_90" in found["gpu0"].found
    assert "gen1 x16 now, gen5 x16 at most" in found["gpu0.pcie"].found
    assert "idle GPU" in found["gpu0.pcie"].found  # a low generation at idle is normal


@pytest.mark.parametrize(
    ("extra", "check", "status", "words"),
    [
        ({"mig": (1, 1)}, "gpu0.mig", "fatal", "MIG mode is on"),
        ({"mig": (0, 1)}, "gpu0.mig", "warning", "next GPU reset"),
        ({"ecc_pending": 0}, "gpu0.ecc", "warning", "turning off at the next reboot"),
        ({"ecc_errors": 3}, "gpu0.ecc", "warning", "3 uncorrected"),
        ({"reasons": 0x40 | 0x1}, "gpu0.clocks", "warning", "hardware thermal slowdown"),
        ({"pcie": (5, 16, 5, 8)}, "gpu0.pcie", "warning", "fewer lanes"),
        ({"procs": [(4242, 2 * GIB)]}, "gpu0.memory", "warning", "pid 4242 2.0 GiB"),
    ],
)
def test_gpu_problems(extra: dict[str, Any], check: str, status: str, words: str) -> None:
    gpus = scan(None, nvml=DoctorNvml([h200("GPU-aaaa", **extra)]))
    f = by_check(gpu_findings(gpus, mem_util=None, share=SHARE))[check]
    assert f.status == status
    assert words in f.found
    assert f.action


def test_memory_held_by_others_below_what_the_engine_asks_is_fatal() -> None:
    held = 30 * GIB
    dev = h200("GPU-aaaa", free=H200_TOTAL - held, procs=[(77, held)])
    gpus = scan(["GPU-aaaa"], nvml=DoctorNvml([dev]))
    assert by_check(gpu_findings(gpus, mem_util=0.9, share=SHARE))["gpu0.memory"].status == "fatal"
    # a lower utilisation fits beside it: only a warning
    found = by_check(gpu_findings(gpus, mem_util=0.7, share=SHARE))
    assert found["gpu0.memory"].status == "warning"
    # an engine checked without an SLA: the default 0.92 may not be what runs
    unknown = by_check(gpu_findings(gpus, mem_util=None, share=SHARE))["gpu0.memory"]
    assert unknown.status == "warning" and "less than gpu_memory_utilization 0.92" in unknown.found


def test_missing_gpu_and_no_driver_are_fatal() -> None:
    gpus = scan(["3"], nvml=DoctorNvml([h200("GPU-aaaa")]))
    assert gpus.missing == ("3",)
    f = gpu_findings(gpus, mem_util=None, share=SHARE)[0]
    assert f.status == "fatal"
    assert "GPU 3 not found" in f.found and "NVIDIA H200 (GPU-aaaa)" in f.found
    broken = scan(["0"], nvml=DoctorNvml([], init_fails=True))
    (f,) = gpu_findings(broken, mem_util=None, share=SHARE)
    assert f.status == "fatal"
    assert "Driver Not Loaded" in f.found


# --------------------------------------------------------------------------- nvidia-smi


SMI_ROW = (
    "0, GPU-8f3c0000-1111-2222-3333-444455556666, NVIDIA H200, 9.0, 143771, 143000, "
    "570.124.06, Enabled, Enabled, 345, 1980, 1, 5, 16, 16, Disabled, Disabled"
)
SMI_BANNER = "| NVIDIA-SMI 570.124.06   Driver Version: 570.124.06   CUDA Version: 12.8 |"


def test_nvidia_smi_fallback_with_a_fixed_argv() -> None:
    calls: list[tuple[str, ...]] = []

    def smi(args: Sequence[str]) -> str:
        calls.append(tuple(args))
        if tuple(args) == SMI_GPU_ARGV:
            return SMI_ROW + "\n"
        if tuple(args) == SMI_APPS_ARGV:
            return "GPU-8f3c0000-1111-2222-3333-444455556666, 999, 600\n"
        return SMI_BANNER

    gpus = scan(["0"], smi=smi)
    assert calls == [SMI_GPU_ARGV, (), SMI_APPS_ARGV]
    assert gpus.source == "nvidia-smi"
    assert (gpus.driver, gpus.cuda_max) == ("570.124.06", (12, 8))
    (g,) = gpus.gpus
    assert (g.name, g.compute_capability, g.memory_total) == ("NVIDIA H200", (9, 0), 143771 << 20)
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max) == (1, 5, 16, 16)
    assert g.ecc_current is True and g.mig_current is False
    assert [(p.pid, p.used_bytes) for p in g.processes] == [(999, 600 << 20)]
    found = by_check(gpu_findings(gpus, mem_util=None, share=SHARE))
    assert found["gpu0.memory"].status == "warning"


def test_nvidia_smi_missing_is_reported() -> None:
    def smi(args: Sequence[str]) -> str:
        raise OSError("nvidia-smi not found on PATH")

    gpus = scan(None, smi=smi)
    assert gpus.error == "nvidia-smi not found on PATH"
    assert gpu_findings(gpus, mem_util=None, share=SHARE)[0].status == "fatal"


# --------------------------------------------------------------------------- torch


def h200_scan(cuda: tuple[int, int] = (12, 8)) -> GpuScan:
    return GpuScan("nvml", scan(["0"], nvml=DoctorNvml([h200()])).gpus, "570.124.06", cuda)


GOOD = TorchFacts(
    python="3.12.3",
    torch="2.9.0+cu128",
    cuda="12.8",
    available=True,
    devices=(("NVIDIA H200", (9, 0)),),
    arch_list=("sm_80", "sm_90", "sm_100", "sm_120", "compute_120"),
    pins=(("==2.9.0", True),),
)


def test_torch_that_fits_the_driver_and_the_gpu() -> None:
    found = by_check(torch_findings(GOOD, engine="vllm 0.26.0", scan=h200_scan(), gpus_wanted=1))
    assert all(f.status == "ok" for f in found.values()), found
    assert found["torch.cuda"].found == "torch's CUDA 12.8 <= the driver's CUDA 12.8"


@pytest.mark.parametrize(
    ("facts", "check", "status", "words"),
    [
        (TorchFacts(**{**GOOD.__dict__, "cuda": "13.0"}), "torch.cuda", "fatal", "too old"),
        (TorchFacts(**{**GOOD.__dict__, "cuda": "12.9"}), "torch.cuda", "warning", "minor"),
        (
            TorchFacts(**{**GOOD.__dict__, "available": False, "devices": ()}),
            "torch.gpu",
            "fatal",
            "sees 0 of the 1",
        ),
        (
            TorchFacts(**{**GOOD.__dict__, "arch_list": ("sm_70", "sm_80")}),
            "torch.arch",
            "fatal",
            "no kernel image",
        ),
        (
            TorchFacts(**{**GOOD.__dict__, "pins": (("==2.8.0", False),)}),
            "torch.pin",
            "fatal",
            "needs torch==2.8.0",
        ),
        (TorchFacts(**{**GOOD.__dict__, "cuda": None}), "torch.cuda", "fatal", "CPU"),
        (TorchFacts(error="import torch failed: ImportError: x"), "torch", "fatal", "import"),
    ],
)
def test_torch_problems(facts: TorchFacts, check: str, status: str, words: str) -> None:
    found = by_check(torch_findings(facts, engine="vllm 0.26.0", scan=h200_scan(), gpus_wanted=1))
    assert found[check].status == status
    assert words in found[check].found


def test_ptx_of_an_older_architecture_still_runs() -> None:
    facts = TorchFacts(**{**GOOD.__dict__, "arch_list": ("sm_80", "compute_80")})
    found = by_check(torch_findings(facts, engine="e", scan=h200_scan(), gpus_wanted=1))
    assert found["torch.arch"].status == "ok"


# --------------------------------------------------------------------------- features


def gpu_hw(cc: tuple[int, int], count: int = 1) -> HardwareProfile:
    cpu = CpuInfo(
        model="x", cores=16, logical_cpus=16, memory_total=64 * GIB, memory_available=60 * GIB
    )
    gpus = tuple(
        GpuInfo(index=i, uuid=f"GPU-{i}", name="g", compute_capability=cc, memory_total=80 * GIB)
        for i in range(count)
    )
    return HardwareProfile(device="gpu", cpu=cpu, gpus=gpus)


def gpu_sla(engine: dict[str, Any] | None = None, **sections: Any) -> Any:
    doc = {
        "name": "d",
        "model": {"synth": "llama-3.1-8b"},
        "engine": {"python": "/x/bin/python", **(engine or {})},
        "target": {"gpu": 0},
        "workload": {
            "input_tokens": 8,
            "output_tokens": 8,
            "arrival": {"process": "poisson", "rate": 1},
            "requests": 10,
        },
        **sections,
    }
    return parse_sla(yaml.safe_dump(doc), "d.yaml")


def feature(sla: Any, version: str, hw: HardwareProfile) -> dict[str, Finding]:
    return by_check(features.feature_findings(sla, version, hw, VLLM)[0])


def test_fp8_below_89_is_fatal_and_fine_on_hopper() -> None:
    sla = gpu_sla({"params": {"kv_cache_dtype": "fp8"}})
    bad = feature(sla, "0.26.0", gpu_hw((8, 0)))["feature.kv_cache_dtype"]
    assert bad.status == "fatal"
    assert "engine.params.kv_cache_dtype" in bad.found and "8.9" in bad.found
    assert feature(sla, "0.26.0", gpu_hw((9, 0)))["feature"].status == "ok"


def test_flags_the_engine_version_lacks_and_tp_beyond_the_gpus() -> None:
    sla = gpu_sla({"args": ["--performance-mode", "throughput"]})
    f = feature(sla, "0.16.0", gpu_hw((9, 0)))["feature.performance_mode"]
    assert f.status == "fatal"
    assert "engine.args[0]" in f.found and "no such option" in f.found
    assert f.action is not None and "unknown flags" in f.action
    tp = feature(gpu_sla({"params": {"tensor_parallel_size": 2}}), "0.26.0", gpu_hw((9, 0)))
    assert tp["feature.tensor_parallel_size"].status == "fatal"
    assert "GPU(s)" in tp["feature.tensor_parallel_size"].found
    two = feature(gpu_sla({"params": {"tensor_parallel_size": 2}}), "0.26.0", gpu_hw((9, 0), 2))
    assert "feature.tensor_parallel_size" not in two


def test_search_values_the_gpu_cannot_run() -> None:
    sla = gpu_sla(
        search={"allow_lossy": True, "params": {"kv_cache_dtype": {"values": ["auto", "fp8"]}}}
    )
    f = feature(sla, "0.26.0", gpu_hw((8, 0)))["feature.kv_cache_dtype"]
    assert f.status == "warning"  # the SLA listed it, the search will leave it out
    assert "kv_cache_dtype fp8 left out of the search" in f.found


@pytest.mark.parametrize(
    ("env", "params", "cc", "words"),
    [
        ({"VLLM_ATTENTION_BACKEND": "FLASHMLA"}, {}, (8, 0), "FLASHMLA needs compute capability"),
        ({"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}, {}, (7, 5), ">= 8.0"),
        ({"VLLM_FLASH_ATTN_VERSION": "3"}, {}, (8, 9), "Hopper"),
        ({"VLLM_ATTENTION_BACKEND": "TORCH_SDPA"}, {}, (9, 0), "CPU backend"),
        ({}, {"dtype": "bfloat16"}, (7, 5), "bfloat16 needs compute capability 8.0"),
    ],
)
def test_kernels_the_gpu_cannot_run(
    env: dict[str, str], params: dict[str, Any], cc: tuple[int, int], words: str
) -> None:
    found = features.feature_findings(
        gpu_sla({"env": env, "params": params}), "0.26.0", gpu_hw(cc), VLLM
    )[0]
    fatal = [f for f in found if f.status == "fatal"]
    assert len(fatal) == 1 and words in fatal[0].found, found


def test_flash_attention_on_hopper_is_fine() -> None:
    env = {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "VLLM_FLASH_ATTN_VERSION": "3"}
    assert feature(gpu_sla({"env": env}), "0.26.0", gpu_hw((9, 0)))["feature"].status == "ok"


# --------------------------------------------------------------------------- host


def test_disk_thresholds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    free = {"n": 50 * GIB}

    class Vfs:
        f_frsize = 4096

        @property
        def f_bavail(self) -> int:
            return free["n"] // 4096

    monkeypatch.setattr(host.os, "statvfs", lambda p: Vfs())
    places = {"a": tmp_path / "not" / "yet", "b": tmp_path}
    (f,) = host.disk_findings(places)  # one file system, reported once
    assert f.status == "ok" and "a (" in f.found and "b (" in f.found
    free["n"] = 5 * GIB
    assert host.disk_findings(places)[0].status == "warning"
    free["n"] = GIB // 2
    assert host.disk_findings(places)[0].status == "fatal"


def test_shm_for_tensor_parallel(tmp_path: Path) -> None:
    assert host.shm_finding(2, tmp_path / "nope").status == "warning"
    assert host.shm_finding(1, tmp_path / "nope").status == "ok"


def test_cores_for_the_engine() -> None:
    cpu = CpuInfo(
        model="x", cores=2, logical_cpus=2, memory_total=24 * GIB, memory_available=20 * GIB
    )
    gpu = by_check(host.cpu_findings(cpu, device="gpu", ranks=2, mem_util=None, option=OPTION))
    assert gpu["host.cpu"].status == "warning" and "at least 4" in gpu["host.cpu"].found
    on_cpu = by_check(host.cpu_findings(cpu, device="cpu", ranks=1, mem_util=0.3, option=OPTION))
    assert on_cpu["host.cpu"].status == "ok"
    assert on_cpu["host.memory"].status == "ok"
    hungry = by_check(host.cpu_findings(cpu, device="cpu", ranks=1, mem_util=0.95, option=OPTION))
    assert hungry["host.memory"].status == "warning"


# --------------------------------------------------------------------------- report, CLI


def test_exit_code_follows_the_worst_finding() -> None:
    ok = Finding(check="a", status="ok", found="x")
    warn = Finding(check="b", status="warning", found="y", action="z")
    fatal = Finding(check="c", status="fatal", found="y", action="z")
    assert exit_code_of([]) == 0
    assert exit_code_of([ok]) == 0
    assert exit_code_of([ok, warn]) == 1
    assert exit_code_of([warn, fatal, ok]) == 2


def test_report_round_trips(tmp_path: Path) -> None:
    r = DoctorReport(
        subject="s",
        engine="vllm 0.26.0",
        target="gpu 0",
        checked="2026-12-01T00:00:00Z",
        exit_code=1,
        findings=[Finding(check="b", status="warning", found="y", action="z")],
    )
    r.write(tmp_path / "r.json")
    assert DoctorReport.read(tmp_path / "r.json") == r


def test_an_invalid_sla_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {synth: tiny-llama}\nworkload: {requests: -1}\n")
    assert main(["doctor", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "workload" in err


# --------------------------------------------------------------------------- a whole run


H200_SMI_ROW = (
    "0, GPU-8f3c0000-1111-2222-3333-444455556666, NVIDIA H200, 9.0, 143771, 143190, "
    "580.159.04, Enabled, Enabled, 345, 1980, 1, 5, 16, 16, Disabled, Disabled"
)


def h200_smi(args: Sequence[str]) -> str:
    """nvidia-smi as the H200 machine answers (driver 580.159.04, CUDA 13.0, idle)."""
    if tuple(args) == SMI_GPU_ARGV:
        return H200_SMI_ROW + "\n"
    if tuple(args) == SMI_APPS_ARGV:
        return ""
    return "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |"


def test_the_h200_sla_without_pynvml(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole run for objectives/llama3-8b-h200.yaml on what the H200 machine answers:
    nvidia-smi (no pynvml), vLLM 0.26.0 with torch 2.11.0+cu130."""
    from autotuner.doctor import run

    python = Path("/opt/vllm/bin/python")
    monkeypatch.setattr(run.envs, "resolve_python", lambda *a: (python, f"python {python}"))
    monkeypatch.setattr(run.envs, "probe_version", lambda p: ("vllm", "0.26.0"))
    asked: list[tuple[Path, bool, Any]] = []

    def probe(p: Path, *, distribution: str, gpu: bool, cuda_devices: Any, **kw: Any) -> Any:
        asked.append((p, gpu, cuda_devices))
        return TorchFacts(
            python="3.12.3",
            torch="2.11.0+cu130",
            cuda="13.0",
            available=True,
            devices=(("NVIDIA H200", (9, 0)),),
            arch_list=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
            pins=(("==2.11.0", True),),
        )

    monkeypatch.setattr(run, "probe_torch", probe)
    monkeypatch.setattr(run, "scan", lambda devices, **kw: scan(devices, smi=h200_smi))
    sla = Path(__file__).resolve().parents[3] / "objectives" / "llama3-8b-h200.yaml"
    code = main(["doctor", str(sla), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == data["exit_code"]
    found = {f["check"]: f for f in data["findings"]}
    # the torch probe looked at the target GPU, by UUID
    assert asked == [(python, True, ["GPU-8f3c0000-1111-2222-3333-444455556666"])]
    assert not [f for c, f in found.items() if not c.startswith("host") and f["status"] != "ok"]
    assert "580.159.04, supports CUDA up to 13.0 (read with nvidia-smi)" in found["driver"]["found"]
    assert found["torch.cuda"]["found"] == "torch's CUDA 13.0 <= the driver's CUDA 13.0"
    assert "NVIDIA H200 sm_90" in found["torch.gpu"]["found"]
    assert found["gpu0.memory"]["status"] == "ok"
    assert data["engine"] == "vllm 0.26.0" and data["target"] == "gpu 0"


def test_a_gpu_target_on_a_host_without_gpus_is_fatal_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The engine's defaults are read for a GPU target whose scan found no GPU at all (what
    CI's machine answers): a fatal finding and exit 2, never an internal error."""
    from autotuner.doctor import run

    python = Path("/opt/vllm/bin/python")
    monkeypatch.setattr(run.envs, "resolve_python", lambda *a: (python, f"python {python}"))
    monkeypatch.setattr(run.envs, "probe_version", lambda p: ("vllm", "0.26.0"))
    monkeypatch.setattr(
        run, "probe_torch", lambda *a, **kw: TorchFacts(python="3.12.3", torch="2.11.0+cu130")
    )
    monkeypatch.setattr(
        run, "scan", lambda devices, **kw: scan(devices, nvml=DoctorNvml([], init_fails=True))
    )
    sla = Path(__file__).resolve().parents[3] / "objectives" / "llama3-8b-h200.yaml"
    code = main(["doctor", str(sla), "--json"])
    out = capsys.readouterr()
    data = json.loads(out.out or "null")
    assert data is not None, out.err
    assert code == data["exit_code"] == 2
    assert [f for f in data["findings"] if f["status"] == "fatal"]
