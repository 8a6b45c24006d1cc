"""Synthesized models: real architectures, generated weights and tokenizers.

No model weights can be downloaded where the autotuner is developed and tested, so models are
generated here:

* ``tiny-*`` archs (``tiny-llama``, ``tiny-qwen3``) and ``small-llama`` get a small config
  *and random weights* written as ``model.safetensors`` (BF16, written with numpy only, no
  torch), so an engine loads them the normal way. They are for CPU engines and tests;
  ``small-llama`` (8 layers, 107M parameters) is for CPU benchmarks whose engine work should
  outweigh the HTTP and client work around it.
* The other archs (``llama-3.1-8b``, ``llama-3.1-70b``, ``qwen3-8b``, ``mistral-7b``) get the
  real public ``config.json`` and a tokenizer but no weights: serve them with
  ``--load-format dummy`` (see :func:`needs_dummy_load`). Their configs are the real ones, so a
  memory model can compute weight and KV-cache bytes from them.

The tokenizer
-------------
Every model gets a hand-written ``tokenizer.json`` (tokenizers-library format) that covers the
model's *whole* vocabulary: ids ``0..vocab_size-1`` all exist, with no gaps, so every id the
model can sample decodes (a smaller tokenizer made vLLM's detokenizer the bottleneck on an H200).

* Model: ``WordLevel``; pre-tokenizer ``WhitespaceSplit``; decoder re-joins tokens with single
  spaces; no normalizer and **no post-processor**.
* Special tokens sit where the real family puts them (e.g. ``<|begin_of_text|>`` at 128000 for
  Llama 3.1) and are listed both in the model vocab and as added special tokens. An ``<unk>``
  special token takes one otherwise reserved/padding slot.
* Every other id is a short pronounceable pseudo-word (``ba``, ``kitu``, ``moravi``...), the
  shortest ones at the lowest ids; :func:`vocab_words` returns them.

Token counts: a prompt of N plain words (separated by whitespace) encodes to **exactly N
tokens**. No BOS/EOS is added (no post-processor, ``add_bos_token: false``), for completions and
chat alike. The chat template concatenates the messages' contents separated by spaces, with no
role markers, so a chat request's prompt is also exactly the total number of words in its
messages.

The output directory is written atomically (built beside it, then renamed into place) and
carries a marker file ``autotuner-synth.json``; :func:`synthesize` returns early when the
directory already holds a complete model of the same arch, format version and seed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from autotuner.core import paths
from autotuner.models.folder import ModelFolderError, read_tokenizer
from autotuner.records.synth import SynthMarker

__all__ = [
    "ARCHS",
    "FORMAT_VERSION",
    "MARKER_NAME",
    "WEIGHTS_NAME",
    "ArchSpec",
    "default_model_dir",
    "needs_dummy_load",
    "param_count",
    "read_safetensors_header",
    "synthesize",
    "vocab_words",
]

# Bump when anything written changes, so that older synthesized dirs get rebuilt.
FORMAT_VERSION = 1
MARKER_NAME = "autotuner-synth.json"
WEIGHTS_NAME = "model.safetensors"
UNK_TOKEN = "<unk>"
INIT_STD = 0.02

# Suffixes of weight files an engine would load; a dir with none of them needs dummy loading.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")

# Space-joined concatenation of the messages: no role markers, so chat prompt tokens are
# exactly the words of the messages. Reading message['content'] as a string makes vLLM pick
# the "string" content format (it flattens OpenAI content parts first).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if not loop.first %} {% endif -%}"
    "{{ message['content'] }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %} {% endif -%}"
)


@dataclass(frozen=True)
class TokenLayout:
    """Where the special tokens of a tokenizer live.

    ``specials`` maps id -> (content, special flag); every id not in it is a plain word.
    ``bos``/``eos``/``pad`` name the tokenizer roles (contents, not ids); ``eos_ids`` is what
    generation_config.json lists as stop ids.
    """

    specials: dict[int, tuple[str, bool]]
    bos: str | None
    eos: str
    pad: str | None
    eos_ids: tuple[int, ...]

    def id_of(self, content: str) -> int:
        for i, (c, _) in self.specials.items():
            if c == content:
                return i
        raise KeyError(content)


@dataclass(frozen=True)
class ArchSpec:
    """One synthesizable architecture.

    ``build_config()`` returns a fresh HF ``config.json`` dict; ``build_layout(vocab_size)``
    places the special tokens; ``has_weights`` says whether random weights are written (tiny
    archs) or the engine must use ``--load-format dummy``.
    """

    name: str
    family: str  # "llama" | "qwen3" | "mistral": decides tensor names and special tokens
    build_config: Callable[[], dict[str, Any]]
    build_layout: Callable[[int], TokenLayout]
    has_weights: bool
    description: str

    def config(self) -> dict[str, Any]:
        return self.build_config()

    def layout(self) -> TokenLayout:
        return self.build_layout(int(self.config()["vocab_size"]))


# --------------------------------------------------------------------------- special tokens


def _llama3_layout(vocab_size: int) -> TokenLayout:
    """Llama 3.1's 256 special tokens at the top of the vocab (128000.. for the real models)."""
    base = vocab_size - 256
    named = {
        0: "<|begin_of_text|>",
        1: "<|end_of_text|>",
        4: "<|finetune_right_pad_id|>",
        6: "<|start_header_id|>",
        7: "<|end_header_id|>",
        8: "<|eom_id|>",
        9: "<|eot_id|>",
        10: "<|python_tag|>",
    }
    specials: dict[int, tuple[str, bool]] = {}
    reserved = 0
    for off in range(255):
        if off in named:
            specials[base + off] = (named[off], True)
        else:
            specials[base + off] = (f"<|reserved_special_token_{reserved}|>", True)
            reserved += 1
    # The real tokenizer has no unk; the last reserved slot becomes it (WordLevel needs one).
    specials[base + 255] = (UNK_TOKEN, True)
    return TokenLayout(
        specials=specials,
        bos="<|begin_of_text|>",
        eos="<|end_of_text|>",
        pad=None,
        eos_ids=(base + 1, base + 8, base + 9),
    )


