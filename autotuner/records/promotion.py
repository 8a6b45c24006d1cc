"""The promotion in force: what a tune promoted, as the command line and the daemon read it.

Built from the bundle's manifest (:meth:`Promotion.from_manifest`); the daemon adds which of
its engines the tune ran on, where the bundle lies and when it was recorded, and keeps it as
a JSON object in ``daemon.db``. :meth:`Promotion.from_json` reads such an object back as
hostile input: every field's type is checked, and a row that is not a promotion is refused
with a :class:`~autotuner.records.base.RecordError` that says which field is wrong. Rows
written before this record (plain dicts with the same keys) load unchanged; their
``goodput_spread`` key, always None, is ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autotuner.core.types import ParamValue
from autotuner.records.base import RecordError
from autotuner.records.manifest import Confirmation, Manifest, Measurements, Spread

# Keys older daemons wrote that this record no longer carries: read and ignored.
_RETIRED = frozenset({"goodput_spread"})


@dataclass(frozen=True)
class Promotion:
    """One promoted config and what confirmed it."""

    label: str | None  # "baseline" or "trial-<n>"
    params: dict[str, ParamValue] = field(default_factory=dict)  # every engine param
    meets_sla: bool = False  # confirmed to meet the SLA (a kept baseline may not)
    # Goodput at capacity: the confirmation replicates' mean, else the search's single run.
    goodput: float | None = None
    load: float | None = None  # a load it met the SLA at in every replicate (None: no replicates)
    engine_version: str | None = None
    manifest_created: str | None = None  # when the bundle's manifest was written
    engine: str | None = None  # the daemon's engine the tune ran on (None outside the daemon)
    bundle: str | None = None  # the bundle's directory, where the daemon recorded one
    time: float | None = None  # Unix time the daemon recorded it

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest,
        *,
        engine: str | None = None,
        bundle: str | None = None,
        time: float | None = None,
    ) -> Promotion | None:
        """The promotion ``manifest`` records; None when it promoted nothing."""
        promoted = manifest.promoted
        if promoted is None:
            return None
        measurements = manifest.measurements or Measurements()
        confirmation = measurements.confirmation or Confirmation()
        goodput = confirmation.spread.get(str(promoted.label), {}).get("goodput", Spread()).mean
        if goodput is None and measurements.search is not None:
            goodput = (measurements.search.at_sla_load or {}).get("goodput")
        return cls(
            label=promoted.label,
            params=dict(promoted.params),
            meets_sla=promoted.meets_sla,
            goodput=goodput,
            load=confirmation.load,
            engine_version=manifest.provenance.engine_version if manifest.provenance else None,
            manifest_created=manifest.created,
            engine=engine,
            bundle=bundle,
            time=time,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object :meth:`from_json` reads back."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: object, where: str = "promotion") -> Promotion:
        """Read a stored promotion; RecordError (naming ``where`` and the field) unless
        ``data`` is a JSON object with this record's fields, each of its type."""
        if not isinstance(data, Mapping):
            raise RecordError(f"{where}: a JSON object was expected, found {type(data).__name__}")
        unknown = sorted(str(k) for k in data if k not in _FIELDS and k not in _RETIRED)
        if unknown:
            raise RecordError(f"{where}: unknown field(s) {', '.join(unknown)}")
        if "meets_sla" not in data:
            raise RecordError(f"{where}: meets_sla is missing")
        return cls(
            label=_text(data, "label", where),
            params=_params(data.get("params", {}), where),
            meets_sla=_flag(data, "meets_sla", where),
            goodput=_number(data, "goodput", where),
            load=_number(data, "load", where),
            engine_version=_text(data, "engine_version", where),
            manifest_created=_text(data, "manifest_created", where),
            engine=_text(data, "engine", where),
            bundle=_text(data, "bundle", where),
            time=_number(data, "time", where),
        )


_FIELDS = frozenset(Promotion.__dataclass_fields__)


def _text(data: Mapping[Any, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise RecordError(f"{where}: {key} must be text, found {type(value).__name__}")
    return value


def _flag(data: Mapping[Any, Any], key: str, where: str) -> bool:
    value = data.get(key)
    if not isinstance(value, bool):
        raise RecordError(f"{where}: {key} must be true or false, found {type(value).__name__}")
    return value


def _number(data: Mapping[Any, Any], key: str, where: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    # bool is an int in Python; true is no goodput.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError(f"{where}: {key} must be a number, found {type(value).__name__}")
    if not math.isfinite(value):
        raise RecordError(f"{where}: {key} must be finite, found {value}")
    return float(value)


def _params(value: object, where: str) -> dict[str, ParamValue]:
    if not isinstance(value, Mapping):
        raise RecordError(f"{where}: params must be an object, found {type(value).__name__}")
    out: dict[str, ParamValue] = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise RecordError(f"{where}: params: a name must be text, found {type(k).__name__}")
        if isinstance(v, Mapping) and all(isinstance(n, str) for n in v):
            out[k] = dict(v)
        elif v is None or isinstance(v, bool | int | float | str):
            out[k] = v
        else:
            raise RecordError(f"{where}: params: {k} has a value of type {type(v).__name__}")
    return out
