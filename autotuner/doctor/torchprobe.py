"""Asks an engine's interpreter about its torch: version, the CUDA it was built with, the GPU
architectures it has kernels for, whether it sees the GPUs, and the torch the engine pins.

One subprocess (argv, no shell, a time-out), run the way the engine is launched: the caller's
environment with ``CUDA_VISIBLE_DEVICES`` set to the target's devices (empty for a CPU target)
and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (indices as NVML counts them). It imports torch (seconds),
never the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PROBE_TIMEOUT_S", "TorchFacts", "probe_torch"]

PROBE_TIMEOUT_S = 120.0

# Runs inside the engine's interpreter; keep it valid on any Python >= 3.8.
_SCRIPT = """\
import json, sys, warnings
from importlib import metadata
out = {"python": sys.version.split()[0]}
out["pins"] = []
try:
    from packaging.requirements import Requirement
    for text in metadata.requires(sys.argv[1]) or []:
        req = Requirement(text)
        if req.name == "torch" and (req.marker is None or req.marker.evaluate({"extra": ""})):
            have = metadata.version("torch")
            out["pins"].append([str(req.specifier), req.specifier.contains(have, True)])
except Exception:
    pass
try:
    import torch
except Exception as e:
    out["error"] = "import torch failed: %s: %s" % (type(e).__name__, e)
    print(json.dumps(out)); sys.exit(0)
out["torch"] = torch.__version__
out["cuda"] = torch.version.cuda
out["hip"] = getattr(torch.version, "hip", None)
if sys.argv[2] == "gpu":
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["available"] = bool(torch.cuda.is_available())
            n = torch.cuda.device_count() if out["available"] else 0
            out["devices"] = [[torch.cuda.get_device_name(i),
                               list(torch.cuda.get_device_capability(i))] for i in range(n)]
            out["arch_list"] = torch.cuda.get_arch_list() if n else []
        except Exception as e:
            out["available"] = False
            out["cuda_error"] = "%s: %s" % (type(e).__name__, e)
    out["warnings"] = [str(w.message).strip()[:400] for w in caught][:5]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class TorchFacts:
    """What the probe answered; ``error`` when it could not (then the rest is empty)."""

    error: str | None = None
    python: str | None = None
    torch: str | None = None
    cuda: str | None = None  # "12.8"; None for a CPU build
    hip: str | None = None
    available: bool | None = None  # None: not asked (CPU target)
    devices: tuple[tuple[str, tuple[int, int]], ...] = ()
    arch_list: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    cuda_error: str | None = None
    # the engine's torch requirements, each with whether the installed torch meets it
    pins: tuple[tuple[str, bool], ...] = field(default_factory=tuple)


def probe_torch(
    python: Path,
    *,
    distribution: str,
    gpu: bool,
    cuda_devices: Sequence[str] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> TorchFacts:
    """Probe ``python``'s torch (``distribution``: the engine whose torch pin is checked).
    ``gpu`` False: a CPU target, CUDA is not asked (and hidden); True: torch looks at
    ``cuda_devices`` (None: every GPU)."""
    env = dict(os.environ)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif cuda_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(cuda_devices)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    argv = [str(python), "-c", _SCRIPT, distribution, "gpu" if gpu else "cpu"]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            cwd=python.parent,  # not the caller's cwd, which could shadow packages
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return TorchFacts(error=f"the torch probe did not finish within {timeout_s:.0f} s")
    except OSError as e:
        return TorchFacts(error=f"cannot run {python}: {e.strerror or e}")
    lines = proc.stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1])  # last line: a sitecustomize may print first
        if not isinstance(data, dict):
            raise TypeError
    except (IndexError, ValueError, TypeError):
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return TorchFacts(error=f"the torch probe failed (exit {proc.returncode}): {tail}")
    return TorchFacts(
        error=_text(data.get("error")),
        python=_text(data.get("python")),
        torch=_text(data.get("torch")),
        cuda=_text(data.get("cuda")),
        hip=_text(data.get("hip")),
        available=None if "available" not in data else bool(data["available"]),
        devices=tuple(
            (str(d[0]), (int(d[1][0]), int(d[1][1])))
            for d in data.get("devices") or []
            if isinstance(d, list) and len(d) == 2
        ),
        arch_list=tuple(str(a) for a in data.get("arch_list") or []),
        warnings=tuple(str(w) for w in data.get("warnings") or []),
        cuda_error=_text(data.get("cuda_error")),
        pins=tuple(
            (str(p[0]), bool(p[1]))
            for p in data.get("pins") or []
            if isinstance(p, list) and len(p) == 2
        ),
    )


def _text(v: object) -> str | None:
    return None if v is None else str(v)
