"""The SLA file: what to serve, on what, under which load, and what "good" means.

Users write YAML (see ``objectives/README.md``); ``load_sla`` turns it into a validated ``Sla``
or raises ``SlaError`` listing every problem at once, each with its line number, dotted field
path and a message meant for humans::

    slo.yaml:12: constraints.p99_ttf_ms: unknown key (did you mean 'p99_ttft_ms'?)

The schema is one module per section of the file (``model_spec``, ``engine_spec``, ``target``,
``workload``, ``constraints``, ``tuning``, ``quality``), joined by ``document.Sla``; metric names
are ``metrics``, the bounds of the numbers ``bounds``. This module reads and writes the file and
re-exports the names the rest of the tuner imports from here.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autotuner.core.yamlpos import load_located
from autotuner.sla.base import HINTS, show
from autotuner.sla.bounds import MAX_GRID_POINTS, MAX_SLA_BYTES
from autotuner.sla.constraints import Constraint, Objective
from autotuner.sla.costs import grid_points, percentile_requests
from autotuner.sla.document import Sla, level_requests
from autotuner.sla.engine_spec import EngineSpec
from autotuner.sla.files import context_limit, missing_files
from autotuner.sla.metrics import (
    PERCENTILE_METRIC_RE,
    SCALAR_METRICS,
    canonical_metric,
    is_known_metric,
    parse_percentile_metric,
)
from autotuner.sla.model_spec import ModelSpec
from autotuner.sla.problems import Problem, SlaError, dotted, problems_from_validation
from autotuner.sla.target import Target
from autotuner.sla.tuning import ConfirmSpec, TuneSpec, WarmupSpec
from autotuner.sla.workload import (
    ConcurrencyArrival,
    LognormalDist,
    PoissonArrival,
    UniformDist,
    Workload,
)

__all__ = [
    "MAX_GRID_POINTS",
    "PERCENTILE_METRIC_RE",
    "SCALAR_METRICS",
    "ConcurrencyArrival",
    "ConfirmSpec",
    "Constraint",
    "EngineSpec",
    "LognormalDist",
    "ModelSpec",
    "Objective",
    "PoissonArrival",
    "Problem",
    "Sla",
    "SlaError",
    "Target",
    "TuneSpec",
    "UniformDist",
    "WarmupSpec",
    "Workload",
    "canonical_metric",
    "context_limit",
    "grid_points",
    "is_known_metric",
    "level_requests",
    "load_sla",
    "parse_percentile_metric",
    "parse_sla",
    "percentile_requests",
    "to_yaml",
]


def _default_name(source: str) -> str:
    if source.startswith("<"):
        return "sla"
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(source).stem).lstrip("_.-")
    return stem or "sla"


def _yaml_problem(exc: yaml.YAMLError) -> Problem:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        detail = exc.problem or "malformed YAML"
        if exc.context:
            detail = f"{detail} ({exc.context})"
        return Problem(mark.line + 1 if mark else None, "", f"invalid YAML: {detail}")
    return Problem(None, "", f"invalid YAML: {exc}")


def parse_sla(
    text: str,
    source: str = "<string>",
    base_dir: Path | None = None,
    *,
    check_files: bool = False,
) -> Sla:
    """Validate SLA text; raise ``SlaError`` with every problem found.

    ``source`` labels messages and gives the default ``name`` (its stem); ``base_dir`` is where
    relative paths resolve. With ``check_files``, ``model.path`` and ``workload.dataset`` must
    exist on disk (``load_sla`` turns this on).
    """
    try:
        located = load_located(text)
    except yaml.YAMLError as exc:
        raise SlaError([_yaml_problem(exc)], source) from None
    except ValueError as exc:  # an integer of thousands of digits: Python refuses to convert it
        problem = Problem(None, "", f"a value can't be read: {_short(exc)}")
        raise SlaError([problem], source) from None
    data = located.data
    if data is None:
        raise SlaError(
            [Problem(None, "", "file is empty (expected a mapping: model, workload, ...)")], source
        )
    if not isinstance(data, dict):
        problem = Problem(
            located.root_line, "", f"top level must be a mapping of SLA fields, got {show(data)}"
        )
        raise SlaError([problem], source)

    problems = [
        Problem(d.line, dotted(d.path), f"duplicate key (first given on line {d.first_line})")
        for d in located.duplicates
    ]
    data.setdefault("name", _default_name(source))
    hints: dict[int, tuple[str, ...]] = {}
    sla: Sla | None = None
    try:
        sla = Sla.model_validate(data, context={HINTS: hints})
    except ValidationError as exc:
        problems += problems_from_validation(exc, located, hints)
    if sla is not None:
        sla._base_dir = base_dir
        if check_files:
            problems += missing_files(sla, located)
    if problems or sla is None:
        problems.sort(key=lambda p: p.line or 0)
        raise SlaError(problems, source)
    return sla


def _short(exc: ValueError) -> str:
    text = str(exc)
    if "integer string conversion" in text:  # Python's hint (set_int_max_str_digits) is not ours
        return f"an integer of more than {sys.get_int_max_str_digits()} digits"
    return text if len(text) <= 200 else text[:200] + "..."


def _read_sla_text(file: Path) -> str:
    """The file's text, read without blocking (a FIFO is refused, not waited on) and at most
    :data:`MAX_SLA_BYTES` of it (a device like /dev/zero is refused before any read)."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(file)
        if not stat.S_ISREG(mode):
            raise _NotAFile(file)
        data = f.read(MAX_SLA_BYTES + 1)
    if len(data) > MAX_SLA_BYTES:
        raise _TooLarge(file)
    return data.decode("utf-8")


