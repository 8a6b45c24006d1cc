"""The quality gate's arithmetic: how far a lossy config's outputs are from the lossless
baseline's.

Both engines answer the same prompts greedily (temperature 0) with the top log-probabilities
of every generated token (the completions API's ``logprobs``). Two numbers come of it:

- **Token agreement**: the share of compared positions where the candidate chose the same
  token as the baseline. Positions are compared while both completions share their context:
  up to and including the first position where they differ (after it the candidate continues
  a different text, and its choices say nothing about the baseline's). So a prompt adds its
  common prefix as agreements and at most one disagreement: the per-token agreement rate.
- **Divergence**: per compared position, the Kullback-Leibler divergence KL(baseline ||
  candidate) of the next-token distributions, estimated on the baseline's top-k tokens (both
  renormalised over that set; a token missing from the candidate's top-k gets the candidate's
  lowest returned log-probability, an upper bound of its own, so the estimate errs low). The
  gate limits the mean over all compared positions.

A verdict is ``pass`` (both limits met), ``fail`` or ``not_measurable``: random weights
(``--load-format dummy``) give outputs that mean nothing, so on them the gate measures
nothing; whether such a lossy config may be promoted anyway is the SLA's explicit choice
(``quality.promote_unmeasured``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from autotuner.sla.quality import Limits

Verdict = Literal["pass", "fail", "not_measurable"]

DUMMY_WEIGHTS = "not measurable on dummy weights"

# Used when the SLA's workload has no dataset: short, varied English openings.
BUILTIN_PROMPTS = (
    "The capital of France is",
    "Write a short poem about the sea.",
    "Explain in one sentence why the sky is blue.",
    "def fibonacci(n):",
    "The three primary colors are",
    "Translate to German: Good morning, how are you?",
    "Once upon a time, in a small village,",
    "List three uses of a paperclip:",
    "The square root of 144 is",
    "Summarize the plot of Romeo and Juliet.",
    "A good breakfast includes",
    "SELECT name FROM users WHERE",
    "The theory of relativity states that",
    "Give two tips for learning a new language:",
    "In 1969, the first humans",
    "The best way to cook rice is",
)


@dataclass(frozen=True)
class Completion:
    """One greedy completion: its tokens and, per position, the top log-probabilities
    (token text -> log-probability, the chosen token among them)."""

    tokens: tuple[str, ...]
    top: tuple[dict[str, float], ...]

    @classmethod
    def from_choice(cls, choice: Mapping[str, Any]) -> Completion:
        """From one ``choices[i]`` of a completions response requested with ``logprobs``."""
        lp = choice.get("logprobs") or {}
        tokens = tuple(str(t) for t in lp.get("tokens") or ())
        tops = lp.get("top_logprobs") or [None] * len(tokens)
        chosen = lp.get("token_logprobs") or [None] * len(tokens)
        top = []
        for tok, t, c in zip(tokens, tops, chosen, strict=False):
            entry = {str(k): float(v) for k, v in (t or {}).items() if _finite(v)}
            if tok not in entry and _finite(c):
                entry[tok] = float(c)
            top.append(entry)
        return cls(tokens[: len(top)], tuple(top))


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Agreement:
    """What comparing the two sets of completions measured."""

    prompts: int
    positions: int  # positions compared (shared context)
    agreed: int  # of which the candidate chose the baseline's token
    identical: int  # prompts whose completions are identical
    mean_kl: float | None  # mean KL(baseline || candidate) per compared position
    max_kl: float | None

    @property
    def token_agreement(self) -> float | None:
        return self.agreed / self.positions if self.positions else None

    @property
    def exact_match(self) -> float | None:
        return self.identical / self.prompts if self.prompts else None


def kl_topk(base: Mapping[str, float], cand: Mapping[str, float]) -> float:
    """KL(base || cand) on ``base``'s tokens, both renormalised over them (module docstring)."""
    if not base:
        return 0.0
    floor = min(cand.values()) if cand else min(base.values())
    keys = list(base)
    p = _softmax([base[k] for k in keys])
    q = _softmax([cand.get(k, floor) for k in keys])
    kl = sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q, strict=True))
    return max(0.0, kl)


def _softmax(lps: Sequence[float]) -> list[float]:
    m = max(lps)
    ex = [math.exp(v - m) for v in lps]
    total = sum(ex)
    return [max(e / total, 1e-300) for e in ex]


