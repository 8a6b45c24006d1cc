"""An INT8 copy of a generated model with real weights: the lossy setting the CPU engine runs.

vLLM's CPU build runs no fp8 at all without AVX-512 or AMX (fp8 KV cache: "requires x86 with
AVX-512 or AMX"; fp8 weights: AMX kernels only), but it runs INT8 W8A8 checkpoints in the
compressed-tensors format on any x86 (oneDNN kernels). :func:`int8_copy` writes one from a
BF16 ``model.safetensors``: every linear projection quantized per output channel
(symmetric, scale = max |w| / 127), activations quantized per token at run time by the
engine; embeddings, norms and ``lm_head`` stay BF16. numpy only, like the generator.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from autotuner.models.synth import WEIGHTS_NAME, read_safetensors_header

QUANTIZATION_CONFIG: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "channel",
                "dynamic": False,
            },
            "input_activations": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "token",
                "dynamic": True,
            },
        }
    },
    "ignore": ["lm_head"],
}


def _quantized(name: str, shape: list[int]) -> bool:
    return name.endswith("_proj.weight") and len(shape) == 2


def _bf16_to_f32(raw: bytes, shape: list[int]) -> npt.NDArray[np.float32]:
    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32).reshape(shape)


def _f32_to_bf16(a: npt.NDArray[np.float32]) -> bytes:
    # Round to nearest even, as torch does: scales must not be truncated towards zero.
    bits = a.astype(np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype("<u2").tobytes()


def int8_copy(src: Path, dst: Path) -> Path:
    """Write the INT8 W8A8 copy of the model in ``src`` to ``dst`` (replaced if present)."""
    header = read_safetensors_header(src / WEIGHTS_NAME)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    tensors: dict[str, tuple[str, list[int], bytes]] = {}
    with (src / WEIGHTS_NAME).open("rb") as f:
        start = 8 + int.from_bytes(f.read(8), "little")
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] != "BF16":
                raise ValueError(f"{name}: {info['dtype']}, only BF16 weights are converted")
            lo, hi = info["data_offsets"]
            f.seek(start + lo)
            raw = f.read(hi - lo)
            shape = list(info["shape"])
            if not _quantized(name, shape):
                tensors[name] = ("BF16", shape, raw)
                continue
            w = _bf16_to_f32(raw, shape)
            scale = np.maximum(np.abs(w).max(axis=1, keepdims=True), 1e-8) / 127.0
            q = np.clip(np.rint(w / scale), -128, 127).astype(np.int8)
            tensors[name] = ("I8", shape, q.tobytes())
            scale_name = name.removesuffix("weight") + "weight_scale"
            tensors[scale_name] = ("BF16", [shape[0], 1], _f32_to_bf16(scale))
    _write(dst / WEIGHTS_NAME, tensors)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = QUANTIZATION_CONFIG
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


def _write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    names = sorted(tensors)
    for name in names:
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name in names:
            f.write(tensors[name][2])
