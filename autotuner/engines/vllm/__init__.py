"""The vLLM engine: adapter, launcher, flags, log patterns, metric names, defaults, memory
model, pruning rules and deploy renderer. Importing it registers the adapter (the default)."""

from autotuner.engines import registry
from autotuner.engines.vllm.adapter import ADAPTER

registry.register(ADAPTER, default=True)
