"""Prompt datasets the user supplies: read, checked record by record, tokenized, sampled.

Three formats, each record with an optional ``output_tokens`` (the request's output length):

* ``prompts``: JSON Lines of ``{"prompt": "..."}``;
* ``openai-chat``: JSON Lines of ``{"messages": [{"role": ..., "content": ...}, ...]}``; the
  request is the conversation up to its last user turn, an assistant turn after that is the
  reply whose length is the output length when ``output_tokens`` is not given;
* ``sharegpt``: a JSON list (or JSON Lines) of ``{"conversations": [{"from": "human",
  "value": ...}, {"from": "gpt", ...}]}``; the request is the first human turn (with a system
  turn before it), the ``gpt`` turn after it the reply, as ``vllm bench serve`` reads it.

``auto`` picks the format from the file: a ``.json`` file is ShareGPT, a JSON Lines file is
named by the key of its first record. Nothing is downloaded. :func:`prepare` tokenizes every
prompt with the model's own tokenizer (chat prompts through its chat template when it has
one, else their contents joined by blank lines), drops those that do not fit the context
(prompt plus output over the context length; how many is reported), and orders the rest by a
permutation of the workload's seed. Load levels on one engine take the next prompts of that
order (:class:`DatasetReplay`), so a prompt repeats only when the dataset is used up.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from autotuner.workload.datafiles import (
    MAX_RECORDS,
    DataFileError,
    count,
    json_document,
    jsonl_records,
    shown,
)
from autotuner.workload.requests import Api, LengthDist, RequestSpec

DatasetFormat = Literal["prompts", "openai-chat", "sharegpt"]
FORMATS: tuple[DatasetFormat, ...] = ("prompts", "openai-chat", "sharegpt")

_ROLES = ("system", "user", "assistant", "developer", "tool")

# The key a replay's context length is written under in result and level files (its
# ``describe()``): vLLM's option name, from before the engines' options had neutral roles; kept
# so that the files keep their shape and older readers still find it.
CONTEXT_KEY = "max_model_len"
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}
_KEY_OF = {"prompt": "prompts", "messages": "openai-chat", "conversations": "sharegpt"}


@dataclass(frozen=True)
class Row:
    """One usable record: a prompt or chat messages, its output length if the file gave one,
    and the reply whose length stands in for it otherwise."""

    where: str  # "line 7" or "record 3": where it came from
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] = ()  # (role, content)
    output_tokens: int | None = None
    reply: str | None = None


def detect_format(path: Path, fmt: str = "auto") -> DatasetFormat:
    """The format of ``path``: ``fmt`` when given, else from the file (module docstring)."""
    if fmt != "auto":
        if fmt not in FORMATS:
            raise DataFileError(f"{path}: unknown dataset format {fmt!r} ({', '.join(FORMATS)})")
        return fmt
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "sharegpt"
    if suffix not in (".jsonl", ".ndjson"):
        raise DataFileError(
            f"{path}: unknown dataset format: name it .jsonl (prompts, openai-chat) or .json "
            "(sharegpt), or set workload.dataset_format"
        )
    for lineno, record in jsonl_records(path):
        keys = [k for k in _KEY_OF if isinstance(record, dict) and k in record]
        if len(keys) != 1:
            raise DataFileError(
                f"{path}:{lineno}: unknown dataset format: a record needs exactly one of "
                f"'prompt', 'messages' or 'conversations', got {_keys(record)}"
            )
        return _KEY_OF[keys[0]]  # type: ignore[return-value]
    raise DataFileError(f"{path}: no records")


def _keys(record: Any) -> str:
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    return "keys " + (", ".join(repr(k) for k in list(record)[:6]) or "none")


def read_dataset(path: Path, fmt: str = "auto") -> tuple[DatasetFormat, tuple[Row, ...]]:
    """Every record of ``path`` checked; a :class:`DataFileError` names the first bad one."""
    kind = detect_format(path, fmt)
    if kind == "sharegpt" and path.suffix.lower() == ".json":
        doc = json_document(path)
        if not isinstance(doc, list):
            raise DataFileError(f"{path}: a ShareGPT file is a JSON list of conversations")
        if len(doc) > MAX_RECORDS:
            raise DataFileError(f"{path}: more than {MAX_RECORDS} records")
        items: list[tuple[str, str, Any]] = [
            (f"record {i}", f"{path}: record {i}", r) for i, r in enumerate(doc, 1)
        ]
    else:
        items = [(f"line {n}", f"{path}:{n}", r) for n, r in jsonl_records(path)]
    rows = []
    for where, label, record in items:
        try:
            rows.append(_row(kind, where, record))
        except ValueError as exc:
            raise DataFileError(f"{label}: {exc}") from None
    if not rows:
        raise DataFileError(f"{path}: no records")
    return kind, tuple(rows)


def _row(kind: DatasetFormat, where: str, record: Any) -> Row:
    if not isinstance(record, dict):
        raise ValueError(f"a record must be a JSON object, got {shown(record)}")
    out = record.get("output_tokens")
    output = None if out is None else count(out, "output_tokens")
    if kind == "prompts":
        prompt = record.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"'prompt' must be non-empty text, got {shown(prompt)}")
        return Row(where, prompt=prompt, output_tokens=output)
    if kind == "openai-chat":
        turns = _turns(record.get("messages"), "messages", "role", "content", None)
        last_user = max((i for i, (role, _) in enumerate(turns) if role == "user"), default=None)
        if last_user is None:
            raise ValueError("the conversation has no user turn")
        after = turns[last_user + 1 :]
        reply = after[0][1] if after and after[0][0] == "assistant" else None
        return Row(where, messages=turns[: last_user + 1], output_tokens=output, reply=reply)
    turns = _turns(record.get("conversations"), "conversations", "from", "value", _SHAREGPT_ROLES)
    first_user = next((i for i, (role, _) in enumerate(turns) if role == "user"), None)
    if first_user is None:
        raise ValueError("the conversation has no user turn ('from': 'human')")
    nxt = turns[first_user + 1] if first_user + 1 < len(turns) else None
    reply = nxt[1] if nxt is not None and nxt[0] == "assistant" else None
    return Row(where, messages=turns[: first_user + 1], output_tokens=output, reply=reply)


def _turns(
    value: Any, field: str, role_key: str, text_key: str, roles: dict[str, str] | None
) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{field!r} must be a non-empty list, got {shown(value)}")
    turns = []
    for n, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise ValueError(f"{field}[{n}] must be an object, got {shown(turn)}")
        role, text = turn.get(role_key), turn.get(text_key)
        allowed = tuple(roles) if roles is not None else _ROLES
        if not isinstance(role, str) or role not in allowed:
            raise ValueError(
                f"{field}[{n}].{role_key} must be one of {', '.join(allowed)}, got {shown(role)}"
            )
        if not isinstance(text, str):
            raise ValueError(f"{field}[{n}].{text_key} must be text, got {shown(text)}")
        turns.append((roles[role] if roles is not None else role, text))
    return tuple(turns)


# --------------------------------------------------------------------------- tokenizing


@dataclass(frozen=True)
class Prompt:
    """A prompt ready to send: text, or chat messages, and its length in model tokens."""

    input_tokens: int
    output_tokens: int | None
    text: str | None = None
    messages: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PreparedDataset:
    """A dataset after tokenizing and filtering (see the module docstring)."""

    path: str
    format: DatasetFormat
    prompts: tuple[Prompt, ...]
    records: int
    dropped: int
    context_len: int | None  # the engine's context length the prompts were fitted to
    rendering: str  # how chat messages became tokens ("": no chat messages)

    def note(self) -> str:
        fit = f" (prompt + output over the context length {self.context_len})"
        chat = f"; chat prompts counted {self.rendering}" if self.rendering else ""
        return (
            f"dataset {Path(self.path).name} ({self.format}): {self.records} records, "
            f"{self.dropped} dropped{fit if self.dropped else ''}, {len(self.prompts)} used"
            f"{chat}"
        )

    def describe(self) -> dict[str, Any]:
        return {
            "dataset": self.path,
            "format": self.format,
            "records": self.records,
            "dropped": self.dropped,
            "used": len(self.prompts),
            CONTEXT_KEY: self.context_len,
            "chat_rendering": self.rendering,
        }


def _chat_renderer(model_dir: Path) -> tuple[Any, str]:
    """A function messages -> text through the model's chat template, and how it renders."""
    config_file = model_dir / "tokenizer_config.json"
    template: Any = None
    config: dict[str, Any] = {}
    if config_file.is_file():
        try:
            loaded = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            loaded = {}
        config = loaded if isinstance(loaded, dict) else {}
        template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template.strip():
        try:
            from autotuner.workload import chat_render

            compiled = chat_render.compile_template(template)
        except Exception as exc:  # jinja2 missing, or a template it can't compile
            return _join, f"joined by blank lines (chat template unusable: {type(exc).__name__})"

        def special(name: str) -> str:
            value = config.get(name)
            return value.get("content", "") if isinstance(value, dict) else str(value or "")

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        def render(messages: tuple[tuple[str, str], ...]) -> str:
            context = {
                "messages": [{"role": r, "content": c} for r, c in messages],
                "add_generation_prompt": True,
                "bos_token": special("bos_token"),
                "eos_token": special("eos_token"),
                "raise_exception": raise_exception,
            }
            try:
                return chat_render.render(compiled, context)
            except chat_render.TemplateRunaway as exc:
                raise DataFileError(f"{config_file}: chat template: {exc}") from None

        return render, "through the model's chat template"
    return _join, "joined by blank lines (the model has no chat template)"


