"""The quality gate's arithmetic: token agreement over shared context, top-k KL, verdicts,
and the dummy-weights case (nothing launched)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.engines import registry
from autotuner.measure import gate
from autotuner.measure.quality import (
    DUMMY_WEIGHTS,
    Completion,
    Limits,
    builtin_prompts,
    compare,
    dataset_prompts,
    judge,
    kl_topk,
)
from autotuner.models import synth
from autotuner.sla.spec import SlaError, parse_sla, to_yaml

FLAT = {"a": math.log(0.5), "b": math.log(0.5)}


def done(tokens: str, tops: list[dict[str, float]] | None = None) -> Completion:
    """A completion of one-letter tokens; each position's top-k prefers its own token."""
    top = tops or [{t: math.log(0.9), "z": math.log(0.1)} for t in tokens]
    return Completion(tuple(tokens), tuple(top))


def test_identical_completions_agree_fully_with_no_divergence() -> None:
    a = compare([done("abc"), done("xy")], [done("abc"), done("xy")])
    assert (a.positions, a.agreed, a.identical) == (5, 5, 2)
    assert a.token_agreement == 1.0 and a.exact_match == 1.0
    assert a.mean_kl == pytest.approx(0.0, abs=1e-12)


def test_positions_after_the_first_difference_are_not_compared() -> None:
    # Differs at position 2: positions 0, 1 agree, 2 disagrees, 3-4 continue another text.
    a = compare([done("abcde")], [done("abxyz")])
    assert (a.positions, a.agreed, a.identical) == (3, 2, 0)
    assert a.token_agreement == pytest.approx(2 / 3)
    assert a.exact_match == 0.0


def test_shorter_completion_limits_the_compared_positions() -> None:
    a = compare([done("abcd")], [done("ab")])
    assert (a.positions, a.agreed, a.identical) == (2, 2, 0)


def test_kl_topk_is_zero_for_equal_and_grows_with_the_shift() -> None:
    assert kl_topk(FLAT, FLAT) == pytest.approx(0.0, abs=1e-12)
    near = {"a": math.log(0.55), "b": math.log(0.45)}
    far = {"a": math.log(0.9), "b": math.log(0.1)}
    assert 0 < kl_topk(FLAT, near) < kl_topk(FLAT, far)
    # By hand: KL((.5,.5) || (.9,.1)) = .5 ln(.5/.9) + .5 ln(.5/.1)
    assert kl_topk(FLAT, far) == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(5))


def test_kl_topk_gives_a_missing_token_the_candidates_lowest_logprob() -> None:
    base = {"a": math.log(0.6), "b": math.log(0.4)}
    cand = {"a": math.log(0.7), "c": math.log(0.2)}  # b is not in the candidate's top-k
    expected = kl_topk(base, {"a": math.log(0.7), "b": math.log(0.2)})
    assert kl_topk(base, cand) == pytest.approx(expected)


def test_mean_kl_is_over_compared_positions() -> None:
    base = done("ab", [FLAT, FLAT])
    shifted = {"a": math.log(0.9), "b": math.log(0.1)}
    cand = done("ab", [FLAT, shifted])
    a = compare([base], [cand])
    assert a.mean_kl == pytest.approx(kl_topk(FLAT, shifted) / 2)
    assert a.max_kl == pytest.approx(kl_topk(FLAT, shifted))


def test_verdicts_against_the_limits() -> None:
    close = compare([done("abcdefghij")], [done("abcdefghiX")])  # 9 of 10
    assert judge(close, Limits(0.85, 0.05)).verdict == "pass"
    failed = judge(close, Limits(0.95, 0.05))
    assert failed.verdict == "fail"
    assert "token agreement 90.0% < 95.0%" in failed.reason
    shifted = {"a": math.log(0.99), "b": math.log(0.01)}
    drift = compare([done("a", [FLAT])], [done("a", [shifted])])
    by_kl = judge(drift, Limits(0.5, 0.1))
    assert by_kl.verdict == "fail" and "mean KL" in by_kl.reason
    assert by_kl.token_agreement == 1.0


def test_nothing_to_compare_is_not_measurable() -> None:
    empty = compare([done("")], [done("")])
    assert judge(empty, Limits(0.9, 0.1)).verdict == "not_measurable"


def test_the_repeat_of_the_baseline_is_reported_beside() -> None:
    a = compare([done("ab")], [done("ab")])
    r = judge(a, Limits(0.9, 0.1), repeat=compare([done("ab")], [done("aX")]))
    assert r.verdict == "pass"
    assert r.repeat_agreement == 0.5


