"""`autotuner report STUDY`: print what a study did (trials, Pareto front, promoted config).

With ``--html FILE``, writes the study as one self-contained HTML page instead. Reads only the
study's storage and its directory; starts nothing. Exit 0, or 2 when there is no study there.
"""

from __future__ import annotations

from pathlib import Path

import optuna

from autotuner.bundle.summary import render
from autotuner.core.errors import AutotunerError, BadInput
from autotuner.engines import registry
from autotuner.engines.base import EngineAdapter
from autotuner.search.storage import check_sqlite
from autotuner.search.study import storage_url


def find_study(study: str, trials_dir: Path) -> Path:
    """A study directory from a path, an SLA file's name, or a study name."""
    p = Path(study)
    if (p / "study.db").exists() or (p / "sla.yaml").exists():
        return p
    if p.suffix in (".yaml", ".yml") and p.exists():
        from autotuner.sla.spec import load_sla

        return trials_dir / load_sla(p).name
    return trials_dir / study


def engine_of(study_dir: Path) -> EngineAdapter:
    """The adapter of the engine the study tuned: its ``sla.yaml``'s kind (the default kind
    when that file is missing or no longer reads)."""
    from autotuner.sla.spec import load_sla

    try:
        kind = load_sla(study_dir / "sla.yaml").engine.kind
    except (AutotunerError, OSError, ValueError):
        kind = registry.default_kind()
    return registry.get(kind)


def main_report(study: str, trials_dir: str, html: str | None = None) -> int:
    sdir = find_study(study, Path(trials_dir))
    db = sdir / "study.db"
    if not db.exists():
        raise BadInput(f"no study at {sdir} (looked for {db})")
    check_sqlite(storage_url(sdir, None))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    summaries = optuna.get_all_study_summaries(storage_url(sdir, None))
    if not summaries:
        raise BadInput(f"{db} holds no study")
    s = optuna.load_study(study_name=summaries[0].study_name, storage=storage_url(sdir, None))
    if html is not None:  # the study as one page (autotuner.bundle.page)
        from autotuner.bundle.page import write

        print(f"wrote {write(s, sdir, Path(html))}")
        return 0
    print(render(s, sdir, engine_of(sdir).roles))
    return 0