_QWEN3_SPECIALS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    # Qwen3 marks these as added but not special: they survive skip_special_tokens.
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
_QWEN3_REAL_BASE = 151643


def _qwen3_layout(vocab_size: int) -> TokenLayout:
    """Qwen3's added tokens at 151643.. (real vocab) or 32 below the top (tiny vocab)."""
    base = _QWEN3_REAL_BASE if vocab_size > _QWEN3_REAL_BASE + 64 else vocab_size - 32
    specials = {base + i: tok for i, tok in enumerate(_QWEN3_SPECIALS)}
    # Qwen3 pads its embedding past the tokenizer; the first padding slot becomes <unk>.
    specials[base + len(_QWEN3_SPECIALS)] = (UNK_TOKEN, True)
    return TokenLayout(
        specials=specials,
        bos=None,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        eos_ids=(base + 2, base),
    )


def _mistral_v3_layout(vocab_size: int) -> TokenLayout:
    """Mistral v0.3 (vocab 32768): <unk> <s> </s>, tool tokens, then [control_8..768]."""
    del vocab_size  # the control tokens sit at the bottom whatever the size
    names = [
        UNK_TOKEN,
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[TOOL_CALLS]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
    ]
    specials = {i: (n, True) for i, n in enumerate(names)}
    for i in range(10, 771):
        specials[i] = (f"[control_{i - 2}]", True)
    return TokenLayout(specials=specials, bos="<s>", eos="</s>", pad=None, eos_ids=(2,))


# --------------------------------------------------------------------------- configs


def _llama3_rope() -> dict[str, Any]:
    return {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }


def _llama_config(
    *,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    max_pos: int,
    rope_theta: float,
    rope_scaling: dict[str, Any] | None,
    layout: TokenLayout,
) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": layout.id_of(layout.bos) if layout.bos else None,
        "eos_token_id": layout.id_of(layout.eos),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_pos,
        "mlp_bias": False,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-5,
        "rope_scaling": rope_scaling,
        "rope_theta": rope_theta,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        # As in the public config; transformers 5 also keys a tokenizer regex check on it.
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": vocab,
    }


def _cfg_llama31_8b() -> dict[str, Any]:
    return _llama_config(
        hidden=4096,
        intermediate=14336,
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=128256,
        max_pos=131072,
        rope_theta=500000.0,
        rope_scaling=_llama3_rope(),
        layout=_llama3_layout(128256),
    )


def _cfg_llama31_70b() -> dict[str, Any]:
    return _llama_config(
        hidden=8192,
        intermediate=28672,
        layers=80,
        heads=64,
        kv_heads=8,
        head_dim=128,
        vocab=128256,
        max_pos=131072,
        rope_theta=500000.0,
        rope_scaling=_llama3_rope(),
        layout=_llama3_layout(128256),
    )


