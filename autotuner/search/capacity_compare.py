"""Deciding by capacity: is a candidate's capacity really different from the baseline's?

Confirmation measures the baseline and a candidate in interleaved replicates: replicate r runs
both configs back to back, each a (narrow) capacity search. The decision rests on the paired
log-ratios d_r = ln(candidate_r / baseline_r):

- **Paired**, because the two capacities of one replicate share the machine's state at the
  time (thermal, neighbours, drift between replicates), which the ratio cancels.
- **Logs**, because capacity is a scale quantity: +10 % and -10 % are symmetric in logs, and the
  interval maps back to a ratio interval that stays positive.
- **Student t**, because there are 2-10 replicates: a bootstrap of 3 pairs has 10 distinct
  resamples and an interval far too narrow. The t quantile comes from the exact Student t
  distribution for integer degrees of freedom (closed-form series, no scipy), inverted by
  bisection.
- **A spread floor**: each capacity is only known inside its bracket, whose relative width is
  at most the search's resolution. Spread uniformly over the bracket that is a log standard
  deviation of resolution / sqrt(12) per capacity, resolution / sqrt(6) per log-ratio. The
  replicates' standard deviation is raised to that floor, so that identical capacities (a
  quantized search, two replicates that happened to agree) do not claim certainty.

The effect is exp(mean d) - 1 (the geometric mean ratio, minus 1) with the t-interval mapped
the same way. Verdict against ``min_effect`` (the smallest relative win worth promoting):

- ``better``: the interval excludes 0 and the effect is at least ``min_effect``;
- ``worse``: the interval excludes 0 and the effect is at most ``-min_effect``;
- ``no_difference``: the interval lies inside (-min_effect, +min_effect): whatever the
  difference is, it is smaller than what matters;
- ``not_enough_data``: anything else (fewer than two usable pairs, or an interval too wide to
  tell): more replicates would be needed.

**The SLA comes first.** Zero capacity means the config missed the SLA at its own load in
that replicate (or could not be shown to meet it there: undecided): evidence, never missing
data. So before any capacity is compared, each side's replicates are counted (a launch that
failed or was interrupted, None, is left out: it measured nothing):

- the candidate missed the SLA in some replicate: it is not promoted: ``worse`` when the
  baseline met the SLA in all of its own, ``neither_met`` when the baseline missed too;
- the candidate met the SLA in every replicate (at least 2) and the baseline missed it in
  some: ``better`` on the SLA (``basis: sla``, no capacity effect: a config that holds the
  SLA's own workload every time beats one that does not, whatever either serves above it);
- both met it in every replicate: capacity decides, as above, on every pair.

Before any of that, :func:`worth_confirming` says whether confirmation is worth its launches
at all: only when a candidate's search capacity is ahead of the baseline's by more than the
resolution. Otherwise say so and spend nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import fmean, stdev
from typing import Any, Literal

CompareVerdict = Literal["better", "worse", "no_difference", "not_enough_data", "neither_met"]
# What decided a comparison: the share of replicates that met the SLA, or their capacities.
CompareBasis = Literal["sla", "capacity"]


@dataclass(frozen=True)
class CapacityComparison:
    """A candidate's capacity relative to the baseline's, from paired replicates."""

    verdict: CompareVerdict
    effect: float | None  # candidate / baseline - 1 (geometric mean over pairs); None: unbounded
    low: float | None  # the effect's confidence interval
    high: float | None
    confidence: float
    min_effect: float
    pairs: int  # pairs the interval rests on (both configs met the SLA, both measured)
    reason: str
    basis: CompareBasis = "capacity"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Worth:
    """Whether re-measuring a candidate against the baseline can change the decision."""

    confirm: bool
    lead: float | None  # candidate / baseline - 1; None when the baseline held nothing
    reason: str


@dataclass(frozen=True)
class Selection:
    """The candidates to confirm, best first (none: confirmation is skipped)."""

    labels: tuple[str, ...]
    reason: str


# --------------------------------------------------------------------------- Student t


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3/26.7.4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2 == 1:
        total, term = 0.0, c
        for j in range((df - 1) // 2):  # cos, (2/3) cos^3, (2*4)/(3*5) cos^5, ...
            total += term
            term *= c * c * (2 * j + 2) / (2 * j + 3)
        central = 2 / math.pi * (theta + s * total) if df > 1 else 2 * theta / math.pi
    else:
        total, term = 0.0, 1.0
        for j in range(df // 2):  # 1, (1/2) cos^2, (1*3)/(2*4) cos^4, ...
            total += term
            term *= c * c * (2 * j + 1) / (2 * j + 2)
        central = s * total
    central = min(max(central, 0.0), 1.0)  # P(|T| <= |t|)
    return (1 + central) / 2 if t >= 0 else (1 - central) / 2


def t_quantile(prob: float, df: int) -> float:
    """The t with P(T <= t) = ``prob`` (bisection on :func:`t_cdf`; 1e-12 relative)."""
    if not 0 < prob < 1:
        raise ValueError(f"prob must be in (0, 1), got {prob!r}")
    if prob < 0.5:
        return -t_quantile(1 - prob, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < prob:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < prob:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


# --------------------------------------------------------------------------- the decision


def compare_capacity(
    baseline: Sequence[float | None],
    candidate: Sequence[float | None],
    *,
    min_effect: float = 0.05,
    confidence: float = 0.95,
    resolution: float = 0.03,
    label: str = "the candidate",
) -> CapacityComparison:
    """Compare capacities measured in paired replicates (index r = replicate r of each)."""
    if len(baseline) != len(candidate):
        raise ValueError(
            f"replicates must pair up: {len(baseline)} baseline vs {len(candidate)} candidate"
        )
    if not 0 <= min_effect < 1:
        raise ValueError(f"min_effect must be in [0, 1), got {min_effect!r}")
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence!r}")
    if not 0 <= resolution < 1:
        raise ValueError(f"resolution must be in [0, 1), got {resolution!r}")
    for v in (*baseline, *candidate):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"capacities must be finite and >= 0, got {v!r}")

    def done(
        verdict: CompareVerdict, reason: str, n: int = 0, basis: CompareBasis = "capacity"
    ) -> CapacityComparison:
        return CapacityComparison(
            verdict, None, None, None, confidence, min_effect, n, reason, basis
        )

    positive = [
        (b, c)
        for b, c in zip(baseline, candidate, strict=True)
        if b is not None and c is not None and b > 0 and c > 0
    ]
    b_n, b_missed = _missed(baseline)
    c_n, c_missed = _missed(candidate)
    if c_missed:
        mine = f"{label} missed the SLA at its own load in {c_missed} of {c_n} replicates"
        if b_missed:
            return done(
                "neither_met",
                f"{mine}, and the baseline in {b_missed} of {b_n}: neither met it in every "
                "replicate",
                len(positive),
                "sla",
            )
        if b_n:
            return done("worse", f"{mine}; the baseline met it in all {b_n}", len(positive), "sla")
        return done("not_enough_data", f"{mine}; the baseline was not measured", 0, "sla")
    if c_n < 2:
        return done(
            "not_enough_data",
            f"{label} was measured in {c_n} replicate(s); at least 2 are needed",
            len(positive),
        )
    if b_missed:
        held = ""
        if positive:
            ratio = _expm1(fmean(_log_ratio(b, c) for b, c in positive))
            held = (
                f" (where both met it, {len(positive)} pair(s): {ratio:+.1%} by capacity, "
                "not what decided)"
            )
        return done(
            "better",
            f"{label} met the SLA at its own load in all {c_n} replicates, the baseline "
            f"missed it in {b_missed} of {b_n}{held}",
            len(positive),
            "sla",
        )
    failed = len(baseline) - b_n + len(candidate) - c_n
    note = f"; left out: {failed} launch(es) that failed (nothing measured)" if failed else ""
    if len(positive) < 2:
        return done(
            "not_enough_data",
            f"{len(positive)} replicate pair(s) measured; at least 2 are needed to measure "
            f"the spread{note}",
            len(positive),
        )
    logs = [_log_ratio(b, c) for b, c in positive]
    n = len(logs)
    mean = fmean(logs)
    sd = max(stdev(logs), resolution / math.sqrt(6))
    half = t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    effect = _expm1(mean)
    low, high = _expm1(mean - half), _expm1(mean + half)
    verdict = _verdict(effect, low, high, min_effect)
    shown = f"{effect:+.1%} [{low:+.1%}, {high:+.1%}] at {confidence:.0%} from {n} pairs"
    why = {
        "better": f"{label} holds {shown}: above 0 and at least the minimum effect "
        f"{min_effect:.0%}",
        "worse": f"{label} holds {shown}: below 0 by at least the minimum effect {min_effect:.0%}",
        "no_difference": f"{label} holds {shown}: inside ±{min_effect:.0%}, no difference "
        "that matters",
        "not_enough_data": f"{label} holds {shown}: too wide to tell against the minimum "
        f"effect {min_effect:.0%}",
    }[verdict]
    return CapacityComparison(verdict, effect, low, high, confidence, min_effect, n, why + note)


# exp() of a larger log-ratio overflows a float (709.78): a ratio of e^700 is already no
# measurement, so the interval is capped there instead of raising on absurd capacities.
_MAX_LOG_RATIO = 700.0


def _expm1(x: float) -> float:
    return math.expm1(min(x, _MAX_LOG_RATIO))


def _log_ratio(b: float, c: float) -> float:
    """ln(c / b) without forming c / b, which overflows for extreme capacities."""
    return math.log(c) - math.log(b)


def _verdict(effect: float, low: float, high: float, min_effect: float) -> CompareVerdict:
    if low > 0 and effect >= min_effect:
        return "better"
    if high < 0 and effect <= -min_effect:
        return "worse"
    if low > -min_effect and high < min_effect:
        return "no_difference"
    return "not_enough_data"


def _missed(values: Sequence[float | None]) -> tuple[int, int]:
    """(replicates measured, of those the ones that missed the SLA: capacity 0)."""
    measured = [v for v in values if v is not None]
    return len(measured), sum(1 for v in measured if v == 0)


def two_pair_warning(replicates: int, confidence: float, resolution: float) -> str | None:
    """What 2 replicates can decide (None for any other count): the t-interval of 2 pairs has
    1 degree of freedom, so only a large effect that repeats closely is ever confirmed."""
    if replicates != 2:
        return None
    t1 = t_quantile((1 + confidence) / 2, 1)
    t2 = t_quantile((1 + confidence) / 2, 2)
    # better needs mean - t1 * |d1 - d2| / 2 > 0, and the spread floor bounds the half-width.
    agree = 2 / t1
    floor = math.expm1(t1 * resolution / math.sqrt(6) / math.sqrt(2))
    example = math.expm1(agree * math.log(1.3))
    return (
        f"tune.confirm.replicates 2: the {confidence:.0%} interval of 2 replicate pairs has 1 "
        f"degree of freedom (Student t {t1:.1f}), so a candidate is confirmed on capacity only "
        f"if its two capacity ratios to the baseline agree within {agree:.0%} of the effect (a "
        f"+30% effect: within {example:.1%} of each other) and the effect exceeds {floor:.0%} "
        "(a win on the SLA, over a baseline that misses it, needs no interval); "
        f"3 replicates (t {t2:.1f}) decide far more; raising the count later extends a "
        "finished confirmation"
    )


# --------------------------------------------------------------------------- worth confirming


def worth_confirming(
    candidate_capacity: float | None,
    baseline_capacity: float | None,
    resolution: float,
    *,
    label: str = "the candidate",
) -> Worth:
    """Confirm only a candidate whose search capacity leads the baseline's by more than the
    resolution: a smaller lead is inside what one search can tell apart."""
    if candidate_capacity is None or candidate_capacity <= 0:
        return Worth(False, None, f"no confirmation: {label} did not meet the SLA")
    if baseline_capacity is None:
        return Worth(True, None, f"confirm {label}: the baseline's capacity was not measured")
    if baseline_capacity <= 0:
        return Worth(True, None, f"confirm {label}: the baseline missed the SLA at its own load")
    lead = candidate_capacity / baseline_capacity - 1
    if lead > resolution + 1e-9:  # a lead equal to the resolution (up to rounding) is not more
        return Worth(
            True,
            lead,
            f"confirm {label}: ahead of the baseline by {lead:+.1%}, more than the "
            f"resolution {resolution:.0%}",
        )
    return Worth(
        False,
        lead,
        f"no confirmation: no candidate ahead of the baseline by more than the resolution "
        f"{resolution:.0%} ({label}: {lead:+.1%})",
    )


def select_for_confirmation(
    candidates: Mapping[str, float | None],
    baseline_capacity: float | None,
    resolution: float,
    limit: int = 1,
) -> Selection:
    """The up to ``limit`` candidates worth confirming, highest capacity first."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    ranked = sorted(
        ((label, cap) for label, cap in candidates.items() if cap is not None and cap > 0),
        key=lambda item: -item[1],
    )
    worth = [
        (label, w)
        for label, cap in ranked
        if (w := worth_confirming(cap, baseline_capacity, resolution, label=label)).confirm
    ]
    if worth:
        chosen = worth[:limit]
        return Selection(
            tuple(label for label, _ in chosen), "; ".join(w.reason for _, w in chosen)
        )
    if not ranked:
        return Selection((), "no confirmation: no candidate met the SLA")
    best_label, best_cap = ranked[0]
    return Selection(
        (), worth_confirming(best_cap, baseline_capacity, resolution, label=best_label).reason
    )
