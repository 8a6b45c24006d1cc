"""The SLA's dataset or trace file, from validation (``check``) to the requests of a load plan.

:func:`file_problems` is what ``check`` (and every command that reads an SLA) runs: each
record of the file is read and checked, and lengths the model's context can never hold are
refused, without a model or an engine. :func:`replay_of` builds what the load generator
replays; it needs the model (its tokenizer counts dataset prompts), so it runs before any
engine starts: a dataset with no prompt that fits is bad input then, still with nothing
launched.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotuner.workload.datafiles import DataFileError
from autotuner.workload.datasets import DatasetReplay, prepare, read_dataset
from autotuner.workload.requests import PromptSource, Replay
from autotuner.workload.traces import TraceReplay, read_trace

DEFAULT_OUTPUT_TOKENS = 128  # as DEFAULT_DATASET_OUTPUT_TOKENS in autotuner.sla.workload

KeyPath = tuple[str | int, ...]


def file_problems(
    workload: Any, resolve: Callable[[str], Path], limit: int | None
) -> list[tuple[KeyPath, str]]:
    """``(where in the SLA, message)`` for the workload's dataset or trace file; every
    message names the data file and its line (or record)."""
    problems: list[tuple[KeyPath, str]] = []
    if workload.dataset is not None:
        path = resolve(workload.dataset)
        at: KeyPath = ("workload", "dataset")
        if not path.is_file():
            problems.append((at, f"no such file: {path}"))
        else:
            try:
                _, rows = read_dataset(path, workload.dataset_format)
                if limit is not None:
                    for row in rows:
                        if row.output_tokens is not None and row.output_tokens >= limit:
                            raise DataFileError(
                                f"{path}: {row.where}: output_tokens {row.output_tokens} "
                                f"leaves no room for a prompt in the model's context of "
                                f"{limit} tokens (the engine's context length)"
                            )
            except DataFileError as exc:
                problems.append((at, str(exc)))
    if workload.trace is not None:
        path = resolve(workload.trace)
        at = ("workload", "trace")
        if not path.is_file():
            problems.append((at, f"no such file: {path}"))
        else:
            try:
                trace = read_trace(path, workload.trace_format, workload.trace_block_tokens)
                if limit is not None:
                    trace.fits(limit)
            except DataFileError as exc:
                problems.append((at, str(exc)))
    return problems


def _most_output(workload: Any) -> int:
    """The most output tokens the workload asks of a record that gives none."""
    out = workload.output_tokens
    if out is None:
        return DEFAULT_OUTPUT_TOKENS
    if isinstance(out, int):
        return out
    top = getattr(out, "max", None)
    return int(top) if top is not None else int(out.mean)


def replay_of(sla: Any, model_dir: Path, limit: int | None) -> Replay | None:
    """The dataset or trace replay of ``sla`` for the model in ``model_dir`` (None: neither).

    ``limit`` is the engine's context length (vLLM: ``max_model_len``). Raises
    :class:`DataFileError` for an unusable file.
    """
    w = sla.workload
    if w.dataset is not None:
        data = prepare(
            sla.resolve_path(w.dataset), w.dataset_format, model_dir, w.api, limit, _most_output(w)
        )
        return DatasetReplay(data, w.seed)
    if w.trace is not None:
        trace = read_trace(sla.resolve_path(w.trace), w.trace_format, w.trace_block_tokens)
        if limit is not None:
            trace.fits(limit)
        return TraceReplay(trace, PromptSource.from_model_dir(model_dir), w.api, w.seed)
    return None


def trace_requests(replay: Replay | None) -> int | None:
    """A trace's request count (a workload with a trace and no ``requests`` replays it once)."""
    return len(replay.trace.records) if isinstance(replay, TraceReplay) else None


def trace_deadline(replay: Replay | None, requests: int | None, speed: float | None) -> float:
    """Seconds until the last of ``requests`` leaves at ``speed`` x (0: not a trace)."""
    if not isinstance(replay, TraceReplay) or not requests or not speed:
        return 0.0
    return replay.time_of(requests - 1) / speed
