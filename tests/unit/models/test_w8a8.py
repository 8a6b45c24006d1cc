"""The INT8 W8A8 copy of a generated model: projections quantized per output channel, the
rest kept BF16, and a compressed-tensors quantization_config the CPU engine loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from autotuner.models import synth
from autotuner.models.w8a8 import _bf16_to_f32, int8_copy


def tensor(path: Path, name: str) -> tuple[str, list[int], bytes]:
    header = synth.read_safetensors_header(path)
    info = header[name]
    with path.open("rb") as f:
        start = 8 + int.from_bytes(f.read(8), "little")
        lo, hi = info["data_offsets"]
        f.seek(start + lo)
        return info["dtype"], info["shape"], f.read(hi - lo)


def test_int8_copy_quantizes_projections_per_channel(tmp_path: Path) -> None:
    src = synth.synthesize("tiny-llama", tmp_path / "bf16")
    dst = int8_copy(src, tmp_path / "int8")
    weights = dst / synth.WEIGHTS_NAME
    header = synth.read_safetensors_header(weights)
    name = "model.layers.0.self_attn.q_proj.weight"
    dtype, shape, raw = tensor(weights, name)
    assert dtype == "I8"
    q = np.frombuffer(raw, dtype=np.int8).reshape(shape)
    sdtype, sshape, sraw = tensor(weights, name.replace("weight", "weight_scale"))
    assert sdtype == "BF16" and sshape == [shape[0], 1]
    scale = _bf16_to_f32(sraw, sshape)
    original = _bf16_to_f32(tensor(src / synth.WEIGHTS_NAME, name)[2], shape)
    # Every row uses its full range, and dequantizes to within half a step (+ BF16 scale).
    assert (np.abs(q).max(axis=1) == 127).all()
    err = np.abs(q.astype(np.float32) * scale - original)
    assert (err <= scale * 0.5 + np.abs(original) * 2**-8).all()
    # Embeddings, norms and lm_head stay BF16; nothing else gains a scale.
    for kept in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert header[kept]["dtype"] == "BF16"
    scales = [k for k in header if k.endswith("weight_scale")]
    assert len(scales) == 7 * 4  # q k v o gate up down, in each of the 4 layers
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    assert cfg["quantization_config"]["ignore"] == ["lm_head"]
    assert json.loads((src / "config.json").read_text()).get("quantization_config") is None
