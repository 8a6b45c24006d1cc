"""Memory model, the engine-neutral half: what a model's weights and KV cache take.

Llama, Qwen3 and Mistral families (decoder-only, GQA via ``num_key_value_heads``, ``head_dim``
explicit or ``hidden_size / num_attention_heads``, optional ``tie_word_embeddings``).

* :func:`weights_bytes`: bf16/fp16 = 2 bytes per parameter; FP8 quantization (online
  ``quantization=fp8`` or an fp8 checkpoint) stores the linear layers in 1 byte while the
  embeddings, lm_head and norms stay 16-bit; 4-bit checkpoints use their ``bits``.
* :func:`kv_bytes_per_token` = 2 (K and V) x layers x KV heads per rank x head_dim x bytes.
* :class:`MemoryEstimate`: one config's per-rank budget, as an engine adapter's
  ``estimate_memory`` hook computes it from these numbers and the engine's own sizing rules
  (vLLM's: :mod:`autotuner.engines.vllm.memory`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotuner.core.types import Device

__all__ = [
    "GIB",
    "MemoryEstimate",
    "ModelShape",
    "kv_bytes_per_token",
    "model_max_len",
    "parse_token_count",
    "weights_bytes",
]

GIB = 1 << 30

_FP8_KV = re.compile(r"^(fp8|int8)")


# --------------------------------------------------------------------------- model shape


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a config.json the memory model needs."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qk_norm: bool
    attention_bias: bool
    mlp_bias: bool

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> ModelShape:
        """Read ``cfg``; raises KeyError/ValueError when a needed field is missing."""
        c = dict(cfg.get("text_config") or cfg)  # multimodal wrappers keep the LM inside
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        model_type = str(c.get("model_type", ""))
        return cls(
            hidden=hidden,
            intermediate=int(c["intermediate_size"]),
            layers=int(c["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads),
            vocab=int(c["vocab_size"]),
            tied=bool(c.get("tie_word_embeddings", False)),
            qk_norm=model_type.startswith("qwen3"),
            attention_bias=bool(c.get("attention_bias", False)),
            mlp_bias=bool(c.get("mlp_bias", False)),
        )

    def linear_params(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (q + kv + o + mlp)

    def other_params(self) -> int:
        """Embeddings, lm_head, norms and biases: kept 16-bit by FP8 quantization."""
        per_layer = 2 * self.hidden
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        if self.attention_bias:
            per_layer += (self.heads + 2 * self.kv_heads) * self.head_dim + self.hidden
        if self.mlp_bias:
            per_layer += 2 * self.intermediate + self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * per_layer + self.hidden

    def param_count(self) -> int:
        return self.linear_params() + self.other_params()


def _served_bytes(dtype: Any) -> int:
    """Bytes per 16-bit-or-wider value as vLLM serves it: ``--dtype auto`` (the default) gives
    the checkpoint's bf16/fp16, and fp32 checkpoints are served in 16 bits too."""
    return 4 if str(dtype or "auto").lower() in ("float32", "float") else 2


def _linear_bytes(cfg: Mapping[str, Any], quantization: str | None, served: int) -> float:
    """Bytes per linear-layer weight: online quantization, else the checkpoint's own."""
    if quantization and quantization.lower().startswith("fp8"):
        return 1.0
    qc = cfg.get("quantization_config")
    if isinstance(qc, Mapping):
        method = str(qc.get("quant_method", "")).lower()
        bits = qc.get("bits") or qc.get("w_bit")
        if isinstance(bits, int) and bits > 0:
            return bits / 8  # group scales add ~3%: ignored
        if "fp8" in method or method in ("modelopt", "compressed-tensors"):
            return 1.0
    return float(served)


def weights_bytes(
    cfg: Mapping[str, Any], quantization: str | None = None, *, dtype: str | None = None
) -> int:
    """Bytes of the model's weights on the device (all ranks together).

    ``quantization="fp8"`` (vLLM's online FP8) stores the linear layers in 1 byte; embeddings,
    lm_head and norms stay at the served dtype. ``dtype`` is vLLM's ``--dtype`` (auto: the
    checkpoint's 16-bit dtype).
    """
    shape = ModelShape.of(cfg)
    other = _served_bytes(dtype)
    linear = _linear_bytes(cfg, quantization, other)
    return math.ceil(shape.linear_params() * linear) + shape.other_params() * other


