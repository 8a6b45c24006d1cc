"""Where a study's launches ran, and which ran side by side.

Read from each launch's ``trial.json``: the node and the GPUs the executor assigned (Ray
records them), the GPUs where NVML saw the engine's processes hold memory, and the launch's
wall-clock span. `autotuner report` prints it for studies run on Ray; it is also the check
that concurrent launches really used different GPUs and that a multi-GPU candidate got all
the GPUs it asked for.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from autotuner.engines.base import OptionRoles
from autotuner.records.trial import TrialFile
from autotuner.search.executors import gpus_needed


@dataclass(frozen=True)
class Placement:
    name: str  # the launch's directory, relative to the study directory
    node: str | None
    assigned: tuple[str, ...]  # GPU UUIDs the executor gave the launch
    seen: tuple[str, ...]  # GPU UUIDs where NVML saw the engine's processes
    needed: int  # GPUs the engine asks for (tensor x pipeline parallel size)
    start: float  # epoch seconds
    end: float
    status: str

    @property
    def gpus(self) -> tuple[str, ...]:
        """What NVML saw, or the assignment when NVML could not attribute (PIDs hidden)."""
        return self.seen or self.assigned


def load(study_dir: Path, roles: OptionRoles) -> list[Placement]:
    """Every launch of the study that recorded its wall-clock span, by start time (``roles``:
    the engine's, which name the layout's options in each launch's params)."""
    out = []
    for path in sorted(study_dir.glob("**/trial.json")):
        trial = TrialFile.read_or_none(path)
        if trial is None:
            continue
        extra = trial.extra
        if "started_at" not in extra or "ended_at" not in extra:
            continue  # written before launches recorded their span
        out.append(
            Placement(
                name=str(path.parent.relative_to(study_dir)),
                node=extra.get("node"),
                assigned=tuple(extra.get("gpu_uuids") or ()),
                seen=tuple(sorted(extra.get("engine_gpus") or {})),
                needed=gpus_needed(trial.params, roles),
                start=float(extra["started_at"]),
                end=float(extra["ended_at"]),
                status=trial.status,
            )
        )
    return sorted(out, key=lambda p: p.start)


def side_by_side(placements: Sequence[Placement]) -> list[tuple[Placement, Placement]]:
    """Pairs of launches that overlapped in time on disjoint GPU sets (UUIDs are unique
    across nodes)."""
    return [
        (a, b)
        for a, b in itertools.combinations(placements, 2)
        if _overlap(a, b) and a.gpus and b.gpus and not set(a.gpus) & set(b.gpus)
    ]


def _overlap(a: Placement, b: Placement) -> bool:
    return a.start < b.end and b.start < a.end


def problems(placements: Sequence[Placement]) -> list[str]:
    """What contradicts the placement the executor promised."""
    out = []
    for p in placements:
        if p.seen and p.assigned and not set(p.seen) <= set(p.assigned):
            extra = ", ".join(sorted(set(p.seen) - set(p.assigned)))
            out.append(f"{p.name}: the engine used GPUs it was not given ({extra})")
        if p.gpus and p.status != "failed" and len(set(p.gpus)) < p.needed:
            out.append(f"{p.name}: needs {p.needed} GPUs, ran on {len(set(p.gpus))}")
    for a, b in itertools.combinations(placements, 2):
        shared = set(a.gpus) & set(b.gpus)
        if shared and _overlap(a, b):
            out.append(f"{a.name} and {b.name} ran at the same time on {', '.join(sorted(shared))}")
    return out


def render(placements: Sequence[Placement]) -> str:
    if not placements:
        return "no launch recorded where it ran"
    t0 = min(p.start for p in placements)
    short = {u: f"gpu{i}" for i, u in enumerate(sorted({u for p in placements for u in p.gpus}))}
    lines = [
        f"where launches ran (t=0 at {datetime.fromtimestamp(t0, UTC):%Y-%m-%d %H:%M:%S} UTC; "
        "GPUs as NVML saw the engine, else as assigned):",
        f"  {'launch':<28} {'node':<15} {'needs':>5} {'GPUs':<14} {'from':>7} {'to':>7}",
    ]
    for p in placements:
        gpus = ",".join(short[u] for u in p.gpus) or "-"
        lines.append(
            f"  {p.name:<28} {p.node or '-':<15} {p.needed:>5} {gpus:<14} "
            f"{p.start - t0:>6.0f}s {p.end - t0:>6.0f}s"
        )
    lines.extend(f"  {name} = {u}" for u, name in short.items())
    pairs = side_by_side(placements)
    lines.append(f"  side by side on different GPUs: {len(pairs)} pair(s)")
    lines.extend(f"  problem: {msg}" for msg in problems(placements))
    return "\n".join(lines)
