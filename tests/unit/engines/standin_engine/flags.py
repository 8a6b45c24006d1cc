"""The stand-in engine's command line: options (snake_case) -> flags, and the flags the tuner
owns."""

from __future__ import annotations

from collections.abc import Sequence

from autotuner.core.types import Params

RESERVED_PARAMS: dict[str, str] = {
    "model": "set by the autotuner from the 'model' section",
    "host": "set by the autotuner (engines bind to 127.0.0.1)",
    "port": "set by the autotuner (it picks a free port)",
    "served_model_name": "use model.served_name instead",
}


def flag_of(name: str) -> str:
    """``max_concurrency`` -> ``--max-concurrency``."""
    return "--" + name.replace("_", "-")


RESERVED_FLAGS: frozenset[str] = frozenset(flag_of(name) for name in RESERVED_PARAMS)


def option_of(flag: str) -> str:
    """``--max-concurrency`` (or ``--max_concurrency``) -> ``max_concurrency``."""
    return flag.lstrip("-").replace("-", "_")


def params_to_args(params: Params) -> list[str]:
    """``{"max_concurrency": 8}`` -> ``["--max-concurrency", "8"]``; ``None`` omits the
    option. The stand-in has no switches or JSON options: every value is one word."""
    args: list[str] = []
    for key, value in params.items():
        flag = flag_of(key)
        if flag in RESERVED_FLAGS:
            raise ValueError(f"engine parameter {key!r} is set by the tuner and cannot be given")
        if value is None:
            continue
        if isinstance(value, bool | dict):
            raise ValueError(f"engine parameter {key!r} takes a number or a word")
        args += [flag, str(value)]
    return args


def check_extra_args(args: Sequence[str]) -> None:
    """Refuse literal arguments that would rebind the server, in any spelling argparse reads
    (``--port=1``, ``--served_model_name``, the prefix ``--hos``)."""
    for arg in args:
        head = arg.split("=", 1)[0]
        if not head.startswith("--") or head == "--":
            continue
        flag = "--" + head[2:].replace("_", "-")
        if any(owned.startswith(flag) for owned in RESERVED_FLAGS):
            raise ValueError(f"engine argument {arg!r} is set by the tuner and cannot be given")
