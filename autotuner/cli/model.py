"""`autotuner model synth --arch A [--out DIR] [--force]`: write a generated model directory.

Prints the model directory, then one summary line. Exit 0; 2 for an unknown architecture;
1 when the directory holds something else (pass --force to replace it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from autotuner.models.synth import (
    ARCHS,
    WEIGHTS_NAME,
    default_model_dir,
    param_count,
    synthesize,
)


def _human(n: float, units: tuple[str, ...] = ("", "K", "M", "B", "T")) -> str:
    for u in units:
        if abs(n) < 1000 or u == units[-1]:
            return f"{n:.0f}{u}" if u == "" else f"{n:.2f}{u}"
        n /= 1000
    raise AssertionError("unreachable")


def main_synth(arch: str, out: str | None, force: bool) -> int:
    if arch not in ARCHS:
        print(f"unknown arch {arch!r}; choose one of: {', '.join(ARCHS)}", file=sys.stderr)
        return 2
    spec = ARCHS[arch]
    out_dir = Path(out) if out else default_model_dir(arch)
    try:
        path = synthesize(arch, out_dir, force=force)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    cfg = spec.config()
    weights = (
        f"random weights ({WEIGHTS_NAME}, {(path / WEIGHTS_NAME).stat().st_size / 2**20:.1f} MiB)"
        if spec.has_weights
        else "no weights (serve with --load-format dummy)"
    )
    print(path)
    print(
        f"{arch}: {cfg['architectures'][0]}, {_human(param_count(cfg, spec.family))} params, "
        f"{cfg['num_hidden_layers']} layers, vocab {cfg['vocab_size']}, "
        f"max_len {cfg['max_position_embeddings']}, {weights}"
    )
    return 0
