"""The capacity search of one launch: the highest arrival rate that meets the SLA, to a resolution.

A pure state machine, driven by measurements and free of any engine: ``next_rate()`` says what
to measure, ``record(rate, verdict, margin)`` feeds back what was seen there, until
``next_rate()`` returns None; ``result()`` then gives a :class:`Capacity`. ``verdict`` is a
level's three-way verdict (:mod:`autotuner.measure.quantile`); ``margin`` its worst relative SLA
margin as :mod:`autotuner.measure.evaluate` computes them (<= 0 met, > 0 violated; None when
not measurable).

1. Bracket. The first level is ``start_rate``. While levels meet, the rate grows by ``step``
   (up to ``max_rate``); once one misses, the highest meeting rate and the lowest missing rate
   above it bracket the capacity. If the first level misses, the rate shrinks by ``step`` down to
   ``min_rate`` (default: ``start_rate`` itself, so a miss there means the config fails the
   SLA's own load: capacity 0, ``infeasible_at_start``). With ``widen`` (a confirmation's
   narrow search) each further level on the same side squares the step: ``step``,
   ``step**2``, ``step**4``, ... up to 1.5, so a claim well above or below the truth is still
   bracketed within a few levels.
2. Refine. Two estimates of where the worst margin crosses zero: the chord between the two
   bracketing levels' margins (vLLM's ``bench sweep serve_sla`` interpolates SLA margins the
   same way) and the secant through the two highest meeting levels, extrapolated. Margins below
   capacity change smoothly while those above it can jump (preemption, a queue that never
   drains), so the secant from below is the better guess on a cliff; and when the curvature
   keeps its sign the truth lies between the two (convex: chord below, secant above). The probe
   is placed so that the bracket closes if the prediction holds: just above the low edge
   (``low * (1 + 0.95 resolution)``) when both estimates lie within that, just below the high
   edge when both lie near it, just below them when they agree within the resolution (so that
   the next probe, just above, closes the bracket: two levels), else between them (geometric
   mean). Bisection (geometric mean of the bracket: the resolution is relative) is used when the
   bracket is within (1 + resolution)^2, where the midpoint closes it whatever it shows, when no
   estimate exists (a margin missing, or margins not increasing with the rate), when two
   chord-only probes in a row moved the same edge (the classic stall of false position on a
   curved function), and when three probes have not halved the bracket.
   Noise-free synthetic curves from 10 req/s with ``step`` 1.5
   (tests/unit/measure/test_capacity.py):
   after bracketing, 1-2 levels on linear margins, at most 3 on convex (queueing) and concave
   ones, 4 on a cliff; margins that carry no information (a step) cost up to 6, where
   plain bisection always needs 4.
3. Stop when (high - low) / low <= ``resolution`` (or, with a ``quantum`` such as integer
   concurrency, when no quantum lies strictly inside), or when ``max_levels`` are spent.

The capacity claims only what was shown: its value is the highest level measured to meet the
SLA (``low``), and the bracket above it (``high``) is the uncertainty. The interpolated
crossing only places probes; it is kept beside the value as ``estimate`` and never reported as
the capacity (on the CPU quick start a search stopped by its budget with a 26 % bracket once
claimed 2.95 req/s where the highest level that met the SLA was 2.38).

Undecided levels (the percentile's confidence interval straddles the limit): the same rate is
measured again, up to ``remeasure_undecided`` times (the caller should add requests, or pool
them with the first measurement, so the interval narrows; :attr:`CapacitySearch.extending`
says when). A level still undecided then counts as a miss: the search only claims a rate that
was shown to meet the SLA, and an undecided rate is at the edge anyway (the SLA limit lies
inside its interval). When this leaves no meeting level, the reason is ``undecided``, not
``infeasible``: the config may well serve that load, the measurement could not tell.

Measurements that contradict earlier ones (a meet at or above a rate that missed before) can
only come from rates chosen outside the bracket or from noise; the latest measurement wins and
the contradicted one stops bounding the bracket.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from autotuner.measure.quantile import Outcome
from autotuner.records.trial import CapacityRecord

StopReason = Literal[
    "resolution",  # the bracket is within the resolution
    "budget",  # max_levels spent
    "max_rate",  # met the SLA at max_rate: capacity is at least that
    "infeasible_at_start",  # missed at the first level, with no room to shrink
    "infeasible",  # missed at every level down to min_rate
    "undecided",  # no level met, and the lowest stayed undecided after re-measuring
    "incomplete",  # result() asked before the search finished
]

_OUTCOMES = ("meets", "misses", "undecided")
_REL_EPS = 1e-9  # rates within this relative distance are the same level
_CLOSE = 0.95  # closing probes sit this share of the resolution from an edge
_NEAR = 0.45  # the mid-bracket probe sits this share of the resolution below the crossing


@dataclass(frozen=True)
class MeasuredLevel:
    """One level as the search saw it."""

    rate: float
    verdict: Outcome
    margin: float | None  # worst relative SLA margin; > 0 violated; None: not measurable
    repeat: bool = False  # a re-measure of the undecided level just before


@dataclass(frozen=True)
class Capacity:
    """What one capacity search found.

    ``low`` is the highest rate measured to meet the SLA (0 when none did), ``high`` the lowest
    rate above it that missed or stayed undecided (None when no level above ``low`` did).
    ``value`` is the capacity claimed: ``low``, the highest rate shown to meet the SLA (0 when
    nothing met it); [low, high] is its uncertainty. ``estimate`` is where the SLA's worst
    margin is estimated to cross zero inside [low, high] (the geometric mean of the chord and
    secant estimates of the module docstring that exist, the bracket's geometric midpoint when
    none does): what the search aimed at, never claimed; None without a closed bracket.
    """

    value: float
    low: float
    high: float | None
    unit: str
    levels: tuple[MeasuredLevel, ...]
    stopped_by: StopReason
    estimate: float | None = None  # the interpolated crossing (not claimed; see above)

    @property
    def width(self) -> float | None:
        """(high - low) / low: the bracket's relative width (None when open or infeasible)."""
        if self.high is None or self.low <= 0:
            return None
        return (self.high - self.low) / self.low

    def to_record(self, note: str = "", resolution: float | None = None) -> CapacityRecord:
        """What ``trial.json`` keeps of the search (the one conversion between the two): the
        claim and its bracket, why it stopped and ``note`` saying so in words; the levels
        are recorded with the trial and the estimate, never claimed, is left out."""
        return CapacityRecord(
            value=self.value,
            low=self.low,
            high=self.high,
            unit=self.unit,
            stopped_by=self.stopped_by,
            note=note,
            resolution=resolution,
        )

    @property
    def best_level(self) -> int | None:
        """Index in ``levels`` of the last level measured to meet the SLA at ``low``."""
        if self.low <= 0:
            return None
        for i in range(len(self.levels) - 1, -1, -1):
            lv = self.levels[i]
            if lv.verdict == "meets" and _same(lv.rate, self.low):
                return i
        return None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["levels"] = [asdict(lv) for lv in self.levels]
        return d


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= _REL_EPS * max(abs(a), abs(b))


