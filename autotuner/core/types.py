"""Types shared by every stage of the pipeline, and owned by none of them.

Engine options travel from the SLA through the search space, the study, the trial and the
bundle to the engine adapter, which alone knows how to turn them into a command line. The
names here are the vocabulary those stages share; nothing engine-specific lives here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

ParamValue = bool | int | float | str | dict[str, object] | None
"""One engine option's value, as the SLA, the search space and the study hand it on.

``True``/``False`` are switches, ``None`` leaves the option to the engine, a mapping is a
structured option (the adapter decides how to pass it, e.g. as JSON).
"""

Params = Mapping[str, ParamValue]
"""Engine options by name, in snake_case (the adapter maps names to its own flags)."""

Device = Literal["cpu", "gpu"]
"""What an engine runs on; engine defaults and rules differ per device."""


def same_value(a: object, b: object) -> bool:
    """Equality of option values that keeps ``True`` apart from ``1`` (and ``False`` from
    ``0``): YAML and Optuna both distinguish them, Python's ``==`` does not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)
