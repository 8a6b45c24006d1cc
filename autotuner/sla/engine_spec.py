"""The SLA's ``engine:`` section: which engine runs the model, in which environment, with which
fixed options (checked against the allow-lists of :mod:`autotuner.sla.allowed`)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, PlainValidator, field_validator, model_validator

from autotuner.engines import registry
from autotuner.sla.base import NAME_RE, Strict, fail, fail_all, is_number, show
from autotuner.sla.bounds import MAX_STARTUP_S

_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_PARAM_RE = re.compile(r"^[a-z][a-z0-9_]*\Z")


def _cli_word(value: Any) -> str:
    # YAML turns `--max-num-seqs, 64` into a str and an int; both belong on a command line.
    if isinstance(value, str):
        return value
    if is_number(value):
        return str(value)
    raise fail(f"must be a string, got {show(value)}")


def _env_key(value: Any) -> str:
    if not isinstance(value, str) or not _ENV_RE.match(value):
        raise fail(
            f"invalid environment variable name {show(value)} "
            "(letters, digits and '_', not starting with a digit)"
        )
    return value


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        raise fail(f"must be a string, got {show(value)} (quote it: '{show(value)}')")
    if isinstance(value, str):
        return value
    if is_number(value):
        return str(value)
    raise fail(f"must be a string, got {show(value)}")


def _reserved_params() -> dict[str, str]:
    """Options the tuner sets itself (model, bind address, port), by any engine's adapter."""
    out: dict[str, str] = {}
    for adapter in registry.adapters():
        out.update(adapter.reserved_params)
    return out


def _engine_kind(value: Any) -> str:
    kinds = registry.kinds()
    if isinstance(value, str) and value in kinds:
        return value
    if len(kinds) == 1:
        raise fail(f"must be {kinds[0]!r}, got {show(value)}")
    raise fail(f"must be one of {', '.join(kinds)}, got {show(value)}")


def _param_key(value: Any) -> str:
    if not isinstance(value, str) or not _PARAM_RE.match(value):
        hint = ""
        if isinstance(value, str):
            fixed = value.strip().lstrip("-").replace("-", "_").lower()
            if _PARAM_RE.match(fixed):
                hint = f" (did you mean {fixed!r}?)"
        raise fail(f"option names are snake_case like max_num_seqs, got {show(value)}{hint}")
    reserved = _reserved_params()
    if value in reserved:
        raise fail(f"cannot be set here: {reserved[value]}")
    return value


def _param_value(value: Any) -> bool | int | float | str:
    if isinstance(value, bool | int | float | str):
        return value
    raise fail(f"must be true/false, a number or a string, got {show(value)}")


CliWord = Annotated[str, PlainValidator(_cli_word)]
EngineKind = Annotated[str, PlainValidator(_engine_kind)]
EnvKey = Annotated[str, PlainValidator(_env_key)]
EnvValue = Annotated[str, PlainValidator(_env_value)]
ParamKey = Annotated[str, PlainValidator(_param_key)]
ParamValue = Annotated[bool | int | float | str, PlainValidator(_param_value)]


class EngineSpec(Strict):
    """Which engine runs the model, and the fixed (untuned) part of its configuration.

    ``params`` are engine options in snake_case (vLLM's ``--max-num-seqs`` is ``max_num_seqs``);
    the search space tunes the others. ``name`` picks a registered engine environment,
    ``python`` an explicit interpreter; with neither, the default environment is used.
    """

    kind: EngineKind = Field(default_factory=registry.default_kind)
    name: str | None = None
    python: str | None = None
    args: list[CliWord] = Field(default_factory=list)
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict)
    params: dict[ParamKey, ParamValue] = Field(default_factory=dict)
    startup_timeout_s: float = Field(default=900.0, gt=0, le=MAX_STARTUP_S)

    @field_validator("name")
    @classmethod
    def _engine_name(cls, v: str | None) -> str | None:
        if v is not None and len(v) > 100:  # it names files, as the SLA's name does
            raise fail(f"an engine name is at most 100 characters, got {len(v)}")
        if v is not None and not NAME_RE.match(v):
            raise fail(f"not a valid engine name: {v!r}")
        return v

    @field_validator("python")
    @classmethod
    def _python_path(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise fail("must not be empty")
        return v

    @model_validator(mode="after")
    def _one_environment(self) -> EngineSpec:
        if self.name is not None and self.python is not None:
            raise fail("give at most one of 'name' or 'python'")
        return self

    @model_validator(mode="after")
    def _allowed(self) -> EngineSpec:
        # The engine runs as our user: only allow-listed options and variables reach it.
        from autotuner.sla import allowed

        problems = allowed.engine_problems(self.kind, self.params, self.args, self.env)
        if problems:
            raise fail_all(problems)
        return self

    def settings(self) -> dict[str, bool | int | float | str]:
        """The options this SLA fixes, merged: ``params``, then those ``args`` sets (the one
        merge every launch, check and deploy file uses: sla.allowed.engine_settings)."""
        from autotuner.sla import allowed

        return allowed.engine_settings(self.kind, self.params, self.args)
