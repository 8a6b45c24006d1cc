"""The engine's view of shared prefixes: how much of the prompt work its prefix cache saved.

Two readings per load level, from counter deltas of the engine's ``/metrics``
(:func:`autotuner.measure.monitor.engine_summary`): the hit rate (prompt tokens found in the
cache among those looked up) and the share of all prompt tokens whose prefill was skipped.
They differ: a request preempted and resumed is looked up again, and a prompt's last token is
always computed, so the share is the figure that says how much prefill the cache saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def cached_share(engine: Mapping[str, Any]) -> float | None:
    """Prompt tokens served from the cache over all prompt tokens (None: not reported).

    Engines without a cached-prompt-token counter fall back to the cache hits."""
    total = engine.get("prompt_tokens")
    cached = engine.get("prompt_tokens_cached", engine.get("prefix_cache_hits"))
    if not total or cached is None:
        return None
    return min(1.0, max(0.0, float(cached) / float(total)))


def cache_note(engine: Mapping[str, Any]) -> str:
    """``prefix cache 82% of prompt tokens (hit rate 85%)``; empty when the engine said nothing."""
    share = engine.get("prompt_cached_share")
    if share is None:
        share = cached_share(engine)
    rate = engine.get("prefix_cache_hit_rate")
    if share is None and rate is None:
        return ""
    parts = []
    if share is not None:
        parts.append(f"{share:.0%} of prompt tokens")
    if rate is not None:
        parts.append(f"hit rate {rate:.0%}")
    head, *rest = parts
    return f"prefix cache {head}" + (f" ({rest[0]})" if rest else "")
