"""The SLA's ``model:`` section: a local model directory or a generated architecture."""

from __future__ import annotations

import re

from pydantic import field_validator, model_validator

from autotuner.sla.base import Strict, fail, suggest

_SYNTH_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*\Z")


class ModelSpec(Strict):
    """Exactly one of ``path`` (a local HF-style directory) or ``synth`` (a generated arch)."""

    path: str | None = None
    synth: str | None = None
    served_name: str | None = None

    @field_validator("synth")
    @classmethod
    def _synth_name(cls, v: str | None) -> str | None:
        if v is not None and not _SYNTH_RE.match(v):
            raise fail(
                f"must be lower-case letters, digits, '.' and '-' (e.g. tiny-llama), got {v!r}"
            )
        return v

    @field_validator("path", "served_name")
    @classmethod
    def _not_empty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise fail("must not be empty")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.path is None) == (self.synth is None):
            raise fail("give exactly one of 'path' or 'synth'")
        from autotuner.models.synth import ARCHS

        if self.synth is not None and self.synth not in ARCHS:
            v, known = self.synth, ", ".join(ARCHS)
            raise fail(
                f"unknown architecture {v!r}{suggest(v, list(ARCHS))}; known: {known}", "synth"
            )
        return self
