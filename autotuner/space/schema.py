"""The schema of a space file (``search_spaces/<engine>.yaml``, described in that folder's
README), as pydantic models. Private to the package: the rest of the tuner sees the resolved
space. The class names show in pydantic's messages, so they stay as they are."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autotuner.space.values import Device, ParamType, ParamValue


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Requirement(_Strict):
    values: list[ParamValue] | None = None  # None: every value of the parameter
    compute_capability: str | None = None  # GPU: at least "8.9"
    cpu_flags_any: list[str] | None = None  # CPU engine: one of these /proc/cpuinfo flags
    at_most_gpus: bool = False  # value <= number of GPUs of the target


class _Not(_Strict):
    not_: list[ParamValue] = Field(alias="not")


class _ByLimit(_Strict):
    """A prior's direction when the incumbent's capacity was bounded by one of ``limits``."""

    limits: list[str]  # names of BINDING
    first: list[ParamValue] = Field(default_factory=list)  # values to try, in order
    times: list[float] = Field(default_factory=list)  # ... or factors on the prior's ``near``
    why: str


class _Prior(_Strict):
    """Where the warm start looks first (``prior:``); see the folder's README."""

    rank: int | None = Field(default=None, ge=1)  # warm-start order: 1 = most influential
    first: list[ParamValue] = Field(default_factory=list)  # values to try first, in order
    near: str | None = None  # ... or around a quantity the baseline measured
    times: list[float] = Field(default_factory=list)  # ... times these factors
    # ... or, when the incumbent's capacity was bounded by one of a rule's limits, its values
    by_limit: list[_ByLimit] = Field(default_factory=list)


class _Hopeless(_Strict):
    """Values never worth a launch for some SLAs (``hopeless_when:``); see the README."""

    values: list[ParamValue] | None = None  # the parameter's value is one of these ...
    below: int | float | str | None = None  # ... or below a number or a measured quantity
    times: float = 1.0  # factor on a measured ``below``
    with_: dict[str, list[ParamValue] | _Not] = Field(default_factory=dict, alias="with")
    device: Device | None = None  # only on this device
    objective: Literal["throughput", "latency"] | None = None  # only for this first objective
    unless_objective: list[str] = Field(default_factory=list)  # not when one is an objective
    limited: list[str] = Field(default_factory=list)  # only when the SLA limits one of these
    why: str


class _Monotone(_Strict):
    """Which way the value worsens a limited quantity, all else equal (``monotone:``)."""

    limits: list[str]  # latency kinds (ttft, tpot, itl, e2e) or constraint metrics
    worse: Literal["higher", "lower"]
    why: str


class _Variant(_Strict):
    """Per-device changes to a declaration (``per_device: {cpu: {...}}``)."""

    low: int | float | None = None
    high: int | float | None = None
    log: bool | None = None
    step: int | float | None = None
    choices: list[ParamValue] | None = None
    fixed: ParamValue = None  # pinned on this device unless the SLA says otherwise
    prior: _Prior | None = None  # replaces the declaration's prior on this device


class _Limits(_Strict):
    """What the engine accepts for a number (inclusive; None: open): a fixed value, a
    widened range or a listed value must stay inside, wider than the search range."""

    low: int | float | None = None
    high: int | float | None = None


class _Decl(_Strict):
    name: str
    type: ParamType
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: list[ParamValue] | None = None
    default: ParamValue = None
    versions: str = ""
    devices: Literal["cpu", "gpu", "both"] = "both"
    per_device: dict[Device, _Variant] = Field(default_factory=dict)
    requires: list[_Requirement] = Field(default_factory=list)
    lossy: bool | list[ParamValue] = False
    when: dict[str, list[ParamValue] | _Not] = Field(default_factory=dict)
    superseded_by: str | None = None
    search: bool = True
    limits: _Limits | None = None
    why: str = ""
    prior: _Prior | None = None
    hopeless_when: list[_Hopeless] = Field(default_factory=list)
    monotone: list[_Monotone] = Field(default_factory=list)


class _File(_Strict):
    engine: str
    format: Literal[1]
    versions: str = ""
    params: list[_Decl]
