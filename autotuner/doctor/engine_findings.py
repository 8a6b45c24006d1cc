"""The engine-environment checks: its torch against the engine's pin, the driver and the GPUs.

The classic failure is the triangle driver / CUDA / engine: a torch built with a newer CUDA
than the driver supports. A newer major version cannot run at all; a newer minor version runs
through CUDA's minor-version compatibility, except kernels compiled at run time (Triton's PTX),
which the older driver refuses, so that is a warning, and fatal when torch then sees no GPU.
"""

from __future__ import annotations

import re

from autotuner.doctor.gpu import GpuScan
from autotuner.doctor.torchprobe import TorchFacts
from autotuner.records.doctor import Finding

REINSTALL = (
    "reinstall the engine environment (`autotuner engine remove NAME`, then "
    "`autotuner engine install SPEC`), or repair it with pip"
)


def _cuda(text: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2])) if m else None


def _dotted(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def torch_findings(
    facts: TorchFacts, *, engine: str, scan: GpuScan | None, gpus_wanted: int
) -> list[Finding]:
    """Findings of the torch probe. ``scan`` None: a CPU target; ``gpus_wanted``: how many
    GPUs the target lists."""
    if facts.error is not None:
        return [
            Finding(
                check="torch",
                status="fatal",
                found=f"{engine}: {facts.error}",
                action=f"the engine imports torch first: {REINSTALL}",
            )
        ]
    build = f"CUDA {facts.cuda}" if facts.cuda else ("ROCm " + facts.hip if facts.hip else "CPU")
    out = [
        Finding(
            check="torch",
            status="ok",
            found=f"torch {facts.torch} ({build} build), Python {facts.python}",
        )
    ]
    bad_pins = [spec for spec, ok in facts.pins if not ok]
    if bad_pins:
        out.append(
            Finding(
                check="torch.pin",
                status="fatal",
                found=f"{engine} needs torch{' and '.join(bad_pins)}, the environment has "
                f"{facts.torch}: the engine's compiled kernels will not load",
                action=f"install the torch the engine pins (pip install 'torch{bad_pins[0]}' "
                f"in that environment), or {REINSTALL}",
            )
        )
    elif facts.pins:
        pins = " and ".join(spec for spec, _ in facts.pins)
        out.append(Finding(check="torch.pin", status="ok", found=f"{engine} pins torch{pins}"))
    if scan is None:
        return out
    out += _gpu_side(facts, scan, gpus_wanted)
    return out


def _gpu_side(facts: TorchFacts, scan: GpuScan, gpus_wanted: int) -> list[Finding]:
    out: list[Finding] = []
    if not facts.cuda:
        return [
            Finding(
                check="torch.cuda",
                status="fatal",
                found=f"torch {facts.torch} has no CUDA: a CPU (or ROCm) build on a GPU target",
                action="use an engine environment with a CUDA build of the engine "
                "(`autotuner engine add NAME --python PATH`)",
            )
        ]
    built = _cuda(facts.cuda)
    if built is not None and scan.cuda_max is not None:
        have = scan.cuda_max
        if built[0] > have[0]:
            out.append(
                Finding(
                    check="torch.cuda",
                    status="fatal",
                    found=f"torch is built with CUDA {facts.cuda}, the driver {scan.driver} "
                    f"supports CUDA up to {_dotted(have)}: the driver is too old",
                    action=f"upgrade the NVIDIA driver to one for CUDA {facts.cuda}, or use "
                    f"an engine built for CUDA {have[0]}",
                )
            )
        elif built > have:
            out.append(
                Finding(
                    check="torch.cuda",
                    status="warning",
                    found=f"torch is built with CUDA {facts.cuda}, the driver {scan.driver} "
                    f"supports CUDA up to {_dotted(have)}: it runs by minor-version "
                    "compatibility, but kernels compiled at run time (Triton) may be refused "
                    "(unsupported PTX version)",
                    action=f"upgrade the NVIDIA driver to one for CUDA {facts.cuda}",
                )
            )
        else:
            out.append(
                Finding(
                    check="torch.cuda",
                    status="ok",
                    found=f"torch's CUDA {facts.cuda} <= the driver's CUDA {_dotted(have)}",
                )
            )
    if not facts.available or len(facts.devices) < gpus_wanted:
        why = facts.cuda_error or " | ".join(facts.warnings) or "no reason given"
        out.append(
            Finding(
                check="torch.gpu",
                status="fatal",
                found=f"torch in the engine environment sees {len(facts.devices)} of the "
                f"{gpus_wanted} GPU(s) of the target ({why})",
                action="check the driver (`nvidia-smi`), CUDA_VISIBLE_DEVICES and, in a "
                "container, that the GPUs are passed in (--gpus)",
            )
        )
        return out
    names = "; ".join(f"{n} sm_{c[0]}{c[1]}" for n, c in facts.devices)
    out.append(Finding(check="torch.gpu", status="ok", found=f"torch sees {names}"))
    out += _archs(facts)
    return out


def _arch_number(a: str) -> tuple[str, int] | None:
    m = re.fullmatch(r"(sm|compute)_(\d+)[a-z]?", a)
    return (m[1], int(m[2])) if m else None


def _archs(facts: TorchFacts) -> list[Finding]:
    """A GPU runs torch's kernels when torch has its sm_XY code, or PTX (compute_AB) of an
    older architecture to compile at load time."""
    if not facts.arch_list:
        return []
    parsed = [p for a in facts.arch_list if (p := _arch_number(a)) is not None]
    out = []
    for name, (major, minor) in sorted(set(facts.devices)):
        sm = major * 10 + minor
        same_family = any(k == "sm" and n // 10 == major and n <= sm for k, n in parsed)
        ptx = any(k == "compute" and n <= sm for k, n in parsed)
        if not (same_family or ptx):
            out.append(
                Finding(
                    check="torch.arch",
                    status="fatal",
                    found=f"torch has kernels for {' '.join(facts.arch_list)}, not for "
                    f"{name} (sm_{sm}): 'no kernel image is available for execution'",
                    action="use a torch (and engine) build that lists this architecture",
                )
            )
    if not out:
        out.append(
            Finding(
                check="torch.arch",
                status="ok",
                found=f"torch has kernels for the GPUs ({' '.join(facts.arch_list)})",
            )
        )
    return out
