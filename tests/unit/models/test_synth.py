"""Unit tests for autotuner.models.synth: configs, tokenizer coverage, safetensors layout,
idempotence."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autotuner.cli import model as model_cli
from autotuner.models import synth

EXPECTED_KEYS = {
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
    "torch_dtype",
    "bos_token_id",
    "eos_token_id",
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every arch synthesized once for the module (all archs take about a second)."""
    root = tmp_path_factory.mktemp("models")
    return {a: synth.synthesize(a, root / a) for a in synth.ARCHS}


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def test_archs_present() -> None:
    for a in ("tiny-llama", "tiny-qwen3", "llama-3.1-8b", "llama-3.1-70b", "qwen3-8b"):
        assert a in synth.ARCHS
    assert "mistral-7b" in synth.ARCHS
    assert synth.ARCHS["tiny-llama"].has_weights
    assert synth.ARCHS["small-llama"].has_weights
    assert not synth.ARCHS["llama-3.1-8b"].has_weights


@pytest.mark.parametrize("arch", list(synth.ARCHS))
def test_config(models: dict[str, Path], arch: str) -> None:
    cfg = _json(models[arch] / "config.json")
    assert cfg.keys() >= EXPECTED_KEYS
    assert cfg == synth.ARCHS[arch].config()
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert 0 <= cfg["eos_token_id"] < cfg["vocab_size"]
    for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (models[arch] / name).is_file()
    tc = _json(models[arch] / "tokenizer_config.json")
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tc["add_bos_token"] is False
    assert "chat_template" in tc
    assert synth.needs_dummy_load(models[arch]) is not synth.ARCHS[arch].has_weights


def test_real_configs() -> None:
    c = synth.ARCHS["llama-3.1-8b"].config()
    assert (c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]) == (4096, 32, 128256)
    assert c["rope_scaling"]["rope_type"] == "llama3"
    assert (c["bos_token_id"], c["eos_token_id"]) == (128000, 128001)
    q = synth.ARCHS["qwen3-8b"].config()
    assert (q["intermediate_size"], q["num_hidden_layers"], q["vocab_size"]) == (12288, 36, 151936)
    # Parameter counts of the public models, to within 1%.
    for arch, want in (("llama-3.1-8b", 8.03e9), ("llama-3.1-70b", 70.6e9), ("qwen3-8b", 8.19e9)):
        got = synth.param_count(synth.ARCHS[arch].config(), synth.ARCHS[arch].family)
        assert abs(got - want) / want < 0.01, (arch, got)


@pytest.mark.parametrize("arch", list(synth.ARCHS))
def test_tokenizer_covers_vocab(models: dict[str, Path], arch: str) -> None:
    cfg = _json(models[arch] / "config.json")
    tok = _json(models[arch] / "tokenizer.json")
    vocab: dict[str, int] = tok["model"]["vocab"]
    v = cfg["vocab_size"]
    assert len(vocab) == v
    assert sorted(vocab.values()) == list(range(v))
    assert tok["model"]["type"] == "WordLevel"
    assert tok["post_processor"] is None
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    for content, i in added.items():
        assert vocab[content] == i  # specials hold their own ids inside the vocab too
    tc = _json(models[arch] / "tokenizer_config.json")
    if tc["bos_token"] is not None:
        assert added[tc["bos_token"]] == cfg["bos_token_id"]
    assert added[tc["eos_token"]] == cfg["eos_token_id"]
    words = synth.vocab_words(models[arch])
    assert len(words) == v - len(added)
    assert len(set(words)) == len(words)
    assert all(w.isalpha() and w.islower() for w in words)


def test_llama_specials(models: dict[str, Path]) -> None:
    tok = _json(models["llama-3.1-8b"] / "tokenizer.json")
    added = {t["id"]: t["content"] for t in tok["added_tokens"]}
    assert added[128000] == "<|begin_of_text|>"
    assert added[128001] == "<|end_of_text|>"
    assert added[128009] == "<|eot_id|>"


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen3", "small-llama"])
def test_safetensors(models: dict[str, Path], arch: str) -> None:
    cfg = _json(models[arch] / "config.json")
    path = models[arch] / synth.WEIGHTS_NAME
    header = synth.read_safetensors_header(path)
    with path.open("rb") as f:
        hlen = int.from_bytes(f.read(8), "little")
    assert (8 + hlen) % 8 == 0
    assert header.pop("__metadata__") == {"format": "pt"}
    h, v, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * hd
    assert header["model.embed_tokens.weight"]["shape"] == [v, h]
    assert header["lm_head.weight"]["shape"] == [v, h]
    assert header["model.norm.weight"]["shape"] == [h]
    last = cfg["num_hidden_layers"] - 1
    assert header[f"model.layers.{last}.self_attn.k_proj.weight"]["shape"] == [kv, h]
    assert header["model.layers.0.mlp.down_proj.weight"]["shape"] == [
        h,
        cfg["intermediate_size"],
    ]
    if arch == "tiny-qwen3":
        assert header["model.layers.0.self_attn.q_norm.weight"]["shape"] == [hd]
    end = 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        assert t["dtype"] == "BF16"
        start, stop = t["data_offsets"]
        assert start == end, name  # contiguous, no overlap
        assert stop - start == int(np.prod(t["shape"])) * 2, name
        end = stop
    assert path.stat().st_size == 8 + hlen + end
    n_params = sum(int(np.prod(t["shape"])) for t in header.values())
    assert n_params == synth.param_count(cfg, synth.ARCHS[arch].family)

    # Values: norms are 1.0, matrices small and centred.
    raw = path.read_bytes()[8 + hlen :]

    def tensor(name: str) -> np.ndarray[Any, np.dtype[np.float32]]:
        s, e = header[name]["data_offsets"]
        bits = np.frombuffer(raw[s:e], dtype="<u2").astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32)

    assert np.all(tensor("model.norm.weight") == 1.0)
    q = tensor("model.layers.0.self_attn.q_proj.weight")
    assert abs(float(q.mean())) < 0.002
    assert 0.015 < float(q.std()) < 0.025


