"""What to send: request contents (prompt, output length) and when to send them (arrivals).

Everything is seeded: the same plan and seed give the same prompts and the same arrival
times, so two configs are compared on identical traffic.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from autotuner.core import confined
from autotuner.models.folder import ModelFolderError, read_config

Api = Literal["completions", "chat"]

# Random token ids stay below this share of the vocabulary: the tail of Llama-3 and Qwen
# vocabularies holds special and reserved tokens that would change what the model sees.
_ID_SPAN = 0.95
_FIRST_ID = 10


@dataclass(frozen=True)
class LengthDist:
    """A token-count distribution: fixed, uniform, normal or lognormal, clipped to [lo, hi]."""

    kind: Literal["fixed", "uniform", "normal", "lognormal"]
    mean: float
    stddev: float = 0.0
    lo: int = 1
    hi: int | None = None

    @classmethod
    def fixed(cls, n: int) -> LengthDist:
        return cls("fixed", float(n), 0.0, n, n)

    def sample(self, rng: np.random.Generator) -> int:
        if self.kind == "fixed":
            value = self.mean
        elif self.kind == "uniform":
            assert self.hi is not None
            value = float(rng.integers(self.lo, self.hi + 1))
        elif self.kind == "normal":
            value = rng.normal(self.mean, self.stddev)
        else:
            # Parameters of the underlying normal that give this mean and stddev.
            var = np.log1p((self.stddev / self.mean) ** 2)
            value = rng.lognormal(np.log(self.mean) - var / 2, np.sqrt(var))
        value = max(self.lo, round(value))
        return int(value if self.hi is None else min(self.hi, value))


@dataclass(frozen=True)
class RequestSpec:
    """One request: a prompt (token ids or text, or chat messages) and its output length."""

    output_tokens: int
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    input_tokens: int | None = None  # intended prompt length, when known exactly


@dataclass(frozen=True)
class PromptSource:
    """How prompts are made for one model: token ids below ``vocab_size`` or plain words.

    ``words`` are single-token words of a generated model's tokenizer (N words = N tokens);
    without them a generic word list is used and the real count comes from the server.
    """

    vocab_size: int
    words: tuple[str, ...] = ()

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> PromptSource:
        config = read_config(model_dir)  # bad input when unreadable or nonsense
        text = config.get("text_config")
        vocab = config.get("vocab_size") or (text.get("vocab_size") if text else None)
        if not isinstance(vocab, int | float):
            raise ModelFolderError(
                f"{model_dir / 'config.json'}: no vocab_size (prompts are token ids below it)"
            )
        words: tuple[str, ...] = ()
        if (model_dir / "autotuner-synth.json").exists():
            from autotuner.models.synth import vocab_words

            words = tuple(vocab_words(model_dir))
        return cls(int(vocab), words)

    def token_ids(self, n: int, rng: np.random.Generator) -> list[int]:
        top = max(_FIRST_ID + 1, int(self.vocab_size * _ID_SPAN))
        return [int(x) for x in rng.integers(_FIRST_ID, top, size=n)]

    def text(self, n: int, rng: np.random.Generator) -> tuple[str, int | None]:
        if self.words:
            picks = rng.integers(0, len(self.words), size=n)
            return " ".join(self.words[i] for i in picks), n
        picks = rng.integers(0, len(_GENERIC_WORDS), size=n)
        return " ".join(_GENERIC_WORDS[i] for i in picks), None


_GENERIC_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "one",
    "all",
    "we",
    "their",
    "been",
    "has",
    "when",
    "who",
    "will",
    "more",
    "no",
    "if",
    "out",
    "so",
    "said",
    "what",
    "up",
    "its",
    "about",
    "into",
    "than",
    "them",
    "can",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "my",
    "now",
    "such",
    "like",
    "our",
    "over",
    "man",
    "me",
    "even",
    "most",
    "made",
]


class Replay(Protocol):
    """Requests read from a file (a dataset, a trace: :mod:`autotuner.workload.datasets`,
    :mod:`autotuner.workload.traces`) instead of drawn from distributions."""

    def make(self, i: int, first_index: int, output_len: LengthDist) -> RequestSpec: ...

    def offsets(self, speed: float) -> Iterator[float]:
        """Send times at ``speed`` x the file's own (traces; a dataset has none)."""
        ...

    def describe(self) -> dict[str, Any]: ...

    def note(self) -> str:
        """One line for the user: what was read, what was dropped."""
        ...


