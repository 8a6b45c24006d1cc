"""Arrival processes and request contents: seeded, reproducible, statistically right."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from autotuner.workload.requests import (
    Arrival,
    LengthDist,
    PromptSource,
    RequestFactory,
    load_dataset,
)


def take(arrival: Arrival, n: int, seed: int = 0) -> np.ndarray:
    return np.array(list(itertools.islice(arrival.offsets(seed), n)))


def test_poisson_same_seed_same_schedule_other_seed_differs() -> None:
    a = Arrival("poisson", rate=5.0)
    assert np.array_equal(take(a, 100, 1), take(a, 100, 1))
    assert not np.array_equal(take(a, 100, 1), take(a, 100, 2))


def test_poisson_interarrivals_are_exponential() -> None:
    rate = 4.0
    n = 20_000
    gaps = np.diff(take(Arrival("poisson", rate=rate), n + 1, seed=7))
    # Mean 1/rate within 4 standard errors; coefficient of variation of an exponential is 1.
    assert abs(gaps.mean() - 1 / rate) < 4 * (1 / rate) / math.sqrt(n)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05
    # Memorylessness shows in the median: ln 2 / rate.
    assert abs(np.median(gaps) - math.log(2) / rate) < 0.02
    # Kolmogorov-Smirnov distance to the exponential CDF, 1% critical value ~1.63/sqrt(n).
    xs = np.sort(gaps)
    cdf = 1 - np.exp(-rate * xs)
    ecdf = np.arange(1, n + 1) / n
    assert np.max(np.abs(ecdf - cdf)) < 1.63 / math.sqrt(n)


def test_constant_rate_is_evenly_spaced() -> None:
    offs = take(Arrival("constant", rate=8.0), 50)
    assert offs[0] == 0.0
    assert np.allclose(np.diff(offs), 0.125)


def test_closed_loop_has_no_schedule() -> None:
    with pytest.raises(ValueError):
        next(Arrival("concurrency", concurrency=4).offsets(0))


@pytest.mark.parametrize(
    "dist",
    [
        LengthDist("uniform", 0, 0, 10, 20),
        LengthDist("normal", 100.0, 30.0, 50, 150),
        LengthDist("lognormal", 200.0, 100.0, 1, 2000),
    ],
)
def test_length_distributions_stay_in_bounds(dist: LengthDist) -> None:
    rng = np.random.default_rng(0)
    xs = np.array([dist.sample(rng) for _ in range(5000)])
    assert xs.min() >= dist.lo
    assert dist.hi is None or xs.max() <= dist.hi
    assert xs.dtype.kind == "i"


def test_lognormal_matches_requested_mean_and_stddev() -> None:
    rng = np.random.default_rng(1)
    dist = LengthDist("lognormal", 300.0, 120.0, 1, None)
    xs = np.array([dist.sample(rng) for _ in range(40_000)], dtype=float)
    assert abs(xs.mean() - 300) < 5
    assert abs(xs.std() - 120) < 6


def test_request_factory_is_deterministic_per_index() -> None:
    src = PromptSource(vocab_size=1000)
    f = RequestFactory("completions", src, LengthDist.fixed(64), LengthDist.fixed(16), seed=3)
    a, b = f.make(5), f.make(5)
    assert a == b
    assert a != f.make(6)
    assert isinstance(a.prompt, list) and len(a.prompt) == 64
    assert all(10 <= t < 950 for t in a.prompt)
    assert a.input_tokens == 64 and a.output_tokens == 16


def test_chat_prompts_use_model_words_for_exact_lengths() -> None:
    src = PromptSource(vocab_size=100, words=("alpha", "beta", "gamma"))
    f = RequestFactory("chat", src, LengthDist.fixed(12), LengthDist.fixed(4), seed=0)
    spec = f.make(0)
    assert spec.messages is not None
    assert len(spec.messages[0]["content"].split()) == 12
    assert spec.input_tokens == 12


def test_dataset_rows_and_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "hi there", "output_tokens": 7}\n\n{"messages": []}\n')
    rows = load_dataset(good)
    assert len(rows) == 2
    f = RequestFactory(
        "completions", PromptSource(10), None, LengthDist.fixed(5), seed=0, dataset=rows
    )
    assert f.make(0).prompt == "hi there" and f.make(0).output_tokens == 7
    assert f.make(1).messages == [] and f.make(1).output_tokens == 5
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_dataset(bad)


def test_later_load_levels_send_requests_the_engine_has_not_seen(tmp_path: Path) -> None:
    # Seen on the H200: every level re-sent level 1's prompts, so vLLM's prefix cache served
    # the prefill of levels 2+ (mean prefill 42 ms at level 1, 14 ms at level 2).
    from autotuner.engines import registry
    from autotuner.measure.bench import build_plan
    from autotuner.sla.spec import parse_sla

    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 5000}))
    sla = parse_sla(
        "model: {path: m}\n"
        "workload: {input_tokens: 64, output_tokens: 8, requests: 50, warmup_requests: 5,\n"
        "  arrival: {process: poisson, rate: 2}}\n"
        "constraints: {p99_ttft_ms: 100}\n"
    )
    roles = registry.get(sla.engine.kind).roles
    plans = [build_plan(sla, tmp_path, level=k, roles=roles) for k in range(3)]
    prompts = [
        {tuple(p.factory.make(i).prompt or ()) for i in range(p.requests or 0)} for p in plans
    ]
    assert all(len(s) == 50 for s in prompts)
    assert not prompts[0] & prompts[1] and not prompts[1] & prompts[2]
    assert [p.warmup_requests for p in plans] == [5, 0, 0]
    # The first level is what it always was: stored results stay reproducible.
    assert plans[0].factory.make(3) == RequestFactory(
        "completions", PromptSource(5000), LengthDist.fixed(64), LengthDist.fixed(8), 0
    ).make(3)


def test_later_levels_move_on_through_a_dataset() -> None:
    rows = tuple({"prompt": f"p{i}"} for i in range(10))
    base = RequestFactory("completions", PromptSource(100), None, LengthDist.fixed(4), 0, rows)
    later = dataclasses.replace(base, first_index=4)
    assert [later.make(i).prompt for i in range(3)] == ["p4", "p5", "p6"]
    assert later.make(6).prompt == "p0"  # a dataset smaller than all levels together wraps