def _join(messages: tuple[tuple[str, str], ...]) -> str:
    return "\n\n".join(content for _, content in messages)


@functools.lru_cache(maxsize=8)
def _prepared(
    path: str,
    stamp: tuple[int, int],
    fmt: str,
    model_dir: str,
    api: Api,
    context_len: int | None,
    fallback_output: int,
) -> PreparedDataset:
    del stamp  # part of the cache key only: a changed file is read again
    kind, rows = read_dataset(Path(path), fmt)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataFileError(
            "datasets are tokenized with the model's tokenizer: pip install tokenizers"
        ) from None
    tok_file = Path(model_dir) / "tokenizer.json"
    if not tok_file.is_file():
        raise DataFileError(f"{path}: the model has no tokenizer.json to count prompts with")
    try:
        tokenizer = Tokenizer.from_file(str(tok_file))
    except Exception as exc:  # the tokenizers library raises plain Exception for bad files
        raise DataFileError(f"{tok_file}: the model's tokenizer can't be loaded: {exc}") from None
    render, rendering = _chat_renderer(Path(model_dir))
    texts: list[str] = []
    special: list[bool] = []  # a plain prompt gets the tokenizer's special tokens (BOS)
    for row in rows:
        msgs = row.messages or ((("user", row.prompt or ""),) if api == "chat" else ())
        if msgs:
            try:
                texts.append(render(msgs))
            except DataFileError as exc:  # the template itself runs away: name its file
                raise DataFileError(f"{exc} (rendering {path}: {row.where})") from None
            except Exception as exc:  # the model's template refuses this conversation
                raise DataFileError(f"{path}: {row.where}: chat template: {exc}") from None
        else:
            texts.append(row.prompt or "")
        special.append(not msgs)
    lengths = [
        len(tokenizer.encode(text, add_special_tokens=add).ids)
        for text, add in zip(texts, special, strict=True)
    ]
    replies = [r.reply for r in rows if r.output_tokens is None and r.reply]
    reply_lengths = iter(
        len(e.ids) for e in tokenizer.encode_batch(replies, add_special_tokens=False)
    )
    prompts: list[Prompt] = []
    for row, text, n_in in zip(rows, texts, lengths, strict=True):
        out = row.output_tokens
        if out is None and row.reply:
            out = max(1, next(reply_lengths))
        if context_len is not None and n_in + (out or fallback_output) > context_len:
            continue
        if api == "chat":
            msgs = row.messages or (("user", row.prompt or ""),)
            prompts.append(Prompt(n_in, out, messages=msgs))
        else:
            prompts.append(Prompt(n_in, out, text=text))
    if kind == "prompts" and api != "chat":
        rendering = ""  # plain prompts sent as they are
    prepared = PreparedDataset(
        path, kind, tuple(prompts), len(rows), len(rows) - len(prompts), context_len, rendering
    )
    if not prompts:
        raise DataFileError(f"{path}: no prompt fits: {prepared.note()}")
    return prepared


