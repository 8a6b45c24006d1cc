"""``autotuner-synth.json``: the marker a generated model directory carries.

Written last by the generator, so its presence means every file it lists was written; read
back to decide whether a directory already holds the model asked for (and to refuse to
overwrite a directory that is not a generated model). ``format_version`` is the version of
the generated files (bumped when generation changes); ``schema_version`` that of this record.
"""

from __future__ import annotations

from autotuner.records.base import Record


class SynthMarker(Record):
    KIND = "synthetic model marker"

    arch: str | None = None
    format_version: int | None = None
    seed: int | None = None
    has_weights: bool | None = None
    params: int | None = None  # parameter count
    files: list[str] | None = None  # every file of the model, relative to its directory
