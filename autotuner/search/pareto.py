"""Pareto front and the promotion policy, as pure functions over plain records.

Policy (default): the feasible Pareto front, ranked by the SLA's objectives in the order they
are written (the first decides, the next break ties), then lower p99 TTFT, then lower peak
memory. Values within ``tie_tolerance`` (relative) of each other count as a tie, so that
measurement noise does not decide the ranking alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Direction = Literal["maximize", "minimize"]


@dataclass(frozen=True)
class Candidate:
    """One measured config as the policy sees it."""

    trial: int
    values: tuple[float, ...]  # objective values in SLA order
    feasible: bool
    metrics: dict[str, float | None] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    baseline: bool = False


def dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[Direction]) -> bool:
    """``a`` is at least as good as ``b`` in every objective and better in one."""
    better = False
    for x, y, d in zip(a, b, directions, strict=True):
        if d == "minimize":
            x, y = -x, -y
        if x < y:
            return False
        if x > y:
            better = True
    return better


def pareto_front(cands: Sequence[Candidate], directions: Sequence[Direction]) -> list[Candidate]:
    """The feasible candidates no other feasible candidate dominates (input order kept)."""
    pool = [c for c in cands if c.feasible]
    return [c for c in pool if not any(dominates(o.values, c.values, directions) for o in pool)]


def _cmp_key(
    c: Candidate, directions: Sequence[Direction], scale: Sequence[float], tol: float
) -> tuple[float, ...]:
    key: list[float] = []
    for v, d, s in zip(c.values, directions, scale, strict=True):
        sign = -1.0 if d == "maximize" else 1.0
        # Quantise by the tolerance so near-equal values compare equal.
        step = tol * s if s > 0 and tol > 0 else 0.0
        key.append(sign * (round(v / step) if step else v))
    for extra in ("p99_ttft_ms", "peak_memory_gib"):
        value = c.metrics.get(extra)
        key.append(value if value is not None else float("inf"))
    return tuple(key)


def rank(
    cands: Sequence[Candidate], directions: Sequence[Direction], tie_tolerance: float = 0.02
) -> list[Candidate]:
    """Order candidates by the promotion policy (best first)."""
    if not cands:
        return []
    scale = [max(abs(c.values[i]) for c in cands) for i in range(len(directions))]
    return sorted(cands, key=lambda c: _cmp_key(c, directions, scale, tie_tolerance))
