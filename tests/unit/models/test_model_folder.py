"""A hostile model folder is bad input (issue 27, section 3): a config.json or tokenizer.json
that is not UTF-8, not JSON, nested past the stack, or a config with values no model has
(negative layers, zero heads, absurd sizes) is refused with the file and field named, exit
2, never a ValueError, RecursionError, UnicodeDecodeError or ZeroDivisionError (exit 70)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from autotuner.cli.main import main
from autotuner.models.folder import ModelFolderError, config_problems, read_config
from autotuner.models.synth import ARCHS, vocab_words
from autotuner.sla.spec import SlaError, load_sla
from autotuner.workload.requests import PromptSource

SLA = """\
name: hostile
model: {path: model}
target: cpu
workload: {input_tokens: 16, output_tokens: 8, arrival: {process: poisson, rate: 1}, requests: 10}
constraints: {p99_ttft_ms: 500}
"""
GOOD = ARCHS["tiny-llama"].config()


def _with(**changes: object) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(json.dumps({**GOOD, **changes}))

    return write


def _raw(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "not JSON": (_raw(b"{not json"), "not JSON"),
    "duplicate key": (
        _raw(b'{"model_type": "llama", "model_type": "x"}'),
        'duplicate key "model_type"',
    ),
    "nested past the stack": (_raw(b"[" * 100_000), "nested too deep"),
    "not UTF-8": (_raw(b'{"model_type": "\xff\xfe"}'), "not UTF-8"),
    "not an object": (_raw(b"[1, 2]"), "a JSON object was expected, found list"),
    "negative layers": (_with(num_hidden_layers=-4), "num_hidden_layers: -4 is outside"),
    "zero heads": (_with(num_attention_heads=0), "num_attention_heads: 0 is outside"),
    "absurd size": (_with(hidden_size=10**12), "hidden_size: 1000000000000 is outside"),
    "not a number": (_with(vocab_size="8192"), "vocab_size: '8192' is not a whole number"),
    "a boolean": (_with(num_hidden_layers=True), "num_hidden_layers: True is not"),
    "more kv heads": (_with(num_key_value_heads=8), "num_key_value_heads: 8 is more than"),
    "heads past the hidden size": (
        _with(hidden_size=2, head_dim=None),
        "hidden_size: 2 is less than num_attention_heads",
    ),
    "text_config not an object": (_with(text_config=[1]), "text_config: a JSON object"),
    "text_config with zero layers": (
        _with(text_config={"num_hidden_layers": 0}),
        "text_config.num_hidden_layers: 0 is outside",
    ),
}


def _folder(tmp_path: Path, write: Callable[[Path], None]) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    write(model / "config.json")
    (tmp_path / "sla.yaml").write_text(SLA)
    return model


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_config_is_refused_by_name(tmp_path: Path, case: str) -> None:
    write, said = HOSTILE[case]
    model = _folder(tmp_path, write)
    with pytest.raises(ModelFolderError) as err:
        read_config(model)
    assert str(model / "config.json") in str(err.value) and said in str(err.value)
    with pytest.raises(SlaError) as bad:  # every command loads its SLA first: refused there
        load_sla(tmp_path / "sla.yaml")
    assert "model.path" in str(bad.value) and said in str(bad.value)


@pytest.mark.parametrize("case", ["nested past the stack", "zero heads", "not UTF-8"])
def test_check_with_layouts_exits_2_on_a_hostile_config(
    tmp_path: Path,
    case: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    _folder(tmp_path, HOSTILE[case][0])
    argv = ["check", str(tmp_path / "sla.yaml"), "--layouts", "--engine-version", "0.32.0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "internal error" not in err


def test_a_fifo_config_is_refused_without_blocking(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    os.mkfifo(model / "config.json")
    with pytest.raises(ModelFolderError, match="not a regular file"):
        read_config(model)


def test_real_shapes_pass() -> None:
    for name, arch in ARCHS.items():
        assert config_problems(arch.config()) == [], name
    wrapped = {"architectures": ["X"], "text_config": GOOD}
    assert config_problems(wrapped) == []


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"{not json", "not JSON"),
        (b"[" * 100_000, "nested too deep"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b'{"model": 3}', "not the tokenizer autotuner generated"),
    ],
    ids=["not JSON", "nested past the stack", "not UTF-8", "not a synth tokenizer"],
)
def test_a_hostile_tokenizer_is_refused_by_name(tmp_path: Path, data: bytes, said: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(GOOD))
    (model / "tokenizer.json").write_bytes(data)
    (model / "autotuner-synth.json").write_text("{}")  # prompts come from its words
    with pytest.raises(ModelFolderError, match=said):
        vocab_words(model)
    with pytest.raises(ModelFolderError, match=said):
        PromptSource.from_model_dir(model)


def test_a_config_without_a_vocabulary_is_refused_for_prompts(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelFolderError, match="no vocab_size"):
        PromptSource.from_model_dir(model)