# The widest a widened step grows: the main search's own step; a wider one would skip to rates
# that tell little and, repeated, would reach rates at which a level never ends.
_WIDEST_STEP = 1.5


@dataclass(frozen=True)
class _Edge:
    rate: float
    margin: float | None
    undecided: bool = False  # an undecided level counted as a miss


_Kind = Literal["bisect", "chord", "secant"]


@dataclass(frozen=True)
class _Plan:
    rate: float | None  # None: the search is over
    reason: StopReason | None = None  # why it is over
    kind: _Kind = "bisect"  # how a refinement probe was chosen


class CapacitySearch:
    """Brackets and refines the highest rate that meets the SLA (see the module docstring)."""

    def __init__(
        self,
        start_rate: float,
        *,
        resolution: float = 0.03,
        max_levels: int = 8,
        step: float = 1.5,
        min_rate: float | None = None,
        max_rate: float | None = None,
        quantum: float | None = None,
        remeasure_undecided: int = 1,
        unit: str = "req/s",
        widen: bool = False,
    ) -> None:
        if not (math.isfinite(start_rate) and start_rate > 0):
            raise ValueError(f"start_rate must be a positive number, got {start_rate!r}")
        if not 0 < resolution < 1:
            raise ValueError(f"resolution must be in (0, 1), got {resolution!r}")
        if max_levels < 1:
            raise ValueError(f"max_levels must be >= 1, got {max_levels}")
        if not step > 1:
            raise ValueError(f"step must be > 1, got {step!r}")
        if min_rate is not None and not 0 <= min_rate <= start_rate:
            raise ValueError(f"min_rate must be in [0, start_rate], got {min_rate!r}")
        if max_rate is not None and not max_rate >= start_rate:
            raise ValueError(f"max_rate must be >= start_rate, got {max_rate!r}")
        if quantum is not None and not quantum > 0:
            raise ValueError(f"quantum must be > 0, got {quantum!r}")
        if remeasure_undecided < 0:
            raise ValueError(f"remeasure_undecided must be >= 0, got {remeasure_undecided}")
        self.start_rate = start_rate
        self.resolution = resolution
        self.max_levels = max_levels
        self.step = step
        self.min_rate = start_rate if min_rate is None else min_rate
        self.max_rate = max_rate
        self.quantum = quantum
        self.remeasure_undecided = remeasure_undecided
        self.unit = unit
        self.widen = widen
        self._levels: list[MeasuredLevel] = []
        self._meets: list[_Edge] = []  # effective verdicts still standing
        self._misses: list[_Edge] = []
        self._pending_repeat: float | None = None  # an undecided rate to measure again
        # per refinement probe: (edge it moved, how it was chosen, log-width before, after)
        self._refined: list[tuple[Literal["low", "high"], _Kind, float, float]] = []

    @classmethod
    def around(
        cls,
        claimed: float,
        *,
        resolution: float = 0.03,
        max_levels: int = 4,
        min_rate: float | None = None,
        max_rate: float | None = None,
        quantum: float | None = None,
        remeasure_undecided: int = 1,
        unit: str = "req/s",
    ) -> CapacitySearch:
        """A narrow search around a capacity claimed earlier (a confirmation replicate).

        It starts one resolution below the claim and steps by twice the resolution, so that a
        claim that holds is bracketed by the first two levels and closed by the third.
        ``min_rate`` (0 by default here) is how far it may shrink when the claim does not hold;
        it shrinks by a wider step at each miss (``widen``): 4 levels reach ~35 % below the
        claim, where a fixed step would reach 18 %. Above a claim that was too low it grows
        the same way: the fourth level is ~46 % above the claim instead of 16 %, so a
        replicate brackets its capacity instead of ending with a floor ("at least X"), which
        no comparison can use.
        """
        if not (math.isfinite(claimed) and claimed > 0):
            raise ValueError(f"claimed capacity must be a positive number, got {claimed!r}")
        start = claimed / (1 + resolution)
        if quantum is not None:
            start = max(quantum, round(start / quantum) * quantum)
        return cls(
            start,
            resolution=resolution,
            max_levels=max_levels,
            step=1 + 2 * resolution,
            min_rate=0.0 if min_rate is None else min(min_rate, start),
            max_rate=None if max_rate is None else max(max_rate, start),
            quantum=quantum,
            remeasure_undecided=remeasure_undecided,
            unit=unit,
            widen=True,
        )

    # ------------------------------------------------------------------ the protocol

    @property
    def levels(self) -> tuple[MeasuredLevel, ...]:
        return tuple(self._levels)

    @property
    def extending(self) -> bool:
        """True when ``next_rate()`` re-measures the undecided level just recorded."""
        return self._pending_repeat is not None

    @property
    def done(self) -> bool:
        return self._plan().rate is None

    def next_rate(self) -> float | None:
        """The next rate to measure, or None when the search is over. Idempotent."""
        return self._plan().rate

    def record(self, rate: float, verdict: Outcome, margin: float | None) -> None:
        """Feed back one measured level (normally at the rate ``next_rate()`` gave)."""
        plan = self._plan()
        if plan.rate is None:
            raise ValueError("the capacity search is over; nothing more to record")
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a positive number, got {rate!r}")
        if verdict not in _OUTCOMES:
            raise ValueError(f"verdict must be one of {_OUTCOMES}, got {verdict!r}")
        if margin is not None and math.isnan(margin):
            raise ValueError("margin is NaN; pass None when it could not be measured")
        repeat = self._pending_repeat is not None and _same(rate, self._pending_repeat)
        lo, hi = self._bracket()
        self._levels.append(MeasuredLevel(rate, verdict, margin, repeat))
        self._pending_repeat = None
        if (
            verdict == "undecided"
            and self._undecided_run(rate) <= self.remeasure_undecided
            and len(self._levels) < self.max_levels
        ):
            self._pending_repeat = rate
            return
        self._apply(_Edge(rate, margin, verdict == "undecided"), verdict == "meets")
        if lo is not None and hi is not None and lo.rate < rate < hi.rate:
            new_lo, new_hi = self._bracket()
            before = math.log(hi.rate / lo.rate)
            after = math.log(new_hi.rate / new_lo.rate) if new_lo and new_hi else before
            side: Literal["low", "high"] = "low" if verdict == "meets" else "high"
            self._refined.append((side, plan.kind, before, after))

    def result(self) -> Capacity:
        """What was found so far; ``stopped_by`` is ``incomplete`` while the search goes on."""
        plan = self._plan()
        lo, hi = self._bracket()
        stopped: StopReason = plan.reason if plan.reason is not None else "incomplete"
        if lo is None:
            return Capacity(0.0, 0.0, hi.rate if hi else None, self.unit, self.levels, stopped)
        if hi is None:
            return Capacity(lo.rate, lo.rate, None, self.unit, self.levels, stopped)
        estimates = [x for x in (_crossing(lo, hi), self._secant(lo, hi)) if x is not None]
        guess = math.prod(estimates) ** (1 / len(estimates)) if estimates else None
        guess = math.sqrt(lo.rate * hi.rate) if guess is None else guess
        # Claimed: the highest level shown to meet the SLA, never the interpolation.
        return Capacity(lo.rate, lo.rate, hi.rate, self.unit, self.levels, stopped, guess)

    # ------------------------------------------------------------------ internals

    def _undecided_run(self, rate: float) -> int:
        """How many undecided records at ``rate`` end the history (the newest included)."""
        run = 0
        for lv in reversed(self._levels):
            if lv.verdict != "undecided" or not _same(lv.rate, rate):
                break
            run += 1
        return run

    def _apply(self, edge: _Edge, meets: bool) -> None:
        """Add one effective verdict; the latest measurement wins over contradicted ones."""
        r = edge.rate
        if meets:
            self._misses = [e for e in self._misses if e.rate > r and not _same(e.rate, r)]
            self._meets = [e for e in self._meets if not _same(e.rate, r)] + [edge]
        else:
            self._meets = [e for e in self._meets if e.rate < r and not _same(e.rate, r)]
            self._misses = [e for e in self._misses if not _same(e.rate, r)] + [edge]

    def _bracket(self) -> tuple[_Edge | None, _Edge | None]:
        lo = max(self._meets, key=lambda e: e.rate, default=None)
        hi = min(self._misses, key=lambda e: e.rate, default=None)
        return lo, hi

    def _closed(self, lo: float, hi: float) -> bool:
        if (hi - lo) / lo <= self.resolution * (1 + _REL_EPS):
            return True
        return self.quantum is not None and hi - lo <= self.quantum * (1 + _REL_EPS)

    def _plan(self) -> _Plan:
        """The next rate, or why the search is over. A function of the recorded levels."""
        if not self._levels:
            return _Plan(self._round(self.start_rate, "nearest"))
        if self._pending_repeat is not None:
            return _Plan(self._pending_repeat)
        lo, hi = self._bracket()
        if lo is None:
            assert hi is not None  # something was recorded, and nothing met
            return self._shrink(hi)
        if hi is None:
            if self.max_rate is not None and lo.rate >= self.max_rate * (1 - _REL_EPS):
                return _Plan(None, "max_rate")
            if len(self._levels) >= self.max_levels:
                return _Plan(None, "budget")
            up = self._round(lo.rate * self._step_now(), "up")
            return _Plan(up if self.max_rate is None else min(up, self.max_rate))
        if self._closed(lo.rate, hi.rate):
            return _Plan(None, "resolution")
        if len(self._levels) >= self.max_levels:
            return _Plan(None, "budget")
        return self._refine(lo, hi)

    def _shrink(self, hi: _Edge) -> _Plan:
        """Nothing met yet: go down by ``step`` (widened, see the module docstring), not below
        ``min_rate``."""
        floor = max(self.min_rate, self.quantum or 0.0)
        down = self._round(max(hi.rate / self._step_now(), floor), "down")
        if down < floor * (1 - _REL_EPS):
            down = self._round(floor, "up")
        if down >= hi.rate * (1 - _REL_EPS):  # already at the floor: nothing lower to try
            if hi.undecided:
                return _Plan(None, "undecided")
            first = self._levels[0].rate
            at_start = all(_same(lv.rate, first) for lv in self._levels)
            return _Plan(None, "infeasible_at_start" if at_start else "infeasible")
        if len(self._levels) >= self.max_levels:
            return _Plan(None, "budget")
        return _Plan(down)

    def _step_now(self) -> float:
        """The step while bracketing: ``step``, or with ``widen`` squared at each further
        level on the same side (up to ``_WIDEST_STEP``)."""
        if not self.widen:
            return self.step
        tried = len({lv.rate for lv in self._levels})  # a re-measured rate counts once
        widened: float = self.step ** (2 ** min(tried - 1, 8))
        return max(self.step, min(widened, _WIDEST_STEP))

    def _stalled(self) -> bool:
        """Interpolation is not paying: bisect instead (see the module docstring)."""
        refined = self._refined
        if len(refined) >= 2:
            (side_a, kind_a, _, _), (side_b, kind_b, _, _) = refined[-2:]
            if kind_a == kind_b == "chord" and side_a == side_b:
                return True
        if len(refined) >= 3 and refined[-1][3] > 0.5 * refined[-3][2]:
            return refined[-1][1] != "bisect"  # not halved in three probes
        return False

    def _secant(self, lo: _Edge, hi: _Edge) -> float | None:
        """Zero crossing of the line through the two highest meeting levels' margins."""
        known = [e for e in self._meets if e.margin is not None and math.isfinite(e.margin)]
        if len(known) < 2:
            return None
        a, b = sorted(known, key=lambda e: e.rate)[-2:]
        if not _same(b.rate, lo.rate) or a.margin is None or b.margin is None:
            return None
        if not b.margin > a.margin:
            return None
        x = b.rate - b.margin * (b.rate - a.rate) / (b.margin - a.margin)
        return min(max(x, lo.rate), hi.rate)

    def _refine(self, lo: _Edge, hi: _Edge) -> _Plan:
        res = self.resolution
        bisect = math.sqrt(lo.rate * hi.rate)
        if hi.rate <= lo.rate * (1 + res) ** 2 or self._stalled():
            return self._on_grid(bisect, lo, hi, "bisect")  # narrow: the midpoint closes it
        chord, secant = _crossing(lo, hi), self._secant(lo, hi)
        estimates = [x for x in (chord, secant) if x is not None]
        if not estimates:
            return self._on_grid(bisect, lo, hi, "bisect")
        kind: _Kind = "chord" if secant is None else "secant"
        a, b = min(estimates), max(estimates)
        close_up = lo.rate * (1 + _CLOSE * res)  # closes the bracket if it misses
        close_down = hi.rate / (1 + _CLOSE * res)  # closes the bracket if it meets
        if b <= close_up:
            probe = close_up
        elif a >= close_down:
            probe = close_down
        elif b <= a * (1 + _CLOSE * res):  # the estimates agree: just below, then just above
            probe = a / (1 + _NEAR * res)
            if probe <= lo.rate * (1 + _NEAR * res / 2):
                probe = close_up
        else:  # they disagree: the truth lies between them when the curvature keeps its sign
            probe = math.sqrt(a * b)
        if not lo.rate * (1 + _REL_EPS) < probe < hi.rate * (1 - _REL_EPS):
            return self._on_grid(bisect, lo, hi, "bisect")
        return self._on_grid(probe, lo, hi, kind)

    def _on_grid(self, probe: float, lo: _Edge, hi: _Edge, kind: _Kind) -> _Plan:
        """``probe`` moved onto the quantum grid, strictly inside the bracket."""
        if self.quantum is not None:
            probe = self._round(probe, "nearest")
            if probe <= lo.rate * (1 + _REL_EPS):
                probe = lo.rate + self.quantum
            if probe >= hi.rate * (1 - _REL_EPS):
                probe = hi.rate - self.quantum
        return _Plan(probe, None, kind)

    def _round(self, rate: float, how: Literal["up", "down", "nearest"]) -> float:
        """``rate`` on the quantum grid (at least one quantum); unchanged without a quantum."""
        if self.quantum is None:
            return rate
        steps = rate / self.quantum
        if how == "up":
            n = math.ceil(steps - _REL_EPS)
        elif how == "down":
            n = math.floor(steps + _REL_EPS)
        else:
            n = round(steps)
        return max(1, n) * self.quantum


def _crossing(lo: _Edge, hi: _Edge) -> float | None:
    """Where the line through the edges' margins crosses zero, clamped to the bracket."""
    if lo.margin is None or hi.margin is None:
        return None
    if not (math.isfinite(lo.margin) and math.isfinite(hi.margin) and hi.margin > lo.margin):
        return None
    x = lo.rate + (hi.rate - lo.rate) * (0.0 - lo.margin) / (hi.margin - lo.margin)
    return min(max(x, lo.rate), hi.rate)
