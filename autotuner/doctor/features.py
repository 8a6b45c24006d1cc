"""Feature checks: what the SLA asks of the engine against the engine version and the hardware.

* Fixed options (``engine.params``, and those ``engine.args`` spells out) go through the search
  space's declarations one by one, as if pinned in ``search:``: an option the installed version
  does not have (the engine refuses the flag: fatal), a value the hardware cannot run (FP8 below
  compute capability 8.9, more tensor-parallel ranks than GPUs: fatal).
* The ``search:`` section is resolved as ``tune`` resolves it: a problem there stops the tune
  before its first launch (fatal); values the hardware cannot run are left out (a warning
  when the SLA listed them itself).
* What the space does not declare: ``dtype: bfloat16`` below compute capability 8.0, the
  attention backend chosen through the engine's environment (the variables its adapter names
  in ``env_names``; vLLM's ``VLLM_ATTENTION_BACKEND`` / ``VLLM_FLASH_ATTN_VERSION``), and ranks
  (tensor x pipeline parallel, the options of the adapter's roles) beyond the target's GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotuner.core.hardware import HardwareProfile
from autotuner.core.types import ParamValue
from autotuner.engines.base import EngineAdapter, EnvNames, OptionRoles
from autotuner.records.doctor import Finding
from autotuner.sla.allowed import option_rules
from autotuner.sla.spec import Sla
from autotuner.space import ParamOverride, SearchSpace, SpaceError, load_space_for

# Attention backends a GPU needs a compute capability range for: (lowest, below this or None).
# From the backends' own support checks (FlashAttention 2: Ampere+; FlashAttention 3 and
# FlashMLA: Hopper; FlashInfer: Turing+).
GPU_BACKENDS: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = {
    "FLASH_ATTN": ((8, 0), None),
    "FLASHINFER": ((7, 5), None),
    "FLASHMLA": ((9, 0), (11, 0)),
    "FLASH_ATTN_MLA": ((9, 0), (10, 0)),
    "CUTLASS_MLA": ((10, 0), (11, 0)),
    "TRITON_ATTN": ((7, 0), None),
    "TRITON_MLA": ((7, 0), None),
    "FLEX_ATTENTION": ((7, 0), None),
    "TREE_ATTN": ((7, 0), None),
    "XFORMERS": ((7, 0), None),
}
CPU_BACKENDS = frozenset({"TORCH_SDPA", "CPU_ATTN"})


@dataclass(frozen=True)
class Fixed:
    """An option the SLA fixes, and where (``engine.params.x`` / ``engine.args[3]``)."""

    name: str
    value: ParamValue
    where: str


def fixed_options(sla: Sla, engine: EngineAdapter) -> list[Fixed]:
    """``engine.params``, then the options ``engine.args`` sets (already validated), read by
    the same parser the launch uses (``engine``'s ``sla_args_settings``)."""
    out = [Fixed(k, v, f"engine.params.{k}") for k, v in sla.engine.params.items()]
    rules = option_rules(sla.engine.kind)
    for i, name, value in engine.sla_args_settings(sla.engine.args, rules):
        out.append(Fixed(name, value, f"engine.args[{i}]"))
    return out


def feature_findings(
    sla: Sla, version: str, hw: HardwareProfile, engine: EngineAdapter
) -> tuple[list[Finding], SearchSpace | None]:
    """Findings for ``sla`` on ``engine`` (the adapter of its kind) ``version`` and ``hw``;
    the resolved space (None when the ``search:`` section does not resolve)."""
    space_name = engine.space_name
    fixed = fixed_options(sla, engine)
    out: list[Finding] = []
    for f in fixed:
        out += _fixed_problem(f, space_name, version, hw, sla)
    out += _ranks(fixed, hw, engine.roles)
    out += _dtype(fixed, hw)
    out += _attention(sla.engine.env, hw, engine.env_names)
    space: SearchSpace | None = None
    try:
        space = load_space_for(
            space_name,
            version,
            hw,
            allow_lossy=sla.search.allow_lossy,
            overrides=sla.search.params,
            engine_params=sla.engine.settings(),
        )
    except SpaceError as e:
        for p in e.problems:
            out.append(
                Finding(
                    check="feature.search",
                    status="fatal",
                    found=p,
                    action=f"change the SLA's search: section; `tune` stops here on {version}",
                )
            )
    if space is not None:
        out += _left_out(space, sla)
    if not any(f.status != "ok" for f in out):
        out.append(
            Finding(
                check="feature",
                status="ok",
                found=f"every option the SLA fixes or searches runs on {version} and this hardware",
            )
        )
    return out, space


def _fixed_problem(
    f: Fixed, space_name: str, version: str, hw: HardwareProfile, sla: Sla
) -> list[Finding]:
    # Resolve it alone, as a pinned search value: the space checks versions and hardware.
    if isinstance(f.value, dict):  # a JSON option (none the space declares)
        return []
    try:
        load_space_for(
            space_name,
            version,
            hw,
            allow_lossy=True,  # lossiness is the SLA's choice for what it fixes
            overrides={f.name: ParamOverride.model_validate({"fixed": f.value})},
        )
    except SpaceError as e:
        problems = [
            p
            for p in e.problems
            if "not a parameter of the space" not in p
            # the CPU engine's ranks are NUMA nodes, not GPUs
            and not (hw.device == "cpu" and "GPU(s)" in p)
        ]
        return [
            Finding(
                check=f"feature.{f.name}",
                status="fatal",
                found=f"{f.where}: " + p.split(": ", 1)[-1],
                action=_fix(f, p),
            )
            for p in problems
        ]
    return []


def _fix(f: Fixed, problem: str) -> str:
    if "has no such option" in problem:
        return (
            f"remove {f.name} from the SLA, or use an engine version that has it: the "
            "engine refuses unknown flags at start-up"
        )
    return f"remove {f.name} from the SLA or pick a value this hardware runs"


def value_of(fixed: Sequence[Fixed], name: str | None) -> ParamValue:
    """The value the SLA fixes for option ``name`` (None: none, or no such option)."""
    if name is None:
        return None
    return next((f.value for f in reversed(fixed) if f.name == name), None)


def _ranks(fixed: Sequence[Fixed], hw: HardwareProfile, roles: OptionRoles) -> list[Finding]:
    if hw.device != "gpu":
        return []
    tp = value_of(fixed, roles.tensor_parallel)
    pp = value_of(fixed, roles.pipeline_parallel)
    ranks = (tp if isinstance(tp, int) else 1) * (pp if isinstance(pp, int) else 1)
    if ranks > hw.gpu_count > 0 and isinstance(pp, int) and pp > 1:
        return [
            Finding(
                check="feature.parallel",
                status="fatal",
                found=f"tensor x pipeline parallel = {ranks} ranks, the target has "
                f"{hw.gpu_count} GPU(s)",
                action="list more GPUs in target, or lower the parallel sizes",
            )
        ]
    return []


def _dtype(fixed: Sequence[Fixed], hw: HardwareProfile) -> list[Finding]:
    cc = hw.compute_capability
    if hw.device != "gpu" or cc is None or cc >= (8, 0):
        return []
    if value_of(fixed, "dtype") == "bfloat16":
        return [
            Finding(
                check="feature.dtype",
                status="fatal",
                found=f"dtype bfloat16 needs compute capability 8.0, the GPU has {cc[0]}.{cc[1]}",
                action="use dtype: half (float16)",
            )
        ]
    return []


def _attention(env: Mapping[str, str], hw: HardwareProfile, names: EnvNames) -> list[Finding]:
    """The attention backend and FlashAttention version ``env`` picks, against ``hw`` (the
    variables are the engine's ``names``; an engine without them: nothing to check)."""
    out: list[Finding] = []
    var = names.attention_backend
    backend = env.get(var) if var is not None else None
    cc = hw.compute_capability
    if backend is not None:
        if hw.device == "cpu":
            if backend not in CPU_BACKENDS:
                out.append(
                    Finding(
                        check="feature.attention",
                        status="warning",
                        found=f"{var}={backend} on a CPU target: the CPU "
                        "engine ignores it and uses its own kernels",
                        action="leave it out of engine.env for a CPU target",
                    )
                )
        elif backend in CPU_BACKENDS:
            out.append(
                Finding(
                    check="feature.attention",
                    status="fatal",
                    found=f"{var}={backend} is a CPU backend, the target is a GPU",
                    action="leave it out, or name a GPU backend (FLASH_ATTN, FLASHINFER, ...)",
                )
            )
        elif backend not in GPU_BACKENDS:
            out.append(
                Finding(
                    check="feature.attention",
                    status="warning",
                    found=f"{var}={backend}: not a backend the doctor knows",
                    action="check the name against the engine's release (known: "
                    f"{', '.join(GPU_BACKENDS)})",
                )
            )
        elif cc is not None:
            low, below = GPU_BACKENDS[backend]
            if cc < low or (below is not None and cc >= below):
                span = f">= {low[0]}.{low[1]}" + (
                    "" if below is None else f" and < {below[0]}.{below[1]}"
                )
                out.append(
                    Finding(
                        check="feature.attention",
                        status="fatal",
                        found=f"{var}={backend} needs compute capability "
                        f"{span}, the GPU has {cc[0]}.{cc[1]}",
                        action="leave it out (the engine picks a backend the GPU runs) or name "
                        "another one",
                    )
                )
    fa_var = names.flash_attention_version
    fa = env.get(fa_var) if fa_var is not None else None
    if fa == "3" and hw.device == "gpu" and cc is not None and cc[0] != 9:
        out.append(
            Finding(
                check="feature.attention",
                status="fatal",
                found=f"{fa_var}=3 (FlashAttention 3) runs on Hopper (compute "
                f"capability 9.x), the GPU has {cc[0]}.{cc[1]}",
                action=f"use {fa_var}=2, or leave it out",
            )
        )
    return out


def _left_out(space: SearchSpace, sla: Sla) -> list[Finding]:
    """Searched values the hardware can't run, one line per parameter and reason: dropped by
    the space; a warning when the SLA listed them itself."""
    groups: dict[tuple[str, str, bool], list[str]] = {}
    for d in space.dropped:
        if not d.is_choice or ("needs" not in d.reason and "more than" not in d.reason):
            continue
        ov = sla.search.params.get(d.param)
        asked = ov is not None and ov.values is not None and d.value in ov.values
        groups.setdefault((d.param, d.reason, asked), []).append(str(d.value))
    return [
        Finding(
            check=f"feature.{param}",
            status="warning" if asked else "ok",
            found=f"{param} {', '.join(values)} left out of the search: {reason}",
            action="remove them from search.params" if asked else None,
        )
        for (param, reason, asked), values in groups.items()
    ]