def prepare(
    path: Path,
    fmt: str,
    model_dir: Path,
    api: Api,
    context_len: int | None,
    fallback_output: int,
) -> PreparedDataset:
    """The dataset at ``path`` tokenized and filtered for this model (cached per file), to
    requests of at most ``context_len`` tokens (the engine's context length; None: no limit).

    ``fallback_output`` is the output length assumed, for the context check, of records that
    give none (the most the workload's ``output_tokens`` asks for).
    """
    try:
        st = path.stat()
    except OSError as exc:
        raise DataFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return _prepared(
        str(path),
        (st.st_mtime_ns, st.st_size),
        fmt,
        str(model_dir),
        api,
        context_len,
        fallback_output,
    )


@dataclass(frozen=True)
class DatasetReplay:
    """Request ``i`` of a level: the next prompt of the seeded order."""

    data: PreparedDataset
    seed: int

    @functools.cached_property
    def order(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 0xDA7A])
        return rng.permutation(len(self.data.prompts))

    def make(self, i: int, first_index: int, output_len: LengthDist) -> RequestSpec:
        j = i + first_index
        p = self.data.prompts[int(self.order[j % len(self.order)])]
        out = p.output_tokens or output_len.sample(np.random.default_rng([self.seed, j]))
        if p.messages:
            msgs = [{"role": r, "content": c} for r, c in p.messages]
            return RequestSpec(out, messages=msgs, input_tokens=p.input_tokens)
        return RequestSpec(out, prompt=p.text, input_tokens=p.input_tokens)

    def offsets(self, speed: float) -> Iterator[float]:
        raise ValueError("a dataset has no arrival times; the workload's arrival sets them")

    def describe(self) -> dict[str, Any]:
        return self.data.describe()

    def note(self) -> str:
        return self.data.note()
