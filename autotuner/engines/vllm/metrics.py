"""The names of vLLM's Prometheus metrics that the monitor reads.

vLLM renamed a few metrics across releases; each reading lists every name it has had, the
first one present wins.
"""

from __future__ import annotations

from autotuner.engines.base import MetricNames

METRICS = MetricNames(
    gauges={
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
    },
    counters={
        "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
        # prompt tokens looked up in / found in the prefix cache
        "prefix_cache_queries": ("vllm:prefix_cache_queries_total",),
        "prefix_cache_hits": ("vllm:prefix_cache_hits_total",),
        # prompt tokens whose prefill was skipped (served from a cache)
        "prompt_tokens_cached": ("vllm:prompt_tokens_cached_total",),
    },
    phases={
        "queue": "vllm:request_queue_time_seconds",
        "prefill": "vllm:request_prefill_time_seconds",
        "decode": "vllm:request_decode_time_seconds",
        "inference": "vllm:request_inference_time_seconds",
    },
)
