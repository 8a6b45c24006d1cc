"""Stand-in Ray task bodies for tests of the Ray executor's plumbing (no engine).

They live in the package so that Ray workers can import them by name.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from pathlib import Path

from autotuner.core.types import ParamValue
from autotuner.engines.base import EngineAdapter
from autotuner.search.trial import Level, SearchSettings, TrialResult
from autotuner.sla.spec import Sla


def fake_trial(
    sla: Sla,
    python: str,
    model_dir: str,
    params: dict[str, ParamValue],
    settings: SearchSettings,
    gpu: bool,
    adapter: EngineAdapter,
) -> tuple[TrialResult, bytes]:
    """Writes an engine log on the worker and returns a result whose numbers come from the
    params; ``max_num_seqs: 0`` kills the worker process instead (a lost worker)."""
    if params.get("max_num_seqs") == 0:
        os._exit(1)
    value = params.get("max_num_seqs")
    seqs = value if isinstance(value, int) else 16
    level = Level(
        settings.start_load or 1.0,
        True,
        {"goodput": float(seqs), "p99_ttft_ms": 100.0 / seqs},
        {"p99_ttft_ms": -0.5},
        {},
        {},
        "level-0.json",
    )
    result = TrialResult(
        dict(params), "complete", "rate", (level,), 0, extra={"worker_pid": os.getpid()}
    )
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        (run_dir / "engine.log").write_text(f"worker {os.getpid()} ran {params}\n")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(run_dir, arcname=".")
    return result, buf.getvalue()
