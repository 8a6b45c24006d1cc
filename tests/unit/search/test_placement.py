"""Where launches ran: read from trial.json files, checked for overlaps and GPU counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotuner.engines import registry
from autotuner.search import placement

ROLES = registry.get("vllm").roles  # which params are the layout's

A, B = "GPU-aaaa", "GPU-bbbb"


def _trial(study: Path, name: str, span: tuple[float, float], seen: list[str], **kw: Any) -> None:
    extra: dict[str, Any] = {
        "executor": "ray",
        "node": kw.get("node", "10.0.0.1"),
        "gpu_uuids": kw.get("assigned", seen),
        "started_at": span[0],
        "ended_at": span[1],
    }
    if seen:
        extra["engine_gpus"] = {u: 40 << 30 for u in seen}
    d = study / name
    d.mkdir(parents=True)
    data = {
        "params": kw.get("params", {}),
        "status": kw.get("status", "complete"),
        "load_kind": "rate",
        "extra": extra,
    }
    (d / "trial.json").write_text(json.dumps(data))


def test_two_launches_side_by_side_and_a_two_gpu_candidate(tmp_path: Path) -> None:
    _trial(tmp_path, "trial-000", (100, 250), [A])
    _trial(tmp_path, "trial-001", (101, 240), [B])
    _trial(tmp_path, "trial-002", (260, 400), [A, B], params={"tensor_parallel_size": 2})
    (tmp_path / "trial-003").mkdir()  # interrupted before it wrote anything: skipped
    ps = placement.load(tmp_path, ROLES)
    assert [p.name for p in ps] == ["trial-000", "trial-001", "trial-002"]
    assert ps[2].needed == 2 and ps[2].gpus == (A, B)
    pairs = placement.side_by_side(ps)
    assert [(a.name, b.name) for a, b in pairs] == [("trial-000", "trial-001")]
    assert placement.problems(ps) == []
    text = placement.render(ps)
    assert "side by side on different GPUs: 1 pair(s)" in text
    assert "gpu0 = GPU-aaaa" in text and "problem" not in text


def test_contradictions_are_named(tmp_path: Path) -> None:
    _trial(tmp_path, "trial-000", (0, 100), [A])
    _trial(tmp_path, "trial-001", (50, 150), [A], assigned=[B])  # NVML disagrees with Ray
    _trial(tmp_path, "trial-002", (200, 300), [A], params={"tensor_parallel_size": 2})
    msgs = placement.problems(placement.load(tmp_path, ROLES))
    assert msgs == [
        "trial-001: the engine used GPUs it was not given (GPU-aaaa)",
        "trial-002: needs 2 GPUs, ran on 1",
        "trial-000 and trial-001 ran at the same time on GPU-aaaa",
    ]
    assert placement.side_by_side(placement.load(tmp_path, ROLES)) == []


def test_nvml_without_pids_falls_back_to_the_assignment(tmp_path: Path) -> None:
    _trial(tmp_path, "trial-000", (0, 100), [], assigned=[A])
    _trial(tmp_path, "trial-001", (10, 90), [], assigned=[B], node="10.0.0.2")
    ps = placement.load(tmp_path, ROLES)
    assert ps[0].gpus == (A,) and ps[0].seen == ()
    assert len(placement.side_by_side(ps)) == 1 and placement.problems(ps) == []
