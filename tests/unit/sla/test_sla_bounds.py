"""Values that `check` used to accept and `tune` then tripped over: each is exit 2 with file:line.

Every case here was accepted by `autotuner check` before (issue: bad input that check passes),
and later hung a run (`.inf` durations), raised a traceback (NaN limits, bad storage URLs,
unknown archs, non-JSONL datasets) or asked the engine for more than its context.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.cli.main import main

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


def _sla(tmp_path: Path, old: str, new: str) -> Path:
    assert old in BASE
    path = tmp_path / "sla.yaml"
    path.write_text(BASE.replace(old, new))
    return path


@pytest.mark.parametrize(
    ("old", "new", "line", "phrase"),
    [
        ("requests: 20", "duration_s: .inf", 6, "workload.duration_s: Input should be a finite"),
        ("p99_ttft_ms: 500", "p99_ttft_ms: .nan", 8, "finite number"),
        ("rate: 2}", "rate: .inf}", 5, "finite number"),
        ("input_tokens: 64", "input_tokens: 100000000000000000000000000", 3, "must be <= 10000000"),
        ("requests: 20", "requests: 20\n  seed: -1", 7, "workload.seed"),
        ("{synth: tiny-llama}", "{synth: llama-9000}", 1, "unknown architecture"),
        ("p99_ttft_ms: 500", "p99_ttft_ms: 500\ntune: {storage: not a url}", 9, "database URL"),
        ("input_tokens: 64", "input_tokens: 4090", 3, "does not fit the model's context"),
        (
            "model: {synth: tiny-llama}",
            "model: {synth: tiny-llama}\nengine:\n  params: {max_model_len: 70}",
            5,
            "context of 70 tokens",
        ),
    ],
)
def test_check_refuses(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    old: str,
    new: str,
    line: int,
    phrase: str,
) -> None:
    path = _sla(tmp_path, old, new)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}:" in err, err
    assert phrase in err, err


def test_dataset_that_is_not_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "hello"}\nthis is not json\n')
    path = _sla(tmp_path, "input_tokens: 64", f"dataset: {data}")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3: workload.dataset:" in err, err
    assert f"{data}:2: not JSON" in err, err


def test_the_base_file_is_valid(tmp_path: Path) -> None:
    assert main(["check", str(_sla(tmp_path, "requests: 20", "requests: 20"))]) == 0
