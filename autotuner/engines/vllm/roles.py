"""vLLM's names for the tuner's engine-neutral roles: which option is the tensor-parallel size,
the slots, the step budget... (:class:`~autotuner.engines.base.OptionRoles`), and which
environment variables the doctor reads (:class:`~autotuner.engines.base.EnvNames`)."""

from __future__ import annotations

from autotuner.engines.base import EnvNames, OptionRoles

# vLLM's options for the tuner's engine-neutral roles (OptionRoles documents each).
ROLES = OptionRoles(
    tensor_parallel="tensor_parallel_size",
    pipeline_parallel="pipeline_parallel_size",
    data_parallel="data_parallel_size",
    slots="max_num_seqs",
    step_tokens="max_num_batched_tokens",
    memory_fraction="gpu_memory_utilization",
    kv_block="block_size",
    context_length="max_model_len",
    eager="enforce_eager",
    weight_quantization="quantization",
    kv_dtype="kv_cache_dtype",
)

ENV_NAMES = EnvNames(
    attention_backend="VLLM_ATTENTION_BACKEND",
    flash_attention_version="VLLM_FLASH_ATTN_VERSION",
    cache_root="VLLM_CACHE_ROOT",
    cache_default=".cache/vllm",
)