def _cfg_tiny_llama() -> dict[str, Any]:
    return _llama_config(
        hidden=256,
        intermediate=512,
        layers=4,
        heads=4,
        kv_heads=2,
        head_dim=64,
        vocab=8192,
        max_pos=4096,
        rope_theta=10000.0,
        rope_scaling=None,
        layout=_llama3_layout(8192),
    )


def _cfg_small_llama() -> dict[str, Any]:
    # About 40x tiny-llama's compute per token (90M parameters outside the embeddings), so
    # on a CPU a long prompt's prefill takes longer than the HTTP and client work around it.
    return _llama_config(
        hidden=1024,
        intermediate=2816,
        layers=8,
        heads=16,
        kv_heads=4,
        head_dim=64,
        vocab=8192,
        max_pos=4096,
        rope_theta=10000.0,
        rope_scaling=None,
        layout=_llama3_layout(8192),
    )


def _qwen3_config(
    *,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    max_pos: int,
    rope_theta: float,
) -> dict[str, Any]:
    layout = _qwen3_layout(vocab)
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": layout.id_of("<|endoftext|>"),
        "eos_token_id": layout.id_of("<|im_end|>"),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_pos,
        "max_window_layers": layers,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }


def _cfg_qwen3_8b() -> dict[str, Any]:
    return _qwen3_config(
        hidden=4096,
        intermediate=12288,
        layers=36,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        max_pos=40960,
        rope_theta=1000000.0,
    )


def _cfg_tiny_qwen3() -> dict[str, Any]:
    return _qwen3_config(
        hidden=256,
        intermediate=512,
        layers=4,
        heads=4,
        kv_heads=2,
        head_dim=64,
        vocab=8192,
        max_pos=4096,
        rope_theta=1000000.0,
    )


def _cfg_mistral_7b() -> dict[str, Any]:
    # Mistral-7B-v0.3: full attention (no sliding window), vocab 32768.
    return {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.42.0.dev0",
        "use_cache": True,
        "vocab_size": 32768,
    }


ARCHS: dict[str, ArchSpec] = {
    s.name: s
    for s in (
        ArchSpec(
            "tiny-llama",
            "llama",
            _cfg_tiny_llama,
            _llama3_layout,
            True,
            "4-layer Llama-3-style model with random weights (CPU tests)",
        ),
        ArchSpec(
            "tiny-qwen3",
            "qwen3",
            _cfg_tiny_qwen3,
            _qwen3_layout,
            True,
            "4-layer Qwen3-style model with random weights (CPU tests)",
        ),
        ArchSpec(
            "small-llama",
            "llama",
            _cfg_small_llama,
            _llama3_layout,
            True,
            "8-layer Llama-3-style model with random weights (CPU benchmarks: compute-bound)",
        ),
        ArchSpec(
            "llama-3.1-8b",
            "llama",
            _cfg_llama31_8b,
            _llama3_layout,
            False,
            "Llama 3.1 8B shape; serve with --load-format dummy",
        ),
        ArchSpec(
            "llama-3.1-70b",
            "llama",
            _cfg_llama31_70b,
            _llama3_layout,
            False,
            "Llama 3.1 70B shape; serve with --load-format dummy",
        ),
        ArchSpec(
            "qwen3-8b",
            "qwen3",
            _cfg_qwen3_8b,
            _qwen3_layout,
            False,
            "Qwen3 8B shape; serve with --load-format dummy",
        ),
        ArchSpec(
            "mistral-7b",
            "mistral",
            _cfg_mistral_7b,
            _mistral_v3_layout,
            False,
            "Mistral 7B v0.3 shape; serve with --load-format dummy",
        ),
    )
}


# --------------------------------------------------------------------------- tensors


