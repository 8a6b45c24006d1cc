"""The fallback runbook of a bundle (``fallback_plan.md``): each ranked alternative to the
promoted config, when to switch to it (its triggers, derived from what it measured against
the promoted config) and the command that serves it. Pure, like :mod:`autotuner.bundle.report`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autotuner.bundle.metric_names import (
    LATENCY_METRIC,
    finite,
    format_change,
    format_value,
    metric_name,
)
from autotuner.engines.base import OptionRoles
from autotuner.engines.deploy import argv_lines, format_command


@dataclass(frozen=True)
class Fallback:
    """One ranked alternative to the promoted config, and when to switch to it."""

    rank: int
    label: str  # "trial 4 (next Pareto point)", "baseline (engine defaults)"
    params: dict[str, object]
    argv: list[str]
    metrics: dict[str, float | None]
    cost: dict[str, float | None]  # relative to the promoted config: -0.12 is 12 % lower
    triggers: list[str]
    # Per metric, where this config's figure comes from ("single run", "confirmed, 3
    # replicates"); shown beside it when given.
    basis: dict[str, str] = field(default_factory=dict)
    # Per metric, a change column text that replaces the plain ratio (a confirmed effect
    # with its interval and verdict).
    change_text: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Fallback plan


def _cell(name: str, value: float | None, basis: Mapping[str, str]) -> str:
    """A table cell: the value, and where it comes from when that is known."""
    text = format_value(name, value)
    return f"{text} ({basis[name]})" if name in basis and value is not None else text


def fallback_plan_md(
    study: str,
    promoted_label: str,
    promoted_metrics: Mapping[str, float | None],
    fallbacks: Sequence[Fallback],
    notes: Sequence[str],
    promoted_basis: Mapping[str, str] | None = None,
) -> str:
    """A runbook in Markdown: what is promoted, then each fallback by rank with when to switch
    to it, what it costs against the promoted config, and the exact command that serves it.

    ``promoted_basis`` and each fallback's ``basis`` say per metric where a figure comes from
    (confirmation replicates or a single run of the search); they are shown beside it."""
    pb = promoted_basis or {}
    out = [f"# Fallback plan: {study}", "", f"Promoted: **{promoted_label}**", ""]
    if promoted_metrics:
        out += ["| metric | measured |", "|---|---|"]
        out += [f"| {metric_name(k)} | {_cell(k, v, pb)} |" for k, v in promoted_metrics.items()]
        out.append("")
    if not fallbacks:
        out += [
            "No fallback was measured: re-run `autotuner tune` if the promoted config fails.",
            "",
        ]
    else:
        out += [
            "If the promoted config cannot run or stops meeting the SLA, go down this list and use",
            "the first fallback whose trigger matches. Each was measured in the same study, on the",
            "same workload; costs are relative to the promoted config.",
            "",
        ]
    for fb in sorted(fallbacks, key=lambda f: f.rank):
        out += [f"## {fb.rank}. {fb.label}", "", "**Switch to it when**", ""]
        out += [f"- {t}" for t in fb.triggers] or ["- (no trigger derived: a manual choice)"]
        out.append("")
        keys = list(fb.metrics) + [k for k in fb.cost if k not in fb.metrics]
        if keys:
            out += ["**Measured, against the promoted config**", ""]
            out += ["| metric | this config | promoted | change |", "|---|---|---|---|"]
            for k in keys:
                change = fb.change_text.get(k) or format_change(k, fb.cost.get(k))
                out.append(
                    f"| {metric_name(k)} | {_cell(k, fb.metrics.get(k), fb.basis)} "
                    f"| {_cell(k, promoted_metrics.get(k), pb)} "
                    f"| {change} |"
                )
            out.append("")
        if fb.params:
            shown = ", ".join(f"`{k}={json.dumps(v, default=str)}`" for k, v in fb.params.items())
            out += [f"**Parameters**: {shown}", ""]
        else:
            out += ["**Parameters**: engine defaults", ""]
        out += ["**Run it**", "", "```bash", format_command(argv_lines(fb.argv)), "```", ""]
    if notes:
        out += ["## Notes", ""]
        out += [f"- {n}" for n in notes]
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Triggers

_MARGIN = 0.02  # differences below 2 % are measurement noise, not a reason to switch


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _memory_options(roles: OptionRoles) -> list[str]:
    """The engine's options where a lower value needs less memory, in the order a trigger
    names them: memory fraction, slots, context length, step token budget."""
    wanted = (roles.memory_fraction, roles.slots, roles.context_length, roles.step_tokens)
    return [name for name in wanted if name is not None]


def _uses_fp8(params: Mapping[str, object], roles: OptionRoles) -> bool:
    keys = [k for k in (roles.weight_quantization, roles.kv_dtype) if k is not None]
    return any("fp8" in str(params.get(k, "")).lower() for k in keys)


def _gpus(params: Mapping[str, object], roles: OptionRoles) -> int:
    n = 1
    for key in (roles.tensor_parallel, roles.pipeline_parallel):
        v = _number(params.get(key, 1)) if key is not None else None
        n *= int(v) if v else 1
    return n


def _fmt_param(value: float) -> str:
    return f"{value:g}"


def trigger_sentences(
    params: Mapping[str, object],
    metrics: Mapping[str, float | None],
    *,
    promoted_params: Mapping[str, object],
    promoted_metrics: Mapping[str, float | None],
    is_baseline: bool,
    roles: OptionRoles,
    rate_margin: float = 0.02,
    rate_settled: bool = False,
    rate_basis: str | None = None,
) -> list[str]:
    """When to switch from the promoted config to this one, from how the two differ.
    ``roles``: the engine's option roles, which name the options the triggers watch.

    The load trigger compares ``capacity`` when both configs have one (else goodput, else the
    request rate) and needs a lead above ``rate_margin`` (the capacity resolution: less is
    inside one measurement). ``rate_settled``: confirmation compared the two and promoted the
    other one, so no load trigger (it would contradict the decision). ``rate_basis`` (e.g.
    "single runs") is added to the load trigger's sentence.

    Less memory (a lower memory fraction / slots / context length / step token budget, e.g.
    vLLM's ``gpu_memory_utilization`` / ``max_num_seqs`` / ``max_model_len`` /
    ``max_num_batched_tokens``, or a measured peak lower by more than 2 %) -> out-of-memory at
    start-up; no fp8 (weights or KV cache) where the promoted uses it -> a GPU without fp8;
    fewer GPUs (tensor x pipeline parallel); eager mode ->
    CUDA graph capture failing; a higher goodput -> load above the promoted's goodput; lower
    latencies -> the load stays low and latency matters more. The baseline (engine defaults)
    is the last resort: after an engine upgrade, and when anything else fails. Parameters are
    compared only where both configs set them (a default is unknown here).
    """
    out: list[str] = []
    if is_baseline:
        out.append(
            "after an engine version change, until re-tuned: the engine defaults are the "
            "safest configuration (tuned flags may have changed meaning or been removed)"
        )

    less: list[str] = []
    for key in _memory_options(roles):
        mine, theirs = _number(params.get(key)), _number(promoted_params.get(key))
        if mine is not None and theirs is not None and mine < theirs:
            less.append(f"{key} {_fmt_param(mine)} instead of {_fmt_param(theirs)}")
    mine_mem, theirs_mem = (
        finite(metrics.get("peak_memory_gib")),
        finite(promoted_metrics.get("peak_memory_gib")),
    )
    if mine_mem is not None and theirs_mem is not None and mine_mem < theirs_mem * (1 - _MARGIN):
        less.append(f"measured peak memory {mine_mem:.1f} GiB instead of {theirs_mem:.1f} GiB")
    if less:
        out.append(
            "the promoted config fails to start with out of memory (less free memory than when "
            "tuned, e.g. another process on the GPU): this one needs less (" + "; ".join(less) + ")"
        )

    if _uses_fp8(promoted_params, roles) and not _uses_fp8(params, roles):
        out.append(
            "the GPU has no fp8 support (compute capability < 8.9, i.e. older than Ada/Hopper): "
            "this one does not use fp8"
        )
    if _gpus(params, roles) < _gpus(promoted_params, roles):
        out.append(
            f"fewer than {_gpus(promoted_params, roles)} GPUs are available: this one needs "
            f"{_gpus(params, roles)}"
        )
    eager = roles.eager
    if eager is not None and params.get(eager) is True and promoted_params.get(eager) is not True:
        out.append(
            "CUDA graph capture fails or start-up takes too long: this one runs in eager mode"
        )

    rate_key = "goodput" if "goodput" in metrics else "request_rate"
    if finite(metrics.get("capacity")) and finite(promoted_metrics.get("capacity")):
        rate_key = "capacity"
    mine_rate, theirs_rate = finite(metrics.get(rate_key)), finite(promoted_metrics.get(rate_key))
    if (
        not rate_settled
        and mine_rate is not None
        and theirs_rate is not None
        and mine_rate > theirs_rate * (1 + max(rate_margin, _MARGIN))
    ):
        out.append(
            f"the SLA is violated above {theirs_rate:.2f} req/s (the promoted config's measured "
            f"{metric_name(rate_key)}): this one kept it up to {mine_rate:.2f} req/s"
            + (f" ({rate_basis})" if rate_basis else "")
        )
    faster = []
    for key, value in promoted_metrics.items():
        mine, theirs = finite(metrics.get(key)), finite(value)
        if not LATENCY_METRIC.match(key) or mine is None or theirs is None:
            continue
        if mine < theirs * (1 - _MARGIN):
            faster.append(
                f"{metric_name(key)} {format_value(key, mine)} "
                f"instead of {format_value(key, theirs)}"
            )
    if faster:
        if mine_rate is not None and theirs_rate is not None and mine_rate < theirs_rate:
            lead = (
                f"the load stays below {mine_rate:.2f} req/s (its measured "
                f"{metric_name(rate_key)}; the promoted config's higher rate is not needed) "
                "and lower latency is wanted"
            )
        else:
            lead = "lower latency is wanted"
        out.append(f"{lead}: " + ", ".join(faster))

    if is_baseline:
        out.append("anything else fails: the engine defaults need no tuned flag")
    elif not out:
        out.append(
            "the promoted config fails or misses the SLA for another reason: this is the "
            "next best measured feasible config"
        )
    return out