class _NotAFile(OSError):
    pass


class _TooLarge(OSError):
    pass


def load_sla(path: str | Path) -> Sla:
    """Read and validate an SLA file; every failure (I/O included) is an ``SlaError``."""
    source = str(path)
    file = Path(path).expanduser()
    try:
        text = _read_sla_text(file)
    except _NotAFile:
        why = "is not a regular file (a FIFO, a device); give an SLA file"
        raise SlaError([Problem(None, "", why)], source) from None
    except _TooLarge:
        why = f"is over {MAX_SLA_BYTES} bytes, too large for an SLA file"
        raise SlaError([Problem(None, "", why)], source) from None
    except FileNotFoundError:
        raise SlaError([Problem(None, "", "no such file")], source) from None
    except IsADirectoryError:
        raise SlaError([Problem(None, "", "is a directory, not an SLA file")], source) from None
    except UnicodeDecodeError:
        raise SlaError([Problem(None, "", "not UTF-8 text")], source) from None
    except OSError as exc:
        raise SlaError([Problem(None, "", f"cannot read: {exc.strerror or exc}")], source) from None
    sla = parse_sla(text, source, file.parent.resolve(), check_files=True)
    sla.source_path = file.resolve()
    return sla


def to_yaml(sla: Sla) -> str:
    """The SLA in the form users write; ``parse_sla(to_yaml(s))`` equals ``s`` field for field."""
    doc: dict[str, Any] = {
        "name": sla.name,
        "model": sla.model.model_dump(exclude_none=True),
        "engine": sla.engine.model_dump(exclude_none=True),
        "target": sla.target.to_yaml_value(),
        "workload": sla.workload.model_dump(exclude_none=True),
        "constraints": {c.key: c.limit for c in sla.constraints},
        "objectives": [{o.direction: o.metric} for o in sla.objectives],
        "search": sla.search.model_dump(exclude_defaults=True),
        "tune": sla.tune.model_dump(exclude_defaults=True),
    }
    quality = sla.quality.model_dump(exclude_defaults=True)
    if quality:  # absent when default, so older SLAs dump as before
        doc["quality"] = quality
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=False)
