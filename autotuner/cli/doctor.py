"""`autotuner doctor [SLA.yaml] [--engine NAME] [--json]`: checks before a single launch.

With an SLA: its engine environment, target GPUs and features. Without: the engine
environment ``--engine`` names, else every registered one, each on the GPUs of the machine
(a GPU build) or the CPU. Exit 0 when all is fine, 1 with warnings, 2 when a launch would
certainly fail; an SLA that does not validate is bad input (exit 2, its problems on stderr).
"""

from __future__ import annotations

import json
from pathlib import Path

from autotuner.core.errors import BadInput
from autotuner.doctor.run import diagnose, kind_of, render
from autotuner.engines import envs, registry
from autotuner.engines.base import EngineAdapter
from autotuner.records.doctor import DoctorReport
from autotuner.sla.spec import load_sla


def _adapter(kind: str | None) -> EngineAdapter:
    return registry.get(kind) if kind is not None else registry.default()


def main_doctor(sla_path: str | None, engine: str | None, trials_dir: str, as_json: bool) -> int:
    reports: list[DoctorReport]
    if sla_path is not None and engine is not None:
        raise BadInput("give an SLA file or --engine, not both (the SLA names its engine)")
    if sla_path is not None:
        sla = load_sla(sla_path)  # SlaError: bad input, exit 2
        adapter = _adapter(kind_of(sla, None))
        reports = [diagnose(sla, subject=sla_path, adapter=adapter, trials_dir=Path(trials_dir))]
    elif engine is not None:
        adapter = _adapter(kind_of(None, engine))
        reports = [diagnose(None, subject=f"engine {engine}", adapter=adapter, engine=engine)]
    else:
        names: list[str | None] = [e.name for e in envs.list_envs()] or [None]
        reports = [
            diagnose(
                None,
                subject=f"engine {n}" if n else "the default engine",
                adapter=_adapter(kind_of(None, n)),
                engine=n,
            )
            for n in names
        ]
    code = max(r.exit_code for r in reports)
    if as_json:
        if len(reports) == 1:
            print(reports[0].to_json())
        else:
            docs = [json.loads(r.to_json()) for r in reports]
            print(json.dumps({"exit_code": code, "reports": docs}, indent=2))
    else:
        print("\n\n".join(render(r) for r in reports))
    return code
