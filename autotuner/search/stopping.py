"""When a study has seen enough, and the one sentence that says what it found.

A launch costs minutes of GPU. Once the last ``patience`` launches have not raised the best
capacity by more than the resolution (what one capacity search can tell apart), more launches
are unlikely to pay: the rule says stop, and why. Launches are counted in the order they
finished; the baseline (engine defaults) is usually the first. A launch that failed or missed
the SLA at its own load counts as a launch that did not improve anything (capacity 0 or None).
The rule never stops a study in which no launch has met the SLA yet: there is no best to
protect, and the trial budget is what ends that study.

The sentence: "the engine defaults are within X % of the best of N configs tried", where X is
the defaults' shortfall relative to the best, (best - defaults) / best. A useful answer too:
often the defaults are the right config, and saying so with numbers saves the next study.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    reason: str
    launches: int
    best: float | None  # the best capacity so far (None: no launch met the SLA)
    best_before: float | None  # the best before the last ``patience`` launches
    improvement: float | None  # best / best_before - 1


@dataclass(frozen=True)
class StoppingRule:
    """Stop when the last ``patience`` launches improved the best by less than ``resolution``.

    ``min_launches`` launches (baseline included) always run first.
    """

    patience: int = 4
    resolution: float = 0.03
    min_launches: int = 0

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1, got {self.patience}")
        if not 0 <= self.resolution < 1:
            raise ValueError(f"resolution must be in [0, 1), got {self.resolution!r}")
        if self.min_launches < 0:
            raise ValueError(f"min_launches must be >= 0, got {self.min_launches}")

    def check(self, capacities: Sequence[float | None]) -> StopDecision:
        """Decide from the capacities of all launches so far, in the order they finished."""
        for c in capacities:
            if c is not None and not (math.isfinite(c) and c >= 0):
                raise ValueError(f"capacities must be finite and >= 0, got {c!r}")
        n = len(capacities)
        best = _best(capacities)
        k = self.patience
        if n < max(self.min_launches, k + 1):
            needed = max(self.min_launches, k + 1)
            return StopDecision(
                False,
                f"{n} of at least {needed} launches before the rule applies",
                n,
                best,
                None,
                None,
            )
        before = _best(capacities[: n - k])
        if best is None or before is None:
            return StopDecision(
                False,
                f"no launch has met the SLA before the last {k}: nothing to compare with",
                n,
                best,
                before,
                None,
            )
        improvement = best / before - 1
        if improvement < self.resolution:
            return StopDecision(
                True,
                f"stopped: the last {k} launches raised the best capacity by {improvement:+.1%}, "
                f"less than the resolution {self.resolution:.0%} ({before:.4g} -> {best:.4g})",
                n,
                best,
                before,
                improvement,
            )
        return StopDecision(
            False,
            f"the last {k} launches raised the best capacity by {improvement:+.1%} "
            f"({before:.4g} -> {best:.4g}): keep searching",
            n,
            best,
            before,
            improvement,
        )


def _best(capacities: Sequence[float | None]) -> float | None:
    held = [c for c in capacities if c is not None and c > 0]
    return max(held) if held else None


def defaults_sentence(
    baseline: float | None,
    best: float | None,
    configs_tried: int,
    *,
    resolution: float = 0.03,
    unit: str = "req/s",
    confirmed: bool = False,
    resolved: float | None = None,
) -> str:
    """One sentence on how the engine defaults compare with the best config tried.

    ``best`` is the best capacity of all ``configs_tried`` configs (the defaults included);
    ``confirmed`` says whether the figures come from confirmation replicates rather than
    single search runs, which the sentence then marks. ``resolved`` is how finely the two
    capacities were actually resolved (the wider of their brackets) when that is coarser than
    ``resolution``: a tie is then only a tie to within it, and the sentence says so.
    """
    if configs_tried < 1:
        raise ValueError(f"configs_tried must be >= 1, got {configs_tried}")
    tried = f"{configs_tried} config{'s' if configs_tried != 1 else ''} tried"
    marker = "" if confirmed else " (single runs, not confirmed)"
    held = [c for c in (best, baseline) if c is not None and c > 0]
    top = max(held) if held else None
    if baseline is None:
        if top is None:
            return f"the engine defaults were not measured, and none of the {tried} met the SLA"
        return (
            f"the engine defaults were not measured; the best of {tried} holds "
            f"{top:.3g} {unit}{marker}"
        )
    if top is None:
        return f"none of the {tried} met the SLA at its own load, the engine defaults included"
    if baseline <= 0:
        return (
            f"the engine defaults miss the SLA at its own load; the best of {tried} holds "
            f"{top:.3g} {unit}{marker}"
        )
    shortfall = (top - baseline) / top
    head = (
        f"the engine defaults are within {shortfall:.1%} of the best of {tried} "
        f"({baseline:.3g} vs {top:.3g} {unit})"
    )
    coarse = resolved is not None and resolved > resolution * (1 + 1e-9)
    if coarse and resolved is not None and shortfall <= resolved:
        return (
            f"{head}: no config tried measurably beat them, but the capacity brackets stayed "
            f"up to {resolved:.1%} wide (the level budget ran out before the {resolution:.0%} "
            f"resolution): a difference below that was not resolved{marker}"
        )
    if shortfall <= resolution:
        return (
            f"{head}: inside the {resolution:.0%} resolution of the measurement, no config "
            f"tried measurably beat them{marker}"
        )
    return f"{head}: the best serves {top / baseline - 1:+.1%} more{marker}"