def test_deterministic(tmp_path: Path) -> None:
    a = synth.synthesize("tiny-llama", tmp_path / "a", seed=3)
    b = synth.synthesize("tiny-llama", tmp_path / "b", seed=3)
    c = synth.synthesize("tiny-llama", tmp_path / "c", seed=4)
    wa = (a / synth.WEIGHTS_NAME).read_bytes()
    assert wa == (b / synth.WEIGHTS_NAME).read_bytes()
    assert wa != (c / synth.WEIGHTS_NAME).read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_idempotent_and_force(tmp_path: Path) -> None:
    out = tmp_path / "m"
    synth.synthesize("tiny-qwen3", out)
    weights = out / synth.WEIGHTS_NAME
    weights.write_bytes(b"sentinel")  # a rewrite would replace this
    synth.synthesize("tiny-qwen3", out)
    assert weights.read_bytes() == b"sentinel"
    synth.synthesize("tiny-qwen3", out, force=True)
    assert weights.stat().st_size > 1_000_000
    # Another arch in the same dir: rebuilt, old files gone.
    synth.synthesize("llama-3.1-8b", out)
    assert not weights.exists()
    assert _json(out / synth.MARKER_NAME)["arch"] == "llama-3.1-8b"
    # An incomplete model (a listed file missing) is rebuilt.
    (out / "tokenizer.json").unlink()
    synth.synthesize("llama-3.1-8b", out)
    assert (out / "tokenizer.json").is_file()
    # No temp dirs left beside the model.
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_refuses_foreign_dir(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        synth.synthesize("tiny-llama", out)
    assert (out / "notes.txt").read_text() == "keep me"
    synth.synthesize("tiny-llama", out, force=True)
    assert not (out / "notes.txt").exists()
    with pytest.raises(KeyError):
        synth.synthesize("no-such-arch", tmp_path / "x")


def test_default_dir_and_main(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    assert synth.default_model_dir("tiny-llama") == (tmp_path / "home" / "models" / "tiny-llama")
    assert model_cli.main_synth("tiny-llama", None, False) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(synth.default_model_dir("tiny-llama"))
    assert "vocab 8192" in out[1] and "params" in out[1] and "random weights" in out[1]
    assert model_cli.main_synth("qwen3-8b", str(tmp_path / "q"), False) == 0
    assert "--load-format dummy" in capsys.readouterr().out
    assert model_cli.main_synth("gpt-9", None, False) == 2
    err = capsys.readouterr().err
    assert "gpt-9" in err and "tiny-llama" in err


@pytest.mark.parametrize("arch", ["tiny-llama", "qwen3-8b", "mistral-7b"])
def test_tokenizers_roundtrip(models: dict[str, Path], arch: str) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(models[arch] / "tokenizer.json"))
    cfg = _json(models[arch] / "config.json")
    assert tok.get_vocab_size() == cfg["vocab_size"]
    words = synth.vocab_words(models[arch])
    rng = random.Random(0)
    prompt = " ".join(rng.choice(words) for _ in range(50))
    enc = tok.encode(prompt)
    assert len(enc.ids) == 50  # N words -> N tokens, nothing added
    assert tok.decode(enc.ids) == prompt
    # Extra whitespace does not change the count; unknown words become <unk>, still one each.
    assert len(tok.encode("  " + prompt.replace(" ", "\n\t ") + " ").ids) == 50
    assert tok.encode("zzzz-unknown " + words[0]).ids == [
        tok.token_to_id(synth.UNK_TOKEN),
        tok.token_to_id(words[0]),
    ]
    # Every id decodes, specials included.
    v = cfg["vocab_size"]
    assert tok.decode([v - 1, 0], skip_special_tokens=False)
    assert tok.id_to_token(v - 1) is not None