def _tensor_shapes(cfg: dict[str, Any], family: str) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of a Llama-like decoder (Qwen3 adds q/k norms)."""
    h = int(cfg["hidden_size"])
    inter = int(cfg["intermediate_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg["num_key_value_heads"])
    hd = int(cfg.get("head_dim") or h // heads)
    vocab = int(cfg["vocab_size"])
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h)}
    for n in range(int(cfg["num_hidden_layers"])):
        p = f"model.layers.{n}."
        shapes[p + "self_attn.q_proj.weight"] = (heads * hd, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv * hd, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv * hd, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, heads * hd)
        if family == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, h)
        shapes[p + "mlp.up_proj.weight"] = (inter, h)
        shapes[p + "mlp.down_proj.weight"] = (h, inter)
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, h)
    return shapes


def param_count(cfg: dict[str, Any], family: str | None = None) -> int:
    """Number of parameters of a synthesized (Llama-like) config."""
    fam = family or str(cfg.get("model_type", "llama"))
    return sum(int(np.prod(s)) for s in _tensor_shapes(cfg, fam).values())


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def _to_bf16(a: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.uint16]:
    """Truncate float32 to BF16 bit patterns (top 16 bits); plenty for random weights."""
    bits = a.astype(np.float32, copy=False).view(np.uint32) >> np.uint32(16)
    return bits.astype("<u2")


def _arch_rng(arch: str, seed: int) -> np.random.Generator:
    # crc32, not hash(): str hashes are salted per process and would break determinism.
    return np.random.default_rng([seed, zlib.crc32(arch.encode())])


def _write_safetensors(
    f: BinaryIO,
    shapes: dict[str, tuple[int, ...]],
    tensor: Callable[[str, tuple[int, ...]], npt.NDArray[np.uint16]],
) -> None:
    """Write BF16 tensors in safetensors layout: u64 header length, JSON header, raw bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    names = sorted(shapes)
    for name in names:
        nbytes = int(np.prod(shapes[name])) * 2
        header[name] = {
            "dtype": "BF16",
            "shape": list(shapes[name]),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # pad so the data starts 8-byte aligned
    f.write(len(raw).to_bytes(8, "little"))
    f.write(raw)
    for name in names:
        data = tensor(name, shapes[name])
        if data.shape != shapes[name]:
            raise ValueError(f"{name}: got shape {data.shape}, want {shapes[name]}")
        f.write(data.tobytes())


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name -> dtype/shape/data_offsets)."""
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header: dict[str, Any] = json.loads(f.read(n))
    return header


def _write_weights(path: Path, cfg: dict[str, Any], family: str, arch: str, seed: int) -> None:
    rng = _arch_rng(arch, seed)

    def tensor(name: str, shape: tuple[int, ...]) -> npt.NDArray[np.uint16]:
        if _is_norm(name):
            return _to_bf16(np.ones(shape, dtype=np.float32))
        return _to_bf16(rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD))

    with path.open("wb") as f:
        _write_safetensors(f, _tensor_shapes(cfg, family), tensor)


# --------------------------------------------------------------------------- tokenizer

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def _pseudo_words() -> Iterator[str]:
    """Pronounceable words, shortest first: ba, be, ..., baba, babe, ..., bababa, ..."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    n = 1
    while True:
        for parts in product(syllables, repeat=n):
            yield "".join(parts)
        n += 1


def _vocab(vocab_size: int, layout: TokenLayout) -> list[str]:
    """Token content for every id 0..vocab_size-1."""
    words = _pseudo_words()
    return [
        layout.specials[i][0] if i in layout.specials else next(words) for i in range(vocab_size)
    ]


def _tokenizer_json(vocab: list[str], layout: TokenLayout) -> dict[str, Any]:
    added = [
        {
            "id": i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for i, (content, special) in sorted(layout.specials.items())
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        # None on purpose: nothing (no BOS) is added, so N words encode to N tokens.
        "post_processor": None,
        # WordPiece without cleanup = join tokens with single spaces (no "##" in our words).
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {
            "type": "WordLevel",
            "vocab": {tok: i for i, tok in enumerate(vocab)},
            "unk_token": UNK_TOKEN,
        },
    }


def _tokenizer_files(cfg: dict[str, Any], layout: TokenLayout) -> dict[str, Any]:
    """tokenizer_config.json, special_tokens_map.json, generation_config.json contents."""
    roles: dict[str, str | None] = {
        "bos_token": layout.bos,
        "eos_token": layout.eos,
        "unk_token": UNK_TOKEN,
        "pad_token": layout.pad,
    }
    tok_cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **roles,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(cfg["max_position_embeddings"]),
        "chat_template": CHAT_TEMPLATE,
    }
    gen: dict[str, Any] = {
        "_from_model_config": True,
        "bos_token_id": cfg.get("bos_token_id"),
        "eos_token_id": list(layout.eos_ids) if len(layout.eos_ids) > 1 else layout.eos_ids[0],
    }
    if layout.pad is not None:
        gen["pad_token_id"] = layout.id_of(layout.pad)
    return {
        "tokenizer_config.json": tok_cfg,
        "special_tokens_map.json": {k: v for k, v in roles.items() if v is not None},
        "generation_config.json": gen,
    }


# --------------------------------------------------------------------------- directories


def default_model_dir(arch: str) -> Path:
    """Where ``autotuner model synth --arch ARCH`` puts a model by default."""
    return paths.models_dir() / arch


