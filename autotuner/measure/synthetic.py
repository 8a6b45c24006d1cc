"""Synthetic shared-prefix traffic: system prompts that many requests share.

Chat traffic repeats a few long system prompts; the engine's prefix cache then skips their
prefill. Random prompts share nothing, so a config tuned on them can switch the cache off for
no loss and lose it all in production. Here every request starts with ``tokens`` tokens of
system prompt: a ``share`` of the requests use one of ``prompts`` shared ones, the others one
of their own, so the prompt lengths (and the work without a cache) do not depend on the share.

The shared system prompts depend on the seed only: every load level of a launch sends the
same ones, as a service's users do; the rest of each prompt is new at every level.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autotuner.workload.requests import PromptSource, RequestFactory, RequestSpec

# Keys of the seeded streams, apart from those of the requests themselves.
_PICK = 0x5A1
_SHARED = 0x5A2
_OWN = 0x5A3


@dataclass(frozen=True)
class SharedPrefix:
    """``share`` of the requests start with one of ``prompts`` system prompts of ``tokens``."""

    prompts: int
    tokens: int
    share: float

    def pick(self, seed: int, index: int) -> int | None:
        """Which shared system prompt request ``index`` uses (None: one of its own)."""
        rng = np.random.default_rng([seed, index, _PICK])
        if rng.random() >= self.share:
            return None
        return int(rng.integers(self.prompts))

    def rng(self, seed: int, index: int) -> np.random.Generator:
        """The stream the system prompt of request ``index`` is drawn from."""
        which = self.pick(seed, index)
        if which is None:
            return np.random.default_rng([seed, index, _OWN])
        return np.random.default_rng([seed, which, _SHARED])

    def token_ids(self, source: PromptSource, seed: int, index: int) -> list[int]:
        return source.token_ids(self.tokens, self.rng(seed, index))

    def text(self, source: PromptSource, seed: int, index: int) -> tuple[str, int | None]:
        return source.text(self.tokens, self.rng(seed, index))

    def describe(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "tokens": self.tokens, "share": self.share}


@dataclass(frozen=True)
class PrefixedFactory(RequestFactory):
    """A :class:`RequestFactory` whose requests start with a system prompt (``prefix``)."""

    prefix: SharedPrefix | None = None

    def make(self, i: int) -> RequestSpec:
        spec = super().make(i)
        if self.prefix is None:
            return spec
        index = i + self.first_index
        if spec.messages is not None:
            text, exact = self.prefix.text(self.source, self.seed, index)
            system = {"role": "system", "content": text}
            return replace(
                spec, messages=[system, *spec.messages], input_tokens=_sum(exact, spec.input_tokens)
            )
        assert isinstance(spec.prompt, list), "shared prefixes need synthetic token prompts"
        ids = self.prefix.token_ids(self.source, self.seed, index)
        return replace(
            spec, prompt=ids + spec.prompt, input_tokens=_sum(len(ids), spec.input_tokens)
        )


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def with_prefix(factory: RequestFactory, prefix: SharedPrefix | None) -> RequestFactory:
    """``factory`` with system prompts in front of its requests (itself without ``prefix``)."""
    if prefix is None:
        return factory
    fields = {name: getattr(factory, name) for name in factory.__dataclass_fields__}
    return PrefixedFactory(**fields, prefix=prefix)


def prefix_of(factory: RequestFactory) -> SharedPrefix | None:
    return factory.prefix if isinstance(factory, PrefixedFactory) else None
