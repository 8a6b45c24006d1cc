"""The stand-in engine's server entry point: ``python -m tests.unit.engines.standin_engine.serve``.

:mod:`autotuner.testing.standin` always binds 127.0.0.1 but has no ``--host``, ``--model``
(path) or ``--served-model-name``: this entry point takes those as an engine server does,
refuses any bind address but 127.0.0.1, and runs the stand-in with its own options (the rest
of the command line) and the served name as its model. ``--load-format dummy`` is accepted
for architecture-only models: the stand-in never reads weights.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.unit.engines.standin_engine.serve")
    p.add_argument("--model", required=True, help="model path (never read)")
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--host", required=True, choices=["127.0.0.1"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--load-format", choices=["dummy"], default="dummy")
    own, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    from autotuner.testing import standin

    print(f"stand-in engine: model {own.model} served as {own.served_model_name}", flush=True)
    return standin.main(["--port", str(own.port), "--model", own.served_model_name, *rest])


if __name__ == "__main__":
    raise SystemExit(main())
