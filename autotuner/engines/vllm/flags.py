"""vLLM's command line: options (snake_case) -> flags, and the flags the tuner owns.

One source for both sides: the SLA schema refuses a reserved option by name (with the reason
below), and the launcher and deploy renderer refuse it again as a flag.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from autotuner.core.types import Params

# The tuner owns these: it picks the port, binds loopback and names the model.
RESERVED_PARAMS: dict[str, str] = {
    "model": "set by the autotuner from the 'model' section",
    "host": "set by the autotuner (engines bind to 127.0.0.1)",
    "port": "set by the autotuner (it picks a free port)",
    "served_model_name": "use model.served_name instead",
}


def flag_of(name: str) -> str:
    """``max_num_seqs`` -> ``--max-num-seqs``."""
    return "--" + name.replace("_", "-")


RESERVED_FLAGS: frozenset[str] = frozenset(flag_of(name) for name in RESERVED_PARAMS)


def params_to_args(params: Params) -> list[str]:
    """``{"max_num_seqs": 8, "enforce_eager": True}`` -> ``["--max-num-seqs", "8", ...]``.

    ``True`` gives the bare flag, ``False`` its ``--no-`` form, ``None`` omits the option,
    mappings are passed as JSON (``--compilation-config``).
    """
    args: list[str] = []
    for key, value in params.items():
        flag = flag_of(key)
        if flag in RESERVED_FLAGS:
            raise ValueError(f"engine parameter {key!r} is set by the tuner and cannot be given")
        if value is None:
            continue
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + flag[2:])
        elif isinstance(value, dict):
            args += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            args += [flag, str(value)]
    return args


# Reads further arguments from a file, which could carry any of the flags above.
FILE_FLAGS: frozenset[str] = frozenset({"--config"})


def check_extra_args(args: Sequence[str]) -> None:
    """Refuse literal arguments (``--port``, ``--host=...``) that would rebind the server, in
    every spelling vLLM reads: ``--served_model_name`` (underscores) and abbreviations such as
    ``--hos`` (argparse takes unambiguous prefixes); and ``--config`` (more flags from a file).
    """
    for arg in args:
        head = arg.split("=", 1)[0]
        if not head.startswith("--") or head == "--":
            continue
        flag = "--" + head[2:].split(".", 1)[0].replace("_", "-")
        if flag in FILE_FLAGS:
            raise ValueError(f"engine argument {arg!r} reads flags from a file and is refused")
        if any(owned.startswith(flag) for owned in RESERVED_FLAGS):
            raise ValueError(f"engine argument {arg!r} is set by the tuner and cannot be given")
