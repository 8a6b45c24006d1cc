"""The SLA's ``tune:`` section: the study's budget and strategy, warm-up and confirmation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from autotuner.sla.base import Strict, fail
from autotuner.sla.bounds import MAX_LEVEL_REQUESTS, MAX_WARMUP_REQUESTS


class WarmupSpec(Strict):
    """Warm-up to steady state before a launch's first measured level: load at that level's
    own rate until the median TPOT and TTFT of a window of requests stop falling
    (:mod:`autotuner.measure.steady` states the rule), at most ``max_requests`` requests and
    ``max_s`` seconds; ``workload.warmup_requests`` is its floor."""

    max_requests: int = Field(default=200, ge=0, le=MAX_WARMUP_REQUESTS)  # 0: off
    max_s: float = Field(default=60.0, gt=0, le=3600.0)
    window: int = Field(default=25, ge=5, le=500)  # requests per compared window
    tolerance: float = Field(default=0.10, ge=0, lt=1)  # a fall beyond this is not steady


class ConfirmSpec(Strict):
    """How the winner is confirmed against the baseline before it is promoted."""

    candidates: int = Field(default=1, ge=1, le=5)  # top Pareto points re-measured
    replicates: int = Field(default=3, ge=1, le=10)  # launches per config, interleaved
    min_effect: float = Field(default=0.05, ge=0, lt=1)  # relative capacity win required


# What a study on a GPU target may spend when its SLA sets no tune.budget_gpu_minutes: the
# default 12 launches of a one-GPU study at about 3-5 GPU-minutes each (engine start and 4-8
# load levels on an H200), with room for a slower start.
DEFAULT_GPU_MINUTES = 60.0


class TuneSpec(Strict):
    """Budget and strategy of ``autotuner tune``."""

    trials: int = Field(default=12, ge=1, le=10_000)  # engine launches, baseline included
    time_budget_s: float | None = Field(default=None, gt=0, le=365 * 24 * 3600.0)
    # GPU-minutes the search may spend (devices x wall time of its launches); the search stops
    # before a launch that would pass it and says what it would do with more. null: the
    # default on a GPU target (DEFAULT_GPU_MINUTES), none on a CPU target.
    budget_gpu_minutes: float | None = Field(default=None, gt=0, le=1_000_000.0)
    # grid: every combination of the `values` lists in search.params (vLLM auto_tune style)
    sampler: Literal["auto", "tpe", "gp", "nsga2", "random", "grid"] = "auto"
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    max_levels: int = Field(default=8, ge=1, le=16)  # load levels measured per launch
    rate_step: float = Field(default=1.5, gt=1, le=4)  # load factor between levels
    # A launch's capacity search stops once its bracket is this narrow (relative).
    capacity_resolution: float = Field(default=0.03, gt=0, lt=0.5)
    # Stop the search once the last `patience` launches raised the best capacity by less than
    # capacity_resolution (search.stopping); null: spend the whole budget. Grids run whole.
    patience: int | None = Field(default=4, ge=1, le=1000)
    # Per-level confidence of a percentile verdict (meets / misses / undecided).
    confidence: float = Field(default=0.95, ge=0.5, le=0.999)
    # Levels grow to the requests their percentile needs, up to this many.
    max_requests_per_level: int = Field(default=600, ge=1, le=MAX_LEVEL_REQUESTS)
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec)
    warmup: WarmupSpec = Field(default_factory=WarmupSpec)
    # Profile the promoted config and the baseline with the engine's own profiler (one more
    # launch each, after the search) for the bundle's kernel breakdown; null: on for GPUs.
    profile: bool | None = None
    storage: str | None = None  # SQLAlchemy URL; default: SQLite in the study directory

    def gpu_minutes(self, target_kind: str) -> float | None:
        """The search's GPU-minute budget on a target of this kind (None: no limit)."""
        if self.budget_gpu_minutes is not None:
            return self.budget_gpu_minutes
        return DEFAULT_GPU_MINUTES if target_kind == "gpu" else None

    @field_validator("storage")
    @classmethod
    def _storage_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from sqlalchemy.engine import make_url  # Optuna's dependency; only needed here
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(v)
        except ArgumentError:
            raise fail(
                f"not a database URL: {v!r} (e.g. sqlite:///study.db, postgresql://host/db)"
            ) from None
        return v
