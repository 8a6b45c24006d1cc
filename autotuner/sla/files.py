"""Checks of a loaded SLA against what it names on disk: the model directory, the dataset or
trace, and whether the longest request fits the model's context."""

from __future__ import annotations

from typing import Any

from autotuner.core.errors import BadInput
from autotuner.core.yamlpos import KeyPath, Located
from autotuner.engines import registry
from autotuner.engines.base import OptionRoles
from autotuner.sla.bounds import MAX_LEVEL_S
from autotuner.sla.costs import span
from autotuner.sla.document import Sla, level_requests
from autotuner.sla.problems import Problem, dotted
from autotuner.sla.workload import ShapedDist, TraceArrival, UniformDist


def missing_files(sla: Sla, located: Located) -> list[Problem]:
    """What the SLA names on disk and is not there or not usable; when all is there, the
    requests that do not fit the model's context and a trace's level that takes too long."""
    problems: list[Problem] = []
    if sla.model.path is not None:
        where: KeyPath = ("model", "path")
        model_dir = sla.resolve_path(sla.model.path)
        if not model_dir.is_dir():
            problems.append(
                Problem(located.line_of(where), "model.path", f"no such directory: {model_dir}")
            )
        elif not (model_dir / "config.json").is_file():
            problems.append(
                Problem(located.line_of(where), "model.path", f"no config.json in {model_dir}")
            )
        else:  # a folder from outside: its config must be one a model has (models.folder)
            from autotuner.models.folder import read_config

            try:
                read_config(model_dir)
            except BadInput as exc:
                problems.append(Problem(located.line_of(where), "model.path", str(exc)))
    if sla.workload.dataset is not None or sla.workload.trace is not None:
        from autotuner.workload.replay import file_problems

        limit = context_limit(sla, _roles(sla))
        for at, msg in file_problems(sla.workload, sla.resolve_path, limit):
            problems.append(Problem(located.line_of(at), dotted(at), msg))
    if not problems:
        problems += _length_problems(sla, located)
        problems += _trace_level_problems(sla, located)
    return problems


def _trace_level_problems(sla: Sla, located: Located) -> list[Problem]:
    """A replayed trace's level past ``MAX_LEVEL_S`` (the planned level of
    ``autotuner.sla.document``, for a trace): the level's requests, the trace repeated after its
    span as often as they need, at ``arrival.speed`` x the trace's pace; ``duration_s`` ends it
    sooner (checked there)."""
    w = sla.workload
    if w.trace is None or not isinstance(w.arrival, TraceArrival):
        return []
    from autotuner.workload.datafiles import DataFileError
    from autotuner.workload.traces import read_trace

    try:
        trace = read_trace(sla.resolve_path(w.trace), w.trace_format, w.trace_block_tokens)
    except (DataFileError, OSError):
        return []  # reported by file_problems
    records = trace.records
    n = len(records)
    count = level_requests(sla)[0] or n
    send = ((count - 1) // n * trace.span_s + records[(count - 1) % n].time_s) / w.arrival.speed
    if send <= MAX_LEVEL_S or (w.duration_s is not None and w.duration_s <= send):
        return []
    where: KeyPath = ("workload", "arrival", "speed")
    return [
        Problem(
            located.line_of(where),
            "workload.arrival.speed",
            f"a load level is planned to take {span(send)}: {count:,} requests of the trace "
            f"({len(records):,} records over {span(trace.span_s)}) replayed at "
            f"{w.arrival.speed:g}x; a level may take at most {span(MAX_LEVEL_S)}: raise the "
            "speed or lower workload.requests (or end each level with workload.duration_s)",
        )
    ]


def _longest(count: Any) -> int | None:
    """The most tokens a ``TokenCount`` can ask for (None: unbounded above)."""
    if isinstance(count, int):
        return count
    if isinstance(count, UniformDist):
        return count.max
    if isinstance(count, ShapedDist):
        return count.max
    return None


def _roles(sla: Sla) -> OptionRoles:
    """The option roles of the SLA's engine kind (validation resolves the kind it checks)."""
    return registry.get(sla.engine.kind).roles


def context_limit(sla: Sla, roles: OptionRoles) -> int | None:
    """The engine's context length: the option of the context-length role in ``roles`` (vLLM:
    ``max_model_len``) as the SLA sets it, else the model's own. Load plans fit dataset
    prompts to it."""
    option = roles.context_length
    fixed = sla.engine.settings().get(option) if option is not None else None  # params, args
    if isinstance(fixed, int) and not isinstance(fixed, bool):
        return fixed
    config: dict[str, Any] = {}
    if sla.model.synth is not None:
        from autotuner.models.synth import ARCHS

        config = ARCHS[sla.model.synth].config()
    elif sla.model.path is not None:
        import json

        from autotuner.core import confined

        try:  # within the directories a daemon's SLA may read (core.confined)
            raw = confined.read_bytes(sla.resolve_path(sla.model.path) / "config.json")
            config = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError, RecursionError):  # missing_files says what is wrong
            return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) else None


def _length_problems(sla: Sla, located: Located) -> list[Problem]:
    """Requests that no engine of this model can serve: prompt plus output past the context."""
    roles = _roles(sla)
    limit = context_limit(sla, roles)
    named = roles.context_length or "context length"
    prompt = _longest(sla.workload.input_tokens) if sla.workload.input_tokens else None
    output = _longest(sla.workload.output_tokens) if sla.workload.output_tokens else None
    if limit is None or prompt is None:
        return []
    w = sla.workload
    if w.shared_prefix is not None or w.conversation is not None:
        return _traffic_length_problems(sla, located, limit, prompt, output or 0, named)
    need = prompt + (output or 0)
    if need <= limit:
        return []
    where: KeyPath = ("workload", "input_tokens")
    return [
        Problem(
            located.line_of(where),
            "workload.input_tokens",
            f"a request of {prompt} prompt + {output or 0} output tokens does not fit the "
            f"model's context of {limit} tokens ({named})",
        )
    ]


def _traffic_length_problems(
    sla: Sla, located: Located, limit: int, prompt: int, output: int, named: str
) -> list[Problem]:
    """Shared prefixes and conversations: the longest request is the last turn, which resends
    the system prompt and every earlier prompt and answer. ``named``: what the engine calls
    its context length (in the messages)."""
    w = sla.workload
    prefix = w.shared_prefix.tokens if w.shared_prefix else 0
    turns = w.conversation.turns if w.conversation else 1
    if prefix >= limit:
        where: KeyPath = ("workload", "shared_prefix", "tokens")
        return [
            Problem(
                located.line_of(where),
                "workload.shared_prefix.tokens",
                f"a system prompt of {prefix} tokens does not fit the model's context of "
                f"{limit} tokens ({named})",
            )
        ]
    need = prefix + turns * (prompt + output)
    if need <= limit:
        return []
    key, where = (
        ("conversation", ("workload", "conversation", "turns"))
        if turns > 1
        else ("input_tokens", ("workload", "input_tokens"))
    )
    last = f"the last of {turns} turns" if turns > 1 else "a request"
    return [
        Problem(
            located.line_of(where),
            f"workload.{key}" + (".turns" if turns > 1 else ""),
            f"{last} needs {need} tokens ({prefix} system prompt + {turns} x ({prompt} prompt + "
            f"{output} output)), more than the model's context of {limit} tokens "
            f"({named})",
        )
    ]
