"""What an SLA's ``search:`` section says about the space: per-parameter overrides and the
section's own settings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autotuner.space.values import ParamValue


class ParamOverride(BaseModel):
    """How an SLA narrows, widens, pins or removes one parameter of the space.

    YAML: ``false`` (exclude: the engine decides), ``{fixed: v}`` (always pass ``v``),
    ``{values: [...]}`` (search exactly these values), ``{low, high, log}`` (numeric range;
    any subset). ``true`` or ``{}`` changes nothing. ``{fixed: null}`` is the same as ``false``.
    Overrides also switch on parameters the file declares with ``search: false``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    fixed: ParamValue = None
    values: list[ParamValue] | None = None
    low: int | float | None = None
    high: int | float | None = None
    log: bool | None = None
    exclude: bool = False

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if data is False:
            return {"exclude": True}
        if data is True or data is None:
            return {}
        if isinstance(data, dict) and "fixed" in data and data["fixed"] is None:
            rest = {k: v for k, v in data.items() if k != "fixed"}
            return {**rest, "exclude": True}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ParamOverride:
        ranged = self.low is not None or self.high is not None or self.log is not None
        pinned = "fixed" in self.model_fields_set
        if self.exclude and (pinned or self.values is not None or ranged):
            raise ValueError("'false' (exclude) can't be combined with other settings")
        if pinned and (self.values is not None or ranged):
            raise ValueError("'fixed' can't be combined with 'values', 'low', 'high' or 'log'")
        if self.values is not None and ranged:
            raise ValueError("give either 'values' or a range ('low', 'high', 'log'), not both")
        if self.values is not None and not self.values:
            raise ValueError("'values' must not be empty")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self

    @property
    def is_fixed(self) -> bool:
        return "fixed" in self.model_fields_set

    @property
    def searches(self) -> bool:
        """Whether it asks for a search (values or a range), as opposed to pin/exclude/no-op."""
        return self.values is not None or any(
            x is not None for x in (self.low, self.high, self.log)
        )


Override = ParamOverride


class SearchSpec(BaseModel):
    """A suggested shape for the SLA's ``search:`` section (see the README)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    allow_lossy: bool = False
    # How data_parallel_size runs: the engine's own flag, N engine servers on disjoint
    # devices (replicas), or auto: the flag where the engine version has it
    # (autotuner.engines.layout).
    data_parallel: Literal["auto", "engine", "replicas"] = "auto"
    params: dict[str, ParamOverride] = Field(default_factory=dict)
    # Values of searched parameters for the baseline launch, which otherwise leaves every
    # searched option to the engine: e.g. a layout the model fits in ({tensor_parallel_size:
    # 4} for a 70B model that one GPU cannot hold).
    baseline: dict[str, ParamValue] = Field(default_factory=dict)
