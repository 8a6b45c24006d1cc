"""A model folder's ``config.json`` and ``tokenizer.json``, read as input from outside.

The folder is the user's (or a submitter's): its files may be anything. Reading one is bounded
(size, a regular file, UTF-8, JSON nested within the stack, an object at the top) and the
numbers the tuner computes with (layers, heads, sizes) must be positive integers within
bounds no real model reaches. Whatever is wrong is a :class:`ModelFolderError` (bad input, exit
2) that names the file and the field, never a ValueError, RecursionError, UnicodeDecodeError or
ZeroDivisionError further on.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotuner.core import confined, strict_json
from autotuner.core.errors import BadInput

__all__ = [
    "CONFIG_LIMITS",
    "ModelFolderError",
    "config_problems",
    "read_config",
    "read_json_object",
    "read_tokenizer",
]

MAX_CONFIG_BYTES = 4 << 20  # a config.json is a few KiB
MAX_TOKENIZER_BYTES = 512 << 20  # real tokenizers are tens of MiB

# The shape fields the memory model and load plans read: each, where present, a whole number
# in [low, high]. The bounds are far beyond any released model (the largest have ~1e2 layers,
# ~1e2 heads, hidden sizes ~2e4, vocabularies ~3e5, contexts ~1e7).
CONFIG_LIMITS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 4096),
    "num_attention_heads": (1, 8192),
    "num_key_value_heads": (1, 8192),
    "hidden_size": (1, 1 << 20),
    "intermediate_size": (1, 1 << 22),
    "head_dim": (1, 1 << 16),
    "vocab_size": (1, 1 << 26),
    "max_position_embeddings": (1, 1 << 30),
}
_MAY_BE_NULL = frozenset({"num_key_value_heads", "head_dim"})  # derived when null


class ModelFolderError(BadInput):
    """A model folder's file can't be used: unreadable, not JSON, or values no model has."""


def read_json_object(path: Path, max_bytes: int) -> dict[str, Any]:
    """The JSON object in ``path``; ModelFolderError for anything else (OutsideRoots where
    reads are confined and it lies outside). Opened without waiting (a FIFO is refused, not
    read) and read up to ``max_bytes``."""
    try:
        fd = confined.open_file(path)  # within the roots a daemon's SLA may read, if any
    except FileNotFoundError:
        raise ModelFolderError(f"{path}: no such file") from None
    except OSError as exc:
        raise ModelFolderError(f"{path}: cannot open it: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ModelFolderError(f"{path}: not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ModelFolderError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ModelFolderError(f"{path}: larger than {max_bytes} bytes, which no such file is")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelFolderError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        value = strict_json.loads(text)
    except ValueError as exc:
        raise ModelFolderError(f"{path}: {exc}") from None
    if not isinstance(value, dict):
        raise ModelFolderError(f"{path}: a JSON object was expected, found {type(value).__name__}")
    return value


def config_problems(cfg: Mapping[str, Any]) -> list[str]:
    """What makes ``cfg`` (a config.json) unusable: shape fields that are not whole numbers
    within :data:`CONFIG_LIMITS`, or heads that do not fit the hidden size. A multimodal
    wrapper's ``text_config`` is checked the same way."""
    problems: list[str] = []
    parts: list[tuple[str, Mapping[str, Any]]] = [("", cfg)]
    text = cfg.get("text_config")
    if text is not None:
        if isinstance(text, Mapping):
            parts.append(("text_config.", text))
        else:
            problems.append(f"text_config: a JSON object was expected, found {type(text).__name__}")
    for prefix, part in parts:
        numbers: dict[str, int] = {}
        for key, (low, high) in CONFIG_LIMITS.items():
            if key not in part or (part[key] is None and key in _MAY_BE_NULL):
                continue
            value = part[key]
            whole = isinstance(value, int) and not isinstance(value, bool)
            if isinstance(value, float) and value.is_integer():
                whole, value = True, int(value)
            if not whole:
                problems.append(f"{prefix}{key}: {value!r} is not a whole number")
            elif not low <= value <= high:
                problems.append(f"{prefix}{key}: {value} is outside [{low}, {high}]")
            else:
                numbers[key] = value
        heads = numbers.get("num_attention_heads")
        kv = numbers.get("num_key_value_heads")
        if heads is not None and kv is not None and kv > heads:
            problems.append(
                f"{prefix}num_key_value_heads: {kv} is more than num_attention_heads ({heads})"
            )
        hidden = numbers.get("hidden_size")
        no_head_dim = part.get("head_dim") is None
        if heads is not None and hidden is not None and no_head_dim and hidden < heads:
            problems.append(
                f"{prefix}hidden_size: {hidden} is less than num_attention_heads ({heads}), "
                "so a head would have no dimensions"
            )
    return problems


def read_config(model_dir: Path) -> dict[str, Any]:
    """``model_dir/config.json``, checked (:func:`config_problems`)."""
    path = Path(model_dir) / "config.json"
    cfg = read_json_object(path, MAX_CONFIG_BYTES)
    problems = config_problems(cfg)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ModelFolderError(f"{path}: {'; '.join(problems[:3])}{more}")
    return cfg


def read_tokenizer(model_dir: Path) -> dict[str, Any]:
    """``model_dir/tokenizer.json`` as a JSON object (its content is the tokenizer's business)."""
    return read_json_object(Path(model_dir) / "tokenizer.json", MAX_TOKENIZER_BYTES)
