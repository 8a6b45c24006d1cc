"""Shared-prefix and multi-turn traffic: the prompts, the conversations' order and timing, the
SLA fields' bad input, and the prefix-cache figures in the engine summary and the report.

The real-vLLM evidence (cache hits, turn order on a real engine) is in
tests/integration/test_traffic_real.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from autotuner.bundle.cache_report import cache_lines
from autotuner.bundle.report import LatencyProfile, latency_breakdown_svg
from autotuner.cli.main import main
from autotuner.engines import registry
from autotuner.measure.cache import cache_note, cached_share
from autotuner.measure.conversations import ConversationFactory, drive
from autotuner.measure.loadgen import LoadPlan, RequestRecord, run_load
from autotuner.measure.monitor import engine_summary
from autotuner.measure.synthetic import SharedPrefix, with_prefix
from autotuner.records.trial import TrialRecord
from autotuner.testing.standin import StandinConfig, StandinServer
from autotuner.workload.requests import (
    Arrival,
    LengthDist,
    PromptSource,
    RequestFactory,
    RequestSpec,
)

SOURCE = PromptSource(vocab_size=5000, words=("alpha", "beta", "gamma", "delta"))


def factory(api: str = "completions", share: float = 0.8, first_index: int = 0) -> RequestFactory:
    base = RequestFactory(
        api,  # type: ignore[arg-type]
        SOURCE,
        LengthDist.fixed(8),
        LengthDist.fixed(4),
        seed=7,
        first_index=first_index,
    )
    return with_prefix(base, SharedPrefix(prompts=3, tokens=32, share=share))


def prefixes(f: RequestFactory, n: int) -> list[tuple[int, ...]]:
    out = []
    for i in range(n):
        prompt = f.make(i).prompt
        assert isinstance(prompt, list) and len(prompt) == 40  # 32 system + 8 own
        out.append(tuple(prompt[:32]))
    return out


# --------------------------------------------------------------------------- shared prefixes


def test_the_share_of_requests_uses_one_of_the_shared_system_prompts() -> None:
    counts = Counter(prefixes(factory(share=0.8), 1000))
    shared = [p for p, n in counts.items() if n > 1]
    assert len(shared) == 3  # the 3 shared prompts; every other request has its own
    assert 0.75 < sum(counts[p] for p in shared) / 1000 < 0.85
    assert len(set(prefixes(factory(share=0.0), 200))) == 200
    assert len(set(prefixes(factory(share=1.0), 200))) == 3


def test_every_level_sends_the_same_system_prompts_with_new_user_prompts() -> None:
    first, later = factory(share=1.0), factory(share=1.0, first_index=1000)
    assert set(prefixes(first, 50)) == set(prefixes(later, 50))
    own = {tuple(first.make(i).prompt[32:]) for i in range(50)}  # type: ignore[index]
    assert own.isdisjoint({tuple(later.make(i).prompt[32:]) for i in range(50)})  # type: ignore[index]
    assert first.make(3) == factory(share=1.0).make(3)  # seeded: the same plan, the same prompts


def test_chat_requests_get_the_system_prompt_as_a_system_message() -> None:
    spec = factory("chat", share=1.0).make(0)
    assert spec.messages is not None
    system, user = spec.messages
    assert system["role"] == "system" and len(system["content"].split()) == 32
    assert user["role"] == "user" and len(user["content"].split()) == 8
    assert spec.input_tokens == 40


# --------------------------------------------------------------------------- conversations


def test_a_later_turn_resends_the_history_and_its_system_prompt() -> None:
    conv = ConversationFactory(factory(share=1.0), turns=3)
    one = conv.turn(0, 0, [])
    two = conv.turn(0, 1, [(one.user, "the answer")])
    assert isinstance(one.spec.prompt, str) and isinstance(two.spec.prompt, str)
    assert two.spec.prompt.startswith(one.spec.prompt + " the answer ")
    assert two.spec.prompt.endswith(two.user)
    assert len(one.spec.prompt.split()) == 32 + 8
    chat = ConversationFactory(factory("chat", share=1.0), turns=3)
    first = chat.turn(1, 0, [])
    msgs = chat.turn(1, 1, [(first.user, "ok")]).spec.messages
    assert msgs is not None
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[1]["content"] == first.user and msgs[2]["content"] == "ok"


def test_turns_keep_their_order_and_think_time_and_conversations_arrive_at_rate_over_turns() -> (
    None
):
    conv = ConversationFactory(factory(), turns=3, think_time_s=0.05)
    sent: dict[int, tuple[float, float]] = {}  # index -> (sent, answered)
    t0 = time.perf_counter()

    async def send(index: int, spec: RequestSpec, scheduled: float) -> tuple[RequestRecord, str]:
        start = time.perf_counter() - t0
        await asyncio.sleep(0.02)
        sent[index] = (start, time.perf_counter() - t0)
        return RequestRecord(index, start, 0.0, spec.output_tokens, e2e_s=0.02), f"answer {index}"

    asyncio.run(
        drive(
            conv,
            send,
            arrival=Arrival("constant", rate=30.0),
            requests=10,
            duration_s=None,
            t0=t0,
            deadline=t0 + 30,
        )
    )
    assert sorted(sent) == list(range(10))  # 4 conversations, the last one cut to 1 turn
    for i in range(10):
        if i % 3:
            assert sent[i][0] >= sent[i - 1][1] + 0.05  # after the answer, plus think time
    starts = [sent[c * 3][0] for c in range(4)]
    assert starts[3] - starts[0] == pytest.approx(3 * 3 / 30.0, abs=0.03)  # 10 conv/s


def test_conversations_through_the_load_generator_grow_their_prompts() -> None:
    """End to end against the stand-in: its usage counts every word of the history."""
    f = factory(share=1.0)
    plan = LoadPlan(
        api="completions",
        factory=f,
        arrival=Arrival("poisson", rate=40.0),
        requests=9,
        duration_s=None,
        warmup_requests=1,
        conversation=ConversationFactory(f, turns=3, think_time_s=0.02),
    )

    async def go() -> list[RequestRecord]:
        async with StandinServer(StandinConfig(ttft_s=0.01, itl_s=0.002)) as server:
            result = await run_load(server.base_url, "standin-model", plan)
        return list(result.records)

    records = asyncio.run(go())
    assert [r.index for r in records] == list(range(9)) and all(r.ok for r in records)
    # turn t: 32 system + t x (8 user + 4 answer) + 8 user
    assert [r.prompt_tokens for r in records] == [40, 52, 64] * 3
    for r in records:
        if r.index % 3:
            before = records[r.index - 1]
            assert before.e2e_s is not None
            assert r.sent_s >= before.sent_s + before.e2e_s + 0.02
    assert plan.describe()["conversation"] == {"turns": 3, "think_time_s": 0.02}
    assert plan.describe()["shared_prefix"] == {"prompts": 3, "tokens": 32, "share": 1.0}


# --------------------------------------------------------------------------- SLA fields

BASE = """\
model: {synth: tiny-llama}
engine:
  params: {max_model_len: 1024}