def test_completion_from_a_completions_response() -> None:
    choice: dict[str, Any] = {
        "text": " a b",
        "logprobs": {
            "tokens": [" a", " b"],
            "token_logprobs": [-0.1, -0.7],
            "top_logprobs": [{" a": -0.1, " c": -2.5}, {" c": -0.6}],
        },
    }
    c = Completion.from_choice(choice)
    assert c.tokens == (" a", " b")
    assert c.top[0] == {" a": -0.1, " c": -2.5}
    assert c.top[1] == {" c": -0.6, " b": -0.7}  # the chosen token is always in its top-k


def test_prompts_from_a_dataset_or_builtin() -> None:
    rows = [
        {"prompt": "one"},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]},
        {"prompt": "three"},
    ]
    assert dataset_prompts(rows, 2) == ["one", "s\nu"]
    assert len(builtin_prompts(40)) == 40
    assert builtin_prompts(2) == list(builtin_prompts(40)[:2])


def sla_yaml(tmp_path: Path, model: dict[str, Any], **extra: Any) -> Any:
    data = {
        "name": "q",
        "model": model,
        "workload": {
            "input_tokens": 8,
            "output_tokens": 4,
            "arrival": {"process": "poisson", "rate": 1.0},
            "requests": 2,
        },
        **extra,
    }
    return parse_sla(yaml.safe_dump(data))


def test_dummy_weights_are_not_measured_and_nothing_is_launched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = synth.synthesize("llama-3.1-8b", tmp_path / "m")  # config only: dummy weights
    sla = sla_yaml(tmp_path, {"path": str(model)})

    def no_launch(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the gate launched an engine on dummy weights")

    monkeypatch.setattr(gate, "make_engine", no_launch)
    result = gate.run_gate(
        sla,
        engine=registry.get(sla.engine.kind),
        python=Path("/nonexistent"),
        model_dir=model,
        baseline={},
        candidate={"kv_cache_dtype": "fp8"},
        run_dir=tmp_path / "g",
        say=lambda _: None,
    )
    assert result.verdict == "not_measurable"
    assert result.reason == DUMMY_WEIGHTS
    assert result.min_token_agreement == 0.95  # the SLA's (default) limits, for the record


def test_load_format_dummy_is_dummy_even_with_weight_files(tmp_path: Path) -> None:
    model = synth.synthesize("tiny-llama", tmp_path / "tiny")
    sla = sla_yaml(tmp_path, {"path": str(model)}, engine={"params": {"load_format": "dummy"}})
    engine = registry.get(sla.engine.kind)
    assert gate.random_weights(engine, model, {"load_format": "dummy"})
    assert not gate.random_weights(engine, model, {})


def test_quality_section_defaults_and_bad_values(tmp_path: Path) -> None:
    sla = sla_yaml(tmp_path, {"synth": "tiny-llama"})
    assert sla.quality.limits == Limits(0.95, 0.05)
    assert sla.quality.promote_unmeasured is False
    with pytest.raises(SlaError, match=r"<string>:\d+: quality\.min_token_agreement: must be <= 1"):
        sla_yaml(tmp_path, {"synth": "tiny-llama"}, quality={"min_token_agreement": 1.5})
    with pytest.raises(SlaError, match=r"quality\.promote_unmeasured"):
        sla_yaml(tmp_path, {"synth": "tiny-llama"}, quality={"promote_unmeasured": "yes"})


def test_the_gate_asks_the_workloads_dataset_prompts_else_builtin_ones(tmp_path: Path) -> None:
    data = tmp_path / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"question {i}"}], "output_tokens": 4}
        for i in range(3)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    workload = {"dataset": str(data), "arrival": {"process": "poisson", "rate": 1.0}}
    sla = parse_sla(
        yaml.safe_dump({"model": {"synth": "tiny-llama"}, "workload": {**workload, "requests": 2}})
    )
    assert gate.prompts_for(sla, 2) == ["question 0", "question 1"]
    assert gate.prompts_for(sla, 5) == ["question 0", "question 1", "question 2"]
    data.write_text("not json\n")  # changed after the check: the gate still has prompts
    assert gate.prompts_for(sla, 2) == builtin_prompts(2)
    plain = sla_yaml(tmp_path, {"synth": "tiny-llama"})
    assert gate.prompts_for(plain, 3) == builtin_prompts(3)


def test_the_quality_section_survives_a_dump_and_is_absent_when_default(tmp_path: Path) -> None:
    sla = sla_yaml(
        tmp_path,
        {"synth": "tiny-llama"},
        quality={"prompts": 4, "promote_unmeasured": True},
    )
    text = to_yaml(sla)
    assert parse_sla(text).quality == sla.quality  # e.g. the daemon's job file
    assert "quality" not in to_yaml(sla_yaml(tmp_path, {"synth": "tiny-llama"}))
