"""Host checks: free disk where the engine writes (compile caches, models, studies), shared
memory (tensor-parallel workers talk through /dev/shm), CPU cores and, on a CPU target, RAM.

Paths and sizes come from the arguments, so tests can point them anywhere.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotuner.core.hardware import CpuInfo
from autotuner.engines.base import EngineAdapter
from autotuner.measure.hostload import HostSample, sample
from autotuner.records.doctor import Finding

GIB = 1 << 30
DISK_FATAL = 1 * GIB  # compile caches alone take hundreds of MiB per launch
DISK_WARN = 10 * GIB
SHM_WARN = 1 * GIB  # Docker's default is 64 MiB, which NCCL outgrows at TP > 1


def cache_dirs(engine: EngineAdapter, environ: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Where the engine writes at start-up: its own cache (vLLM's: torch.compile artefacts,
    kernels; the adapter names the variable and the default), TorchInductor's and Triton's."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    user = env.get("USER") or env.get("LOGNAME") or getpass.getuser()
    names = engine.env_names
    own: dict[str, Path] = {}
    if names.cache_root is not None or names.cache_default is not None:
        root = env.get(names.cache_root) if names.cache_root is not None else None
        own[f"{engine.display_name} cache"] = Path(root or home / (names.cache_default or ""))
    return {
        **own,
        "TorchInductor cache": Path(
            env.get("TORCHINDUCTOR_CACHE_DIR") or f"/tmp/torchinductor_{user}"
        ),
        "Triton cache": Path(env.get("TRITON_CACHE_DIR") or home / ".triton"),
    }


def _existing(path: Path) -> Path:
    """The path, or its nearest existing parent (what will hold it once created)."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def disk_findings(places: Mapping[str, Path]) -> list[Finding]:
    """Free space of each file system the ``places`` (label -> path) live on, once each."""
    by_fs: dict[int, tuple[list[str], Path, int]] = {}
    for label, path in places.items():
        where = _existing(path)
        try:
            st = os.statvfs(where)
            dev = os.stat(where).st_dev
        except OSError:
            continue
        labels, _, _ = by_fs.setdefault(dev, ([], where, st.f_bavail * st.f_frsize))
        labels.append(f"{label} ({path})")
    out = []
    for labels, where, free in by_fs.values():
        found = f"{free / GIB:.1f} GiB free on the file system of {where}: " + ", ".join(labels)
        if free < DISK_FATAL:
            out.append(
                Finding(
                    check="host.disk",
                    status="fatal",
                    found=found,
                    action="free space there: the engine writes compile caches at every start",
                )
            )
        elif free < DISK_WARN:
            out.append(
                Finding(
                    check="host.disk",
                    status="warning",
                    found=found,
                    action="free some space: compile caches, model files and study logs grow",
                )
            )
        else:
            out.append(Finding(check="host.disk", status="ok", found=found))
    return out


def shm_finding(ranks: int, shm: Path = Path("/dev/shm")) -> Finding:
    """``/dev/shm`` for ``ranks`` engine workers (tensor x pipeline parallel)."""
    try:
        st = os.statvfs(shm)
    except OSError:
        return Finding(
            check="host.shm",
            status="warning" if ranks > 1 else "ok",
            found=f"{shm} does not exist",
            action="mount a tmpfs there (NCCL needs it for TP > 1)" if ranks > 1 else None,
        )
    size = st.f_blocks * st.f_frsize
    found = f"{shm}: {size / GIB:.2f} GiB ({st.f_bavail * st.f_frsize / GIB:.2f} free)"
    if ranks > 1 and size < SHM_WARN:
        return Finding(
            check="host.shm",
            status="warning",
            found=f"{found}, for {ranks} ranks",
            action="give the container more shared memory (docker run --shm-size=16g or "
            "--ipc=host): NCCL and vLLM's workers exchange data through it",
        )
    return Finding(check="host.shm", status="ok", found=found)


def cpu_findings(
    cpu: CpuInfo, *, device: str, ranks: int, mem_util: float | None, option: str
) -> list[Finding]:
    """Cores for the engine's processes, and (CPU target) RAM for its KV cache; ``option``
    names the engine's memory share (vLLM's ``gpu_memory_utilization``, on the CPU engine a
    share of RAM)."""
    out = []
    if device == "cpu":
        need = 2  # the load generator keeps a core; the engine runs on the rest
        what = "one the load generator keeps, the rest for the engine"
    else:
        need = ranks + 2  # a worker per GPU, the engine core and the API server
        what = f"a worker per GPU ({ranks}), the engine core and the API server"
    found = f"{cpu.cores} usable CPU cores of {cpu.logical_cpus} ({cpu.model})"
    if cpu.cores < need:
        out.append(
            Finding(
                check="host.cpu",
                status="warning",
                found=f"{found}; the engine wants at least {need}: {what}",
                action="give the process more cores (taskset, container CPU limits): "
                "starved processes inflate TTFT and TPOT",
            )
        )
    else:
        out.append(Finding(check="host.cpu", status="ok", found=found))
    if device == "cpu":
        util = 0.5 if mem_util is None else mem_util
        want = util * cpu.memory_total
        ram = (
            f"{cpu.memory_available / GIB:.1f} GiB of {cpu.memory_total / GIB:.1f} GiB RAM "
            f"available; {option} {util:g} asks for {want / GIB:.1f} GiB"
        )
        if cpu.memory_available < want:
            out.append(
                Finding(
                    check="host.memory",
                    status="warning",
                    found=ram,
                    action=f"lower {option} (on the CPU engine: its share of RAM) or free memory",
                )
            )
        else:
            out.append(Finding(check="host.memory", status="ok", found=ram))
    return out


def load_finding(device: str, found: HostSample | None = None) -> Finding:
    """Other processes on the cores (measured over a second unless ``found`` is given): the
    host is part of the measurement. On a CPU target the engine's latency follows their
    load, on any target the load generator's sends do (issue 28: a shared 2-core host
    measured one config at 0 and at 4.27 req/s ten minutes apart, while doctor passed)."""
    try:
        found = found or sample(1.0)
    except OSError as exc:
        return Finding(check="host.load", status="ok", found=f"host load not measurable: {exc}")
    if not found.busy:
        return Finding(check="host.load", status="ok", found=found.describe())
    what = "the CPU engine's latency" if device == "cpu" else "the load generator's sending"
    return Finding(
        check="host.load",
        status="warning",
        found=f"{found.describe()}: a busy host",
        action=f"stop them or tune on a quiet host: {what} follows their load; `report` marks "
        "launches measured on a busy host",
    )


def places(
    model_dir: Path | None, trials_dir: Path, home: Path, engine: EngineAdapter
) -> dict[str, Path]:
    """Every place the doctor checks the disk of (``engine``: whose cache)."""
    out: dict[str, Path] = dict(cache_dirs(engine))
    out["models"] = model_dir if model_dir is not None else home / "models"
    out["studies"] = trials_dir
    return out


def ranks_of(values: Sequence[object]) -> int:
    """The largest integer among ``values`` (parallel sizes), at least 1."""
    return max([v for v in values if isinstance(v, int) and not isinstance(v, bool)] + [1])
