"""Profile one config of an SLA under the engine's own profiler, as ``tune.profile`` does for
the promoted config, and print where the time went by kernel class and step phase.

    python3 benchmarks/kernel_profile.py SLA.yaml --out DIR [--set NAME=VALUE ...]
        [--requests N] [--python PATH]

One launch (the SLA's engine and params, ``--set`` on top), the SLA's warm-up, then a window
of ``--requests`` at the SLA's own load between ``/start_profile`` and ``/stop_profile``.
DIR gets ``engine.log``, ``traces/``, ``kernel_breakdown.json``, ``kernel_breakdown.csv`` and
``kernel_breakdown.svg`` (the panel ``latency_breakdown.svg`` carries in a bundle).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from autotuner.bundle.report import latency_breakdown_svg
from autotuner.core.types import ParamValue
from autotuner.engines import envs, registry
from autotuner.measure.kernel_profile import ProfileWindow, profile_config
from autotuner.measure.kernels import ALL, CLASS_LABELS, CLASSES, breakdown_csv
from autotuner.measure.launch import engine_params, resolve_model
from autotuner.sla.spec import load_sla


def _value(text: str) -> ParamValue:
    value = yaml.safe_load(text)
    return value if isinstance(value, bool | int | float | str) or value is None else text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("sla", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--requests", type=int, default=ProfileWindow.requests)
    ap.add_argument("--python", type=Path, help="engine interpreter (default: the SLA's)")
    args = ap.parse_args()
    sla = load_sla(args.sla)
    adapter = registry.get(sla.engine.kind)
    model_dir = resolve_model(sla, print)
    if args.python:
        python = args.python
    else:
        python, _ = envs.resolve_python(sla.engine.name, sla.engine.python, sla.engine.kind)
    dist, version = envs.probe_version(python)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    params = engine_params(
        sla, model_dir, {k: _value(v) for k, v in overrides.items()}, engine=adapter
    )
    print(f"engine: {dist} {version}; params {params}")
    started = time.monotonic()
    b = profile_config(
        params,
        sla,
        engine=adapter,
        python=python,
        version=version,
        model_dir=model_dir,
        run_dir=args.out,
        cuda_devices=None,
        window=ProfileWindow(requests=args.requests),
    )
    label = f"{sla.name}: {', '.join(f'{k}={v}' for k, v in overrides.items()) or 'as in the SLA'}"
    (args.out / "kernel_breakdown.csv").write_text(breakdown_csv([(label, b)]))
    (args.out / "kernel_breakdown.svg").write_text(latency_breakdown_svg([], kernels=[(label, b)]))
    print(f"profiled in {time.monotonic() - started:.0f} s: {b.summary()}")
    print(f"window {b.window_s:.1f} s, {b.traces} trace(s), steps {dict(b.steps)}")
    phases = [ALL, *b.phases()]
    print(f"{'class':28}" + "".join(f"{p:>16}" for p in phases))
    for cls in CLASSES:
        if b.time_us(cls) <= 0:
            continue
        cells = "".join(
            f"{b.time_us(cls, p) / 1000:9.1f} ms {b.share(cls, p) * 100:3.0f}%" for p in phases
        )
        print(f"{CLASS_LABELS[cls]:28}{cells}")
    for r in b.rows:
        if r.phase == ALL and r.top:
            names = "; ".join(f"{n[:70]} {us / 1000:.1f} ms" for n, us in r.top)
            print(f"  {CLASS_LABELS[r.kernel_class]}: {names}")


if __name__ == "__main__":
    main()