@dataclass(frozen=True)
class RequestFactory:
    """Builds request ``i`` deterministically from ``(seed, i)``: lazy and reproducible."""

    api: Api
    source: PromptSource
    input_len: LengthDist | None
    output_len: LengthDist
    seed: int
    dataset: tuple[dict[str, Any], ...] = field(default=())
    # Request i is built as request first_index + i. Each load level on one engine starts
    # further on: the same prompts again would hit vLLM's prefix cache and skip the prefill.
    first_index: int = 0
    replay: Replay | None = None

    def make(self, i: int) -> RequestSpec:
        if self.replay is not None:
            return self.replay.make(i, self.first_index, self.output_len)
        i += self.first_index
        rng = np.random.default_rng([self.seed, i])
        if self.dataset:
            row = self.dataset[i % len(self.dataset)]
            out = int(row.get("output_tokens") or self.output_len.sample(rng))
            if "messages" in row:
                return RequestSpec(out, messages=row["messages"])
            if self.api == "chat":
                return RequestSpec(out, messages=[{"role": "user", "content": row["prompt"]}])
            return RequestSpec(out, prompt=row["prompt"])
        assert self.input_len is not None
        n_in = self.input_len.sample(rng)
        out = self.output_len.sample(rng)
        if self.api == "chat":
            text, exact = self.source.text(n_in, rng)
            return RequestSpec(
                out, messages=[{"role": "user", "content": text}], input_tokens=exact
            )
        return RequestSpec(out, prompt=self.source.token_ids(n_in, rng), input_tokens=n_in)


def load_dataset(path: Path) -> tuple[dict[str, Any], ...]:
    """Rows of a JSONL prompt file: ``{"prompt": str}`` or ``{"messages": [...]}``."""
    rows = []
    with open(confined.open_file(path), encoding="utf-8") as f:  # within the daemon's roots
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc.msg}") from None
            if not isinstance(row, dict) or not ("prompt" in row or "messages" in row):
                raise ValueError(f"{path}:{lineno}: needs a 'prompt' or 'messages' field")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return tuple(rows)


@dataclass(frozen=True)
class Arrival:
    """Open loop (``poisson`` / ``constant`` at ``rate`` req/s; ``trace``: a trace's own times
    at ``rate`` x speed) or closed loop (``concurrency``)."""

    process: Literal["poisson", "constant", "concurrency", "trace"]
    rate: float | None = None
    concurrency: int | None = None

    @property
    def open_loop(self) -> bool:
        return self.process != "concurrency"

    def describe(self) -> str:
        if self.process == "trace":
            return f"trace at {self.rate:g}x speed"
        if self.open_loop:
            return f"{self.process} {self.rate:g} req/s"
        return f"concurrency {self.concurrency}"

    def offsets(self, seed: int) -> Iterator[float]:
        """Send times in seconds from the start, for open-loop processes (endless)."""
        if not self.open_loop or not self.rate or self.rate <= 0:
            raise ValueError("offsets() needs an open-loop arrival with a positive rate")
        if self.process == "trace":
            raise ValueError("a trace's times come from the trace (LoadPlan.offsets)")
        if self.process == "constant":
            # Index times rate, not a running sum: no drift over long runs.
            yield from (i / self.rate for i in itertools.count())
        rng = np.random.default_rng([seed, 0xA77])
        t = 0.0
        while True:
            yield t
            t += rng.exponential(1.0 / self.rate)