def needs_dummy_load(model_dir: Path) -> bool:
    """True when ``model_dir`` holds no weight files: start the engine with dummy weights."""
    return not any(
        p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES) for p in Path(model_dir).iterdir()
    )


def vocab_words(model_dir: Path) -> list[str]:
    """The plain (non-added) words of a synth tokenizer in id order.

    Any whitespace-joined sequence of N of them encodes to exactly N tokens.
    """
    tok = read_tokenizer(Path(model_dir))
    try:
        added = {int(t["id"]) for t in tok.get("added_tokens", [])}
        vocab: dict[str, int] = tok["model"]["vocab"]
        return [w for w, i in sorted(vocab.items(), key=lambda kv: int(kv[1])) if i not in added]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # not a synth tokenizer
        path = Path(model_dir) / "tokenizer.json"
        raise ModelFolderError(f"{path}: not the tokenizer autotuner generated ({exc!r})") from None


def _read_marker(model_dir: Path) -> SynthMarker | None:
    """The directory's marker; None when it has none or an unreadable one. A marker of a
    newer autotuner raises :class:`RecordVersionError`."""
    return SynthMarker.read_or_none(model_dir / MARKER_NAME)


def _is_complete(model_dir: Path, arch: str, seed: int) -> bool:
    m = _read_marker(model_dir)
    if m is None or m.arch != arch or m.format_version != FORMAT_VERSION:
        return False
    if ARCHS[arch].has_weights and m.seed != seed:
        return False
    return m.files is not None and all((model_dir / f).is_file() for f in m.files)


def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _build(spec: ArchSpec, d: Path, seed: int) -> None:
    cfg = spec.config()
    layout = spec.layout()
    vocab_size = int(cfg["vocab_size"])
    files: list[str] = []
    _dump(d / "config.json", cfg)
    files.append("config.json")
    # Compact: the vocab is up to ~150k entries.
    tok = _tokenizer_json(_vocab(vocab_size, layout), layout)
    (d / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    files.append("tokenizer.json")
    for name, obj in _tokenizer_files(cfg, layout).items():
        _dump(d / name, obj)
        files.append(name)
    if spec.has_weights:
        _write_weights(d / WEIGHTS_NAME, cfg, spec.family, spec.name, seed)
        files.append(WEIGHTS_NAME)
    # The marker goes last: its presence means everything above was written.
    marker = SynthMarker(
        arch=spec.name,
        format_version=FORMAT_VERSION,
        seed=seed,
        has_weights=spec.has_weights,
        params=param_count(cfg, spec.family),
        files=files,
    )
    (d / MARKER_NAME).write_text(marker.to_json() + "\n", encoding="utf-8")


def synthesize(arch: str, out_dir: Path, *, seed: int = 0, force: bool = False) -> Path:
    """Write a model of ``arch`` into ``out_dir`` and return ``out_dir``.

    Writes config.json, the tokenizer files, and (tiny archs) ``model.safetensors``. The model
    is built in a temp dir beside ``out_dir`` and renamed into place, so readers never see a
    half-written model. If ``out_dir`` already holds a complete model of the same arch (same
    format version; same seed for archs with weights) nothing is rewritten unless ``force``.
    An existing non-empty ``out_dir`` that is not a synthesized model is only replaced with
    ``force``; otherwise FileExistsError. Unknown arch: KeyError.
    """
    if arch not in ARCHS:
        raise KeyError(f"unknown arch {arch!r}; known: {', '.join(ARCHS)}")
    spec = ARCHS[arch]
    out_dir = Path(out_dir).expanduser().absolute()
    if not force and _is_complete(out_dir, arch, seed):
        return out_dir
    if not force and out_dir.is_dir() and any(out_dir.iterdir()) and _read_marker(out_dir) is None:
        raise FileExistsError(f"{out_dir} exists and is not a synthesized model (use force)")
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        _build(spec, tmp, seed)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        _install(tmp, out_dir, arch, seed, force)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _install(tmp: Path, out_dir: Path, arch: str, seed: int, force: bool) -> None:
    """Move the built ``tmp`` to ``out_dir``, swapping out whatever was there."""
    try:
        os.rename(tmp, out_dir)  # atomic; fails if out_dir is a non-empty dir
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    # A concurrent synthesize may have just finished the same model: keep theirs.
    if not force and _is_complete(out_dir, arch, seed):
        return
    # Directories cannot be replaced atomically; swap with a short window without out_dir.
    old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
    os.rename(out_dir, old / "m")
    try:
        os.rename(tmp, out_dir)
    except OSError:
        os.rename(old / "m", out_dir)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