workload:
  input_tokens: 64
  output_tokens: 16
  shared_prefix: {prompts: 4, tokens: 512, share: 0.8}
  conversation: {turns: 2, think_time_s: 1.5}
  arrival: {process: poisson, rate: 2}
  requests: 20
"""


def _check(tmp_path: Path, old: str, new: str) -> tuple[int, str, Path]:
    assert old in BASE
    path = tmp_path / "sla.yaml"
    path.write_text(BASE.replace(old, new))
    code = main(["check", str(path)])
    return code, "", path


@pytest.mark.parametrize(
    ("old", "new", "line", "phrase"),
    [
        ("share: 0.8", "share: 1.5", 7, "workload.shared_prefix.share: must be <= 1, got 1.5"),
        ("share: 0.8", "share: -0.1", 7, "workload.shared_prefix.share: must be >= 0"),
        ("turns: 2", "turns: 0", 8, "workload.conversation.turns: must be >= 1, got 0"),
        ("tokens: 512", "tokens: 1024", 7, "a system prompt of 1024 tokens does not fit"),
        ("turns: 2", "turns: 7", 8, "the last of 7 turns needs 1072 tokens"),
        ("input_tokens: 64", "dataset: rows.jsonl", 7, "shared_prefix: needs 'input_tokens'"),
        ("think_time_s: 1.5", "think_time_s: -1", 8, "must be >= 0"),
        ("share: 0.8", "share: 0.8, size: 3", 7, "unknown key"),
    ],
)
def test_check_refuses_bad_traffic(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    old: str,
    new: str,
    line: int,
    phrase: str,
) -> None:
    (tmp_path / "rows.jsonl").write_text('{"prompt": "hello"}\n')
    code, _, path = _check(tmp_path, old, new)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{path}:{line}:" in err and phrase in err, err


def test_the_traffic_example_is_valid(tmp_path: Path) -> None:
    assert _check(tmp_path, "turns: 2", "turns: 2")[0] == 0


# --------------------------------------------------------------------------- the engine's view


def test_engine_summary_has_the_share_of_prompt_tokens_served_from_cache() -> None:
    before = {
        "vllm:prompt_tokens_total": 100.0,
        "vllm:prompt_tokens_cached_total": 0.0,
        "vllm:prefix_cache_queries_total": 100.0,
        "vllm:prefix_cache_hits_total": 0.0,
    }
    after = {
        "vllm:prompt_tokens_total": 1100.0,
        "vllm:prompt_tokens_cached_total": 768.0,
        "vllm:prefix_cache_queries_total": 1300.0,
        "vllm:prefix_cache_hits_total": 800.0,
    }
    out = engine_summary(before, after, {}, registry.get("vllm").metrics)
    assert out["prompt_cached_share"] == pytest.approx(0.768)
    assert out["prefix_cache_hit_rate"] == pytest.approx(800 / 1200)
    assert cache_note(out) == "prefix cache 77% of prompt tokens (hit rate 67%)"
    # an engine without the cached-token counter: its cache hits stand in
    assert cached_share({"prompt_tokens": 200.0, "prefix_cache_hits": 50.0}) == 0.25
    assert cached_share({"prompt_tokens": 0.0}) is None
    assert cache_note({}) == ""


def test_the_latency_breakdown_shows_the_cache_share_per_config() -> None:
    pct = {"ttft": {"p50": 10.0}}
    svg = latency_breakdown_svg(
        [
            LatencyProfile("promoted", pct, cache={"prompt_cached_share": 0.8}),
            LatencyProfile("baseline", pct, cache={"prompt_cached_share": 0.0}),
        ]
    )
    assert svg.count('class="cache"') == 2
    assert 'data-share="0.8000"' in svg and "80% of prompt tokens" in svg
    assert 'class="cache"' not in latency_breakdown_svg([LatencyProfile("x", pct)])


def test_the_report_lists_the_cache_share_of_every_level(tmp_path: Path) -> None:
    from autotuner.records.trial import LevelRecord, TrialFile

    def level(share: float) -> LevelRecord:
        return LevelRecord(
            load=2.0,
            feasible=True,
            metrics={},
            margins={},
            errors={},
            engine={"prompt_cached_share": share, "prefix_cache_hit_rate": share},
            result_file="level-0.json",
        )

    (tmp_path / "trial-000").mkdir()
    trial = TrialFile(
        params={}, status="complete", load_kind="rate", levels=[level(0.5), level(0.75)]
    )
    (tmp_path / "trial-000" / "trial.json").write_text(trial.to_json())
    lines = cache_lines([(0, TrialRecord(result_file="trial-000/trial.json"))], tmp_path)
    assert lines[-1] == "  trial 0: 50% (hit 50%), 75% (hit 75%)"
    assert cache_lines([(1, TrialRecord())], tmp_path) == []
