"""Timed traces: arrival times and request lengths replayed from a file the user supplies.

Two formats:

* ``azure``: CSV as in the Azure LLM inference traces, a header naming ``TIMESTAMP``,
  ``ContextTokens`` and ``GeneratedTokens`` (any case; other columns are ignored); the
  timestamp a date-time (``2023-11-16 18:15:46.6805900``) or a number of seconds;
* ``mooncake``: JSON Lines as in the Mooncake traces, ``{"timestamp": ms, "input_length": n,
  "output_length": m, "hash_ids": [...]}``: ``hash_ids`` name the prompt's blocks of
  ``block_tokens`` tokens (512 in Mooncake's traces); requests naming the same id share that
  block, so the prompts built here share exactly the prefixes the trace's requests shared.

``auto`` picks ``azure`` for ``.csv`` and ``mooncake`` for ``.jsonl``. Times are relative to
the first record and must not decrease. Replayed at ``speed`` x, request ``i`` leaves at
``time[i] / speed``: the speed is the load of a capacity search on a trace. A level with more
requests than the trace replays it again after its span, with fresh prompts (so a second
pass does not find the first one's blocks in the prefix cache), as does every further load
level on one engine.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from autotuner.workload.datafiles import DataFileError, count, jsonl_records, lines, shown
from autotuner.workload.requests import Api, LengthDist, PromptSource, RequestSpec

TraceFormat = Literal["azure", "mooncake"]
FORMATS: tuple[TraceFormat, ...] = ("azure", "mooncake")
DEFAULT_BLOCK_TOKENS = 512  # Mooncake's block size
MAX_SPAN_S = 366 * 24 * 3600.0  # a trace longer than a year is a unit mistake

_AZURE_COLUMNS = {"timestamp": "time", "contexttokens": "input", "generatedtokens": "output"}


@dataclass(frozen=True)
class TraceRecord:
    line: int
    time_s: float  # from the first record
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trace:
    path: str
    format: TraceFormat
    records: tuple[TraceRecord, ...]
    block_tokens: int = DEFAULT_BLOCK_TOKENS

    @property
    def span_s(self) -> float:
        """The time the trace covers, plus one mean gap (where a second pass starts)."""
        n = len(self.records)
        last = self.records[-1].time_s
        return last + (last / (n - 1) if n > 1 and last > 0 else 1.0)

    def offsets(self, speed: float) -> Iterator[float]:
        """Send times at ``speed`` x, the trace repeated after its span (endless)."""
        cycle = 0
        while True:
            base = cycle * self.span_s
            for r in self.records:
                yield (base + r.time_s) / speed
            cycle += 1

    def fits(self, limit: int) -> None:
        """Raise for the first record whose prompt plus output exceeds ``limit`` tokens."""
        for r in self.records:
            if r.input_tokens + r.output_tokens > limit:
                raise DataFileError(
                    f"{self.path}:{r.line}: {r.input_tokens} input + {r.output_tokens} output "
                    f"tokens do not fit the model's context of {limit} tokens (the engine's "
                    "context length)"
                )

    def note(self) -> str:
        shared = sum(1 for r in self.records if r.hash_ids)
        blocks = f", {shared} with prefix blocks of {self.block_tokens} tokens" if shared else ""
        return (
            f"trace {Path(self.path).name} ({self.format}): {len(self.records)} requests over "
            f"{self.records[-1].time_s:.1f} s{blocks}"
        )

    def describe(self) -> dict[str, Any]:
        return {
            "trace": self.path,
            "format": self.format,
            "requests": len(self.records),
            "span_s": self.records[-1].time_s,
            "block_tokens": self.block_tokens,
        }


def detect_format(path: Path, fmt: str = "auto") -> TraceFormat:
    if fmt != "auto":
        if fmt not in FORMATS:
            raise DataFileError(f"{path}: unknown trace format {fmt!r} ({', '.join(FORMATS)})")
        return fmt
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "azure"
    if suffix in (".jsonl", ".ndjson"):
        return "mooncake"
    raise DataFileError(
        f"{path}: unknown trace format: name it .csv (azure) or .jsonl (mooncake), or set "
        "workload.trace_format"
    )


def read_trace(path: Path, fmt: str = "auto", block_tokens: int = DEFAULT_BLOCK_TOKENS) -> Trace:
    """Every record of ``path`` checked; a :class:`DataFileError` names the first bad one."""
    kind = detect_format(path, fmt)
    raw = _azure(path) if kind == "azure" else _mooncake(path, block_tokens)
    records: list[TraceRecord] = []
    first: float | None = None
    previous = -math.inf
    for line, t, n_in, n_out, ids in raw:
        if t < previous:
            raise DataFileError(
                f"{path}:{line}: timestamp goes back in time ({t:g} after {previous:g}): "
                "a trace's records must be in time order"
            )
        previous = t
        first = t if first is None else first
        if t - first > MAX_SPAN_S:
            raise DataFileError(f"{path}:{line}: the trace spans more than a year")
        records.append(TraceRecord(line, t - first, n_in, n_out, ids))
    if not records:
        raise DataFileError(f"{path}: no records")
    return Trace(str(path), kind, tuple(records), block_tokens)


_Raw = Iterator[tuple[int, float, int, int, tuple[int, ...]]]


def _azure(path: Path) -> _Raw:
    columns: dict[str, int] | None = None
    for line, text in lines(path):
        try:
            cells = next(csv.reader([text]))
        except csv.Error as exc:
            raise DataFileError(f"{path}:{line}: not CSV: {exc}") from None
        if columns is None:
            names = [re.sub(r"[\s_]", "", c).lower() for c in cells]
            columns = {_AZURE_COLUMNS[n]: i for i, n in enumerate(names) if n in _AZURE_COLUMNS}
            missing = [
                c
                for c in ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
                if _AZURE_COLUMNS[c.lower()] not in columns
            ]
            if missing:
                raise DataFileError(
                    f"{path}:{line}: unknown trace format: the header needs the columns "
                    f"TIMESTAMP, ContextTokens, GeneratedTokens (missing {', '.join(missing)})"
                )
            continue
        if len(cells) <= max(columns.values()):
            raise DataFileError(f"{path}:{line}: {len(cells)} columns, the header has more")
        try:
            t = _timestamp(cells[columns["time"]])
            n_in = count(_int(cells[columns["input"]]), "ContextTokens")
            n_out = count(_int(cells[columns["output"]]), "GeneratedTokens")
        except ValueError as exc:
            raise DataFileError(f"{path}:{line}: {exc}") from None
        yield line, t, n_in, n_out, ()


def _int(cell: str) -> Any:
    text = cell.strip()
    return int(text) if re.fullmatch(r"[0-9]{1,12}", text) else text


def _timestamp(cell: str) -> float:
    text = cell.strip()
    if re.fullmatch(r"[0-9]{1,15}(\.[0-9]{1,9})?", text):
        return float(text)
    # Azure's traces give 7 fraction digits; Python parses at most 6.
    m = re.fullmatch(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(\.\d+)?", text)
    if m is None:
        raise ValueError(f"TIMESTAMP must be a date-time or seconds, got {shown(text)}")
    try:
        # As UTC: only differences count, and local time would jump at a DST change.
        stamp = datetime.fromisoformat(m[1].replace("T", " ")).replace(tzinfo=UTC)
    except ValueError:
        raise ValueError(f"TIMESTAMP is not a valid date-time: {shown(text)}") from None
    return stamp.timestamp() + (float("0" + m[2]) if m[2] else 0.0)


def _mooncake(path: Path, block_tokens: int) -> _Raw:
    for line, record in jsonl_records(path):
        try:
            if not isinstance(record, dict):
                raise ValueError(f"a record must be a JSON object, got {shown(record)}")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in record:
                    raise ValueError(f"unknown trace format: no {key!r} field")
            t = record["timestamp"]
            if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < 1e15:
                raise ValueError(f"timestamp must be milliseconds >= 0, got {shown(t)}")
            n_in = count(record["input_length"], "input_length")
            n_out = count(record["output_length"], "output_length")
            ids = record.get("hash_ids", [])
            if not isinstance(ids, list):
                raise ValueError(f"hash_ids must be a list of integers, got {shown(ids)}")
            hashes = tuple(count(h, "a hash id", low=0, high=2**62) for h in ids)
            if len(hashes) > math.ceil(n_in / block_tokens):
                raise ValueError(
                    f"{len(hashes)} hash_ids of {block_tokens} tokens are more than "
                    f"input_length {n_in} holds (workload.trace_block_tokens sets the block)"
                )
        except ValueError as exc:
            raise DataFileError(f"{path}:{line}: {exc}") from None
        yield line, t / 1000.0, n_in, n_out, hashes


@dataclass(frozen=True)
class TraceReplay:
    """Request ``i`` of a level: the trace's record ``i`` (wrapping), with a prompt built to
    its length from its prefix blocks, each block's tokens drawn from ``(seed, level, pass,
    hash id)``: the same id gives the same tokens within one pass of one level."""

    trace: Trace
    source: PromptSource
    api: Api
    seed: int

    def make(self, i: int, first_index: int, output_len: LengthDist) -> RequestSpec:
        del output_len  # the trace gives every request's
        n = len(self.trace.records)
        record = self.trace.records[i % n]
        salt = (first_index, i // n)
        size = self.trace.block_tokens
        pieces: list[Any] = []
        left = record.input_tokens
        for h in record.hash_ids:
            take = min(size, left)
            rng = np.random.default_rng([self.seed, *salt, 0xB10C, h])
            pieces.append(self._tokens(size, rng)[:take])
            left -= take
        if left > 0:  # the part no block covers: this request's own
            rng = np.random.default_rng([self.seed, *salt, 0x7A11, i])
            pieces.append(self._tokens(left, rng))
        if self.api == "chat":
            text = " ".join(w for piece in pieces for w in piece)
            return RequestSpec(
                record.output_tokens,
                messages=[{"role": "user", "content": text}],
                input_tokens=record.input_tokens if self.source.words else None,
            )
        ids = [int(t) for piece in pieces for t in piece]
        return RequestSpec(record.output_tokens, prompt=ids, input_tokens=record.input_tokens)

    def _tokens(self, n: int, rng: np.random.Generator) -> list[Any]:
        """``n`` token ids, or ``n`` single-token words for the chat API."""
        if self.api != "chat":
            return self.source.token_ids(n, rng)
        text, _ = self.source.text(n, rng)
        return text.split(" ")

    def offsets(self, speed: float) -> Iterator[float]:
        return self.trace.offsets(speed)

    def time_of(self, i: int) -> float:
        """When request ``i`` leaves at speed 1 (the trace wrapping after its span)."""
        n = len(self.trace.records)
        return (i // n) * self.trace.span_s + self.trace.records[i % n].time_s

    def describe(self) -> dict[str, Any]:
        return self.trace.describe()

    def note(self) -> str:
        return self.trace.note()