def kv_bytes_per_token(
    cfg: Mapping[str, Any],
    kv_dtype: str | None = "auto",
    *,
    dtype: str | None = None,
    tp: int = 1,
) -> int:
    """KV-cache bytes one token takes on one rank: 2 x layers x KV heads x head_dim x bytes.

    ``kv_dtype``: the KV cache's data type (``auto``: the served dtype). With ``tp``
    tensor-parallel ranks each rank holds ``kv_heads / tp`` heads (at least one: vLLM
    replicates KV heads when there are fewer than ranks).
    """
    shape = ModelShape.of(cfg)
    kv = str(kv_dtype or "auto").lower()
    if _FP8_KV.match(kv):
        per = 1
    elif kv in ("bfloat16", "float16", "half"):
        per = 2
    else:
        per = _served_bytes(dtype)
    heads = max(1, shape.kv_heads // max(1, tp))
    return 2 * shape.layers * heads * shape.head_dim * per


_COUNT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")


def parse_token_count(value: Any) -> int | None:
    """An int, or vLLM's human form (``"8k"`` = 8000, ``"8K"`` = 8192); None if neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        return None
    m = _COUNT_RE.match(value)
    if m is None:
        return None
    unit = m[2]
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(m[1]) * scale[unit])


def model_max_len(cfg: Mapping[str, Any]) -> int:
    """The context length vLLM derives from the config when --max-model-len is not given."""
    c = cfg.get("text_config") or cfg
    return int(c.get("max_position_embeddings") or 2048)


# --------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-rank memory of one engine config; ``fits`` False comes with a ``reason``.

    The sizes the engine settled on carry the neutral role names of
    :class:`~autotuner.engines.base.OptionRoles`: ``kv_block`` (tokens per KV-cache block),
    ``context_len`` (the longest sequence), ``slots`` (sequences scheduled at once) and
    ``step_tokens`` (the token budget of one scheduler step).
    """

    device: Device
    total_bytes: int  # what the engine budgets from (CUDA total / NUMA node MemTotal)
    requested_bytes: int  # the engine's memory fraction x total
    weights_bytes: int
    overhead_bytes: int  # activations, CUDA graphs, runtime (CPU: process RSS)
    kv_budget_bytes: int
    kv_bytes_per_token: int
    kv_block: int
    kv_tokens: int
    context_len: int
    slots: int
    step_tokens: int
    fits: bool
    reason: str = ""

    @property
    def max_concurrency(self) -> float:
        """Full-length sequences the KV cache holds (vLLM logs this as "Maximum concurrency")."""
        return self.kv_tokens / self.context_len if self.context_len else 0.0

    @property
    def max_concurrent_seqs(self) -> int:
        """Sequences running together in the worst case: all of ``context_len`` tokens."""
        return self.concurrent_seqs(self.context_len)

    def concurrent_seqs(self, tokens_per_seq: int) -> int:
        """Sequences of ``tokens_per_seq`` (prompt + output) that run together without
        preemption: KV blocks per sequence, capped by the ``slots``."""
        blocks = -(-max(1, tokens_per_seq) // self.kv_block)
        return min(self.slots, self.kv_tokens // (blocks * self.kv_block))

    def summary(self) -> str:
        gib = GIB
        return (
            f"{self.device}: {self.requested_bytes / gib:.2f} of {self.total_bytes / gib:.2f} GiB"
            f" requested; weights {self.weights_bytes / gib:.2f}, overhead "
            f"{self.overhead_bytes / gib:.2f}, KV {self.kv_budget_bytes / gib:.2f} GiB = "
            f"{self.kv_tokens:,} tokens ({self.kv_bytes_per_token:,} B/token), "
            f"{self.max_concurrency:.1f}x context length {self.context_len}"
            + ("" if self.fits else f"; does not fit: {self.reason}")
        )