def compare(baseline: Sequence[Completion], candidate: Sequence[Completion]) -> Agreement:
    """Compare the completions of the same prompts, in order (module docstring)."""
    if len(baseline) != len(candidate):
        raise ValueError(f"{len(baseline)} baseline completions vs {len(candidate)} candidate")
    positions = agreed = identical = 0
    kls: list[float] = []
    for b, c in zip(baseline, candidate, strict=True):
        n = min(len(b.tokens), len(c.tokens))
        same = b.tokens == c.tokens
        identical += same
        for i in range(n):
            positions += 1
            kls.append(kl_topk(b.top[i], c.top[i]))
            if b.tokens[i] != c.tokens[i]:
                break  # from here on the candidate continues another text
            agreed += 1
    return Agreement(
        prompts=len(baseline),
        positions=positions,
        agreed=agreed,
        identical=identical,
        mean_kl=sum(kls) / len(kls) if kls else None,
        max_kl=max(kls) if kls else None,
    )


@dataclass(frozen=True)
class GateResult:
    """The gate's verdict with what it rests on (the manifest's ``lossy_tier.gate``)."""

    verdict: Verdict
    reason: str
    prompts: int = 0
    positions: int = 0
    token_agreement: float | None = None
    exact_match: float | None = None
    mean_kl: float | None = None
    max_kl: float | None = None
    min_token_agreement: float | None = None
    max_mean_kl: float | None = None
    # The baseline compared with a second run of itself: the gate's noise floor.
    repeat_agreement: float | None = None
    repeat_mean_kl: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(a: Agreement, limits: Limits, repeat: Agreement | None = None) -> GateResult:
    """``pass`` when the token agreement and the mean divergence are both within the limits.

    ``repeat``: the baseline against a second run of itself, reported beside (what the engine
    varies by itself; a deterministic engine repeats itself exactly)."""

    def result(verdict: Verdict, reason: str) -> GateResult:
        return GateResult(
            verdict,
            reason,
            prompts=a.prompts,
            positions=a.positions,
            token_agreement=a.token_agreement,
            exact_match=a.exact_match,
            mean_kl=a.mean_kl,
            max_kl=a.max_kl,
            min_token_agreement=limits.min_token_agreement,
            max_mean_kl=limits.max_mean_kl,
            repeat_agreement=None if repeat is None else repeat.token_agreement,
            repeat_mean_kl=None if repeat is None else repeat.mean_kl,
        )

    if not a.positions or a.token_agreement is None or a.mean_kl is None:
        return result("not_measurable", "no token could be compared")
    misses = []
    if a.token_agreement < limits.min_token_agreement:
        misses.append(f"token agreement {a.token_agreement:.1%} < {limits.min_token_agreement:.1%}")
    if a.mean_kl > limits.max_mean_kl:
        misses.append(f"mean KL {a.mean_kl:.4f} > {limits.max_mean_kl:g}")
    measured = (
        f"token agreement {a.token_agreement:.1%} over {a.positions} positions of "
        f"{a.prompts} prompts ({a.identical} identical), mean KL {a.mean_kl:.4f}"
    )
    if misses:
        return result("fail", f"{measured}: " + "; ".join(misses))
    return result("pass", f"{measured}: within the SLA's quality limits")


def unmeasurable(reason: str, limits: Limits | None = None) -> GateResult:
    """A gate that measured nothing (dummy weights, a launch that failed)."""
    return GateResult(
        "not_measurable",
        reason,
        min_token_agreement=None if limits is None else limits.min_token_agreement,
        max_mean_kl=None if limits is None else limits.max_mean_kl,
    )


def dataset_prompts(rows: Sequence[Mapping[str, Any]], n: int) -> list[str]:
    """The first ``n`` prompt texts of dataset rows (``prompt``, or the messages' contents)."""
    out: list[str] = []
    for row in rows:
        text = row.get("prompt")
        if not isinstance(text, str):
            msgs = row.get("messages")
            parts = [m.get("content") for m in msgs or () if isinstance(m, Mapping)]
            text = "\n".join(p for p in parts if isinstance(p, str))
        if text:
            out.append(text)
        if len(out) >= n:
            break
    return out


def builtin_prompts(n: int) -> list[str]:
    """``n`` built-in prompts (cycled when more are asked for than there are)."""
    return [BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)] for i in range(n)]
