"""Search strategy declared with a parameter, resolved: where the warm start looks first
(priors), which values are never worth a launch (hopeless), which moves never help (monotone),
and the measured quantities and capacity bounds they may name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotuner.space.conditions import Condition
from autotuner.space.values import Device, ParamValue

# Quantities the baseline's launch measures, which priors (``near``) and hopeless conditions
# (``below``) may name; :mod:`autotuner.search.priors` computes them.
# ``concurrency``: the baseline's, at the SLA's own load; ``capacity_concurrency``: the
# incumbent's (the best config so far), at its capacity (issue 28: the load that matters).
MEASURED: frozenset[str] = frozenset({"concurrency", "capacity_concurrency"})
# What can bound a launch's capacity: the first miss above it (``search.priors``): a latency
# kind, the peak memory, the error rate, or the engine not keeping up with the rate sent.
BINDING: frozenset[str] = frozenset(
    {"ttft", "tpot", "itl", "e2e", "memory", "errors", "served_rate"}
)


@dataclass(frozen=True)
class Prior:
    """Where the warm start looks first for one parameter (evaluated by ``search.priors``).

    ``rank`` orders the parameters (1 first); ``first`` are values to try, in order;
    ``near`` names a quantity the baseline measured (``concurrency``) whose multiples by
    ``times`` are tried instead when it was measured.
    """

    rank: int
    first: tuple[ParamValue, ...] = ()
    near: str | None = None
    times: tuple[float, ...] = ()
    by_limit: tuple[ByLimit, ...] = ()  # directions by the limit that bounded the incumbent


@dataclass(frozen=True)
class ByLimit:
    """A prior's direction when the incumbent's capacity was bounded by one of ``limits``
    (:data:`BINDING`): its ``first`` values, or ``times`` on the prior's ``near``; ``why``."""

    limits: tuple[str, ...]
    first: tuple[ParamValue, ...]
    times: tuple[float, ...]
    why: str


@dataclass(frozen=True)
class Hopeless:
    """When a value of ``param`` is not worth a launch for an SLA, and ``why``.

    Every field given must hold (evaluated by ``search.priors``): the value is in ``values``
    or below ``below`` (a number, or a measured quantity times ``times``); the other params
    match ``with_``; the target is ``device``; the SLA's first objective is of the
    ``objective`` kind and none of ``unless_objective``; the SLA limits one of ``limited``.
    """

    param: str
    why: str
    values: tuple[ParamValue, ...] | None = None
    below: float | str | None = None
    times: float = 1.0
    with_: tuple[Condition, ...] = ()
    device: Device | None = None
    objective: str | None = None
    unless_objective: tuple[str, ...] = ()
    limited: tuple[str, ...] = ()


@dataclass(frozen=True)
class Monotone:
    """All else equal, moving ``param`` the ``worse`` way (``higher`` or ``lower``) never
    brings a quantity under one of ``limits`` (latency kinds or constraint metrics) at the
    same load: after a miss there, such a move is hopeless (``search.misses``)."""

    param: str
    limits: tuple[str, ...]
    worse: Literal["higher", "lower"]
    why: str
