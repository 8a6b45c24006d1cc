"""`autotuner check` validates engine options and search values against the search space.

Before, `check` accepted `engine.params` such as `gpu_memory_utilization: -1` or `"fast"`,
`max_model_len: "fast"`, and `search.params` values that were negative or words; tune then
passed them to vLLM (a failed launch per trial) or tripped over them. Now each is exit 2 with
file:line, using the space's declared types, limits and choices (for the newest engine
releases, as the message says: the version in use is known only when tuning).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.cli.main import main
from autotuner.space import (
    ParamOverride,
    SpaceError,
    load_space,
    newest_declarations,
)

BASE = """\
model: {synth: tiny-llama}
workload:
  input_tokens: 64
  output_tokens: 16
  arrival: {process: poisson, rate: 2}
  requests: 20
constraints:
  p99_ttft_ms: 500
"""


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str) -> tuple[int, str]:
    path = tmp_path / "sla.yaml"
    path.write_text(BASE + extra)
    code = main(["check", str(path)])
    return code, capsys.readouterr().err.replace(str(path), "sla.yaml")


@pytest.mark.parametrize(
    ("extra", "where", "phrase"),
    [
        (
            "engine:\n  params:\n    gpu_memory_utilization: -1\n",
            "sla.yaml:11: engine.params.gpu_memory_utilization",
            "must be a number in [0.01, 1], got -1",
        ),
        (
            "engine:\n  params:\n    gpu_memory_utilization: fast\n",
            "sla.yaml:11: engine.params.gpu_memory_utilization",
            "must be a number in [0.01, 1], got 'fast'",
        ),
        (
            "engine:\n  params:\n    max_model_len: fast\n",
            "sla.yaml:11: engine.params.max_model_len",
            "must be an integer in [1, 10000000], got 'fast'",
        ),
        (
            "engine:\n  params:\n    max_num_seqs: 0\n",
            "sla.yaml:11: engine.params.max_num_seqs",
            "must be an integer in [1, 1000000], got 0",
        ),
        (
            "engine:\n  params:\n    kv_cache_dtype: fp9\n",
            "sla.yaml:11: engine.params.kv_cache_dtype",
            "must be one of 'auto', 'fp8', got 'fp9'",
        ),
        (
            "engine:\n  params:\n    enforce_eager: 'yes'\n",
            "sla.yaml:11: engine.params.enforce_eager",
            "must be true or false",
        ),
        (
            "engine:\n  params:\n    max_num_seq: 8\n",
            "sla.yaml:11: engine.params.max_num_seq",
            "not an option an SLA may set",
        ),
        (
            "search:\n  params:\n    max_num_seqs: {values: [8, -4]}\n",
            "sla.yaml:11: search.params.max_num_seqs.values[1]",
            "must be an integer in [1, 1000000], got -4",
        ),
        (
            "search:\n  params:\n    max_num_seqs: {values: [8, many]}\n",
            "sla.yaml:11: search.params.max_num_seqs.values[1]",
            "got 'many'",
        ),
        (
            "search:\n  params:\n    max_num_batched_tokens:\n      low: -5\n",
            "sla.yaml:12: search.params.max_num_batched_tokens.low",
            "must be an integer in [1, 10000000], got -5",
        ),
        (
            "search:\n  params:\n    gpu_memory_utilization: {fixed: 1.5}\n",
            "sla.yaml:11: search.params.gpu_memory_utilization.fixed",
            "must be a number in [0.01, 1], got 1.5",
        ),
        (
            "search:\n  params:\n    performance_mode: {values: [balanced, fastest]}\n",
            "sla.yaml:11: search.params.performance_mode.values[1]",
            "must be one of 'balanced', 'interactivity', 'throughput', got 'fastest'",
        ),
        (
            "search:\n  params:\n    max_num_seq: {values: [8]}\n",
            "sla.yaml:11: search.params.max_num_seq",
            "not a parameter of the search space (vllm.yaml) (did you mean 'max_num_seqs'?)",
        ),
    ],
)
def test_check_refuses_what_the_space_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, where: str, phrase: str
) -> None:
    code, err = _check(tmp_path, capsys, extra)
    assert code == 2, err
    assert f"{where}: " in err, err
    assert phrase in err, err


def test_messages_say_which_space_and_version_they_checked_against(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, err = _check(tmp_path, capsys, "engine:\n  params:\n    gpu_memory_utilization: -1\n")
    assert "search_spaces/vllm.yaml for the newest vLLM" in err, err
    assert "version is checked when tuning" in err, err


def test_a_duplicate_key_is_reported_with_both_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _check(
        tmp_path, capsys, "engine:\n  params:\n    max_num_seqs: 8\n    max_num_seqs: 16\n"
    )
    assert code == 2
    assert "sla.yaml:12: engine.params.max_num_seqs: duplicate key (first given on line 11)" in err


def test_a_negative_seed_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _check(tmp_path, capsys, "tune: {seed: -1}\n")
    assert code == 2 and "sla.yaml:9: tune.seed: must be >= 0, got -1" in err, err


def test_values_inside_the_limits_but_outside_the_search_range_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Limits are what the engine accepts, wider than what is searched (0.3 on the CPU)."""
    code, err = _check(
        tmp_path,
        capsys,
        "engine:\n  params: {gpu_memory_utilization: 0.3, max_num_seqs: 3, load_format: dummy}\n"
        "search:\n  params:\n    max_num_batched_tokens: {low: 128, high: 65536}\n"
        "    block_size: {values: [16, 512]}\n    quantization: {values: [null, fp8]}\n"
        "  allow_lossy: true\n",
    )
    assert code == 0, err


def test_tune_refuses_the_same_values_when_it_resolves_the_space() -> None:
    def load(name: str, override: dict[str, object]) -> None:
        load_space(
            "vllm",
            "0.32.0",
            device="gpu",
            gpu_count=1,
            compute_capability=(9, 0),
            allow_lossy=False,
            overrides={name: ParamOverride.model_validate(override)},
        )

    with pytest.raises(SpaceError, match=r"search.max_num_seqs.values: must be an integer"):
        load("max_num_seqs", {"values": [8, -4]})
    with pytest.raises(SpaceError, match=r"search.gpu_memory_utilization.fixed: must be"):
        load("gpu_memory_utilization", {"fixed": 1.5})
    with pytest.raises(SpaceError, match=r"search.max_num_batched_tokens.high: must be"):
        load("max_num_batched_tokens", {"high": 10**12})


def test_space_files_keep_their_own_values_inside_their_limits(tmp_path: Path) -> None:
    (tmp_path / "vllm.yaml").write_text(
        "engine: vllm\nformat: 1\nparams:\n"
        "  - {name: a, type: int, low: 1, high: 64, default: 0, limits: {low: 1, high: 32}}\n"
        "  - {name: b, type: categorical, choices: [x], limits: {low: 1}}\n"
    )
    with pytest.raises(SpaceError) as err:
        newest_declarations("vllm", directory=tmp_path)
    text = str(err.value)
    assert "params.a.limits: 64, named in the file, is outside them" in text
    assert "params.a.limits: 0, named in the file, is outside them" in text
    assert "params.b.limits: only an int or float has limits" in text


def test_every_numeric_option_of_the_shipped_space_has_limits() -> None:
    declared = newest_declarations("vllm")
    numeric = {n: r for n, r in declared.rules.items() if r.type in ("int", "float")}
    assert numeric
    assert {n for n, r in numeric.items() if r.low is None or r.high is None} == set()
