"""What the bundle's files show for each config: the confirmation replicates' means where
confirmation measured them (capacity, goodput at capacity), the search's single run otherwise,
so that the fallback plan and the Pareto chart never contradict the decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotuner.records.manifest import DecisionRecord, Manifest, Spread
from autotuner.search.pareto import Candidate

SUMMARY = (
    "capacity",
    "capacity_per_gpu",
    "goodput",
    "p99_ttft_ms",
    "p99_tpot_ms",
    "p99_e2e_ms",
    "peak_memory_gib",
)


# Measured by confirmation replicates (the rest is the search's single run at the SLA's load).
CONFIRMED_METRICS = ("capacity", "capacity_per_gpu", "goodput")


def config_label(c: Candidate) -> str:
    return "baseline" if c.baseline else f"trial-{c.trial}"


@dataclass(frozen=True)
class Figures:
    """What the bundle's files show for each config: confirmation replicates' means where
    they exist (capacity, goodput at capacity), the search's single run otherwise."""

    confirmed: dict[str, dict[str, float | None]]  # config label -> metric -> mean
    replicates: dict[str, int]  # config label -> replicates that met the SLA (the mean's)
    comparisons: dict[str, dict[str, Any]]  # candidate label -> its comparison with baseline
    # config label -> replicates that missed the SLA at its own load (not in the mean)
    missed: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, manifest: Manifest) -> Figures:
        conf = manifest.measurements.confirmation if manifest.measurements else None
        confirmed: dict[str, dict[str, float | None]] = {}
        replicates: dict[str, int] = {}
        missed: dict[str, int] = {}
        for name, spreads in (conf.spread if conf else {}).items():
            cap = spreads.get("capacity", Spread())
            if cap.replicates or cap.missed:
                confirmed[name] = {m: spreads[m].mean for m in CONFIRMED_METRICS if m in spreads}
                if not cap.replicates:  # missed the SLA in every replicate: capacity 0
                    confirmed[name].update(capacity=0.0, capacity_per_gpu=0.0)
                replicates[name] = cap.replicates
                missed[name] = cap.missed
        d = manifest.decision
        comparisons = dict(d.comparisons) if isinstance(d, DecisionRecord) else {}
        return cls(confirmed, replicates, comparisons, missed)

    def confirmed_in(self, c: Candidate) -> bool:
        """Whether confirmation measured ``c``."""
        return config_label(c) in self.confirmed

    def rejected(self, c: Candidate) -> bool:
        """A candidate (not the baseline) that missed the SLA in a confirmation replicate."""
        return not c.baseline and bool(self.missed.get(config_label(c)))

    def rejected_notes(self, cands: Sequence[Candidate], chosen: Candidate) -> list[str]:
        """Why each rejected candidate is not listed as a fallback."""
        return [
            f"trial {c.trial} is not offered as a fallback: it missed the SLA at its own load "
            f"in {self.missed[config_label(c)]} of "
            f"{self.missed[config_label(c)] + self.replicates.get(config_label(c), 0)} "
            "confirmation replicates"
            for c in cands
            if self.rejected(c) and c.trial != chosen.trial
        ]

    def metrics(self, c: Candidate) -> dict[str, float | None]:
        """``c``'s search metrics, with the confirmed means where confirmation has them (a
        config that missed the SLA in every replicate: capacity 0, no goodput)."""
        if not self.confirmed_in(c):
            return dict(c.metrics)
        mine = self.confirmed[config_label(c)]
        out = {**c.metrics, **{m: v for m, v in mine.items() if v is not None}}
        if not self.replicates.get(config_label(c)):
            out["goodput"] = None
        return out

    def _confirmed_basis(self, c: Candidate) -> str:
        n, missed = self.replicates.get(config_label(c), 0), self.missed.get(config_label(c), 0)
        if not missed:
            return f"mean of {n} replicates"
        if not n:
            return f"missed the SLA in all {missed} replicates"
        return f"mean of the {n} of {n + missed} replicates that met the SLA"

    def basis(self, c: Candidate, names: Sequence[str]) -> dict[str, str]:
        mine = self._confirmed_basis(c) if self.confirmed_in(c) else None
        return {m: mine if mine and m in CONFIRMED_METRICS else "single run" for m in names}

    def point_basis(self, c: Candidate) -> str:
        if not self.confirmed_in(c):
            return "single run"
        n, missed = self.replicates.get(config_label(c), 0), self.missed.get(config_label(c), 0)
        if missed:
            return f"confirmed, missed the SLA in {missed} of {n + missed} replicates"
        return f"confirmed, {n} replicates"

    def capacity_change(self, c: Candidate, chosen: Candidate) -> str | None:
        """The confirmed capacity change of ``c`` against ``chosen``, with its interval and
        the decision's verdict (None when confirmation did not compare the two)."""
        if c.baseline and not chosen.baseline:
            cmp, flip = self.comparisons.get(config_label(chosen)), True
        elif chosen.baseline and not c.baseline:
            cmp, flip = self.comparisons.get(config_label(c)), False
        else:
            return None
        if not cmp:
            return None
        if cmp.get("basis") == "sla":
            # Decided on the SLA: a capacity ratio against a config that missed it is no
            # measure of either.
            who = [x for x in (c, chosen) if self.missed.get(config_label(x))]
            said = "; ".join(
                f"{config_label(x)} missed the SLA in {self.missed[config_label(x)]} of "
                f"{self.missed[config_label(x)] + self.replicates.get(config_label(x), 0)} "
                "replicates"
                for x in who
            )
            return f"not compared: decided on the SLA ({said or 'see Notes'})"
        if cmp.get("effect") is None:
            said = str(cmp.get("verdict") or "not compared").replace("_", " ")
            return f"n/a (confirmed: {said}, from {cmp.get('pairs', 0)} pair(s))"
        effect, low, high = cmp["effect"], cmp.get("low"), cmp.get("high")
        words = {
            "better": ("higher", "lower"),
            "worse": ("lower", "higher"),
            "no_difference": ("no difference",) * 2,
            "not_enough_data": ("not resolved",) * 2,
        }.get(str(cmp.get("verdict")), ("?", "?"))
        if flip:  # the baseline against the promoted candidate: invert the ratio
            effect = 1 / (1 + effect) - 1
            low, high = (
                None if high is None else 1 / (1 + high) - 1,
                None if low is None else 1 / (1 + low) - 1,
            )
        span = "" if low is None or high is None else f" [{low * 100:+.1f}, {high * 100:+.1f}]"
        return f"{effect * 100:+.1f} %{span} (confirmed: {words[1 if flip else 0]})"
