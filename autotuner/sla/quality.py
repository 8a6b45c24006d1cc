"""The SLA's ``quality:`` section: the limits of the quality gate a lossy config must pass
before it is promoted (:mod:`autotuner.measure.quality` measures against them)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class Limits:
    """The limits as plain numbers, what :mod:`autotuner.measure.quality` judges against."""

    min_token_agreement: float
    max_mean_kl: float


class QualitySpec(BaseModel):
    """How far a lossy config's greedy outputs may be from the lossless baseline's.

    Defaults suit an 8-bit setting on a real model (fp8 weights or KV cache keep the greedy
    token in about 98-99 % of positions and a mean top-k KL near 0.01 nats).
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    prompts: int = Field(default=16, ge=1, le=1000)  # the dataset's first N, else built-in
    max_tokens: int = Field(default=32, ge=1, le=4096)  # greedy tokens per prompt
    top_logprobs: int = Field(default=5, ge=1, le=20)  # log-probabilities per position
    min_token_agreement: float = Field(default=0.95, ge=0, le=1)
    max_mean_kl: float = Field(default=0.05, ge=0, le=100)  # nats per compared position
    # Promote a lossy config whose quality could not be measured (dummy weights)? Only when
    # the SLA says so here.
    promote_unmeasured: bool = False

    @property
    def limits(self) -> Limits:
        return Limits(self.min_token_agreement, self.max_mean_kl)
