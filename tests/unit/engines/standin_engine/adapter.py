"""The stand-in engine's adapter: the one object through which the tuner uses it.

Each piece lives in its own module of this package (flags, launcher, logs, memory, deploy,
the search space ``standin.yaml``); this class puts them behind
:class:`~autotuner.engines.base.EngineAdapter`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotuner.core.hardware import HardwareProfile
from autotuner.core.options import EnvRule, OptionRule
from autotuner.core.types import Device, Params, ParamValue
from autotuner.engines.base import (
    CrashTraits,
    DeployRenderer,
    EngineProcess,
    EnvNames,
    EnvTraits,
    LaunchCause,
    LaunchSpec,
    MemoryClaim,
    MetricNames,
    OptionRoles,
    ProfilerSetup,
)
from autotuner.engines.memory import MemoryEstimate
from tests.unit.engines.standin_engine import flags, logs, memory
from tests.unit.engines.standin_engine.deploy import StandinDeploy
from tests.unit.engines.standin_engine.launcher import (
    PYTHON_VAR,
    RESERVED_ENV,
    StandinEngine,
)

# The folder of this engine's search space (standin.yaml).
SPACE_DIR = Path(__file__).resolve().parent

# What the stand-in exposes on /metrics (autotuner/testing/standin.py: the first name of
# each reading; prometheus_client adds _total to counters).
METRICS = MetricNames(
    gauges={
        "kv_cache_usage": ("vllm:kv_cache_usage_perc",),
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
    },
    counters={
        "preemptions": ("vllm:num_preemptions_total",),
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
    },
    phases={
        "queue": "vllm:request_queue_time_seconds",
        "prefill": "vllm:request_prefill_time_seconds",
        "decode": "vllm:request_decode_time_seconds",
    },
)

ROLES = OptionRoles(slots="max_concurrency", context_length="max_model_len")

_HERE = "tests/unit/engines/standin_engine/adapter.py"
# Options an SLA may fix besides the space's.
OPTIONS: dict[str, OptionRule] = {
    "startup_delay_s": OptionRule("float", 0, 600, source=_HERE),
    "per_prompt_token_s": OptionRule("float", 0, 10, source=_HERE),
    "itl_per_running_s": OptionRule("float", 0, 10, source=_HERE),
    "load_format": OptionRule("categorical", choices=("dummy",), source=_HERE),
}

CRASH_TRAITS = CrashTraits(
    memory_params=frozenset({"kv_cache_tokens", "max_concurrency", "max_model_len"}),
    budget_params=frozenset({"kv_cache_tokens"}),
    neutral_params=frozenset({"ttft_s", "itl_s"}),
    kv_starved=logs.KV_STARVED,
)


def _device_of(distribution: str, version: str) -> Device:
    return "cpu"  # the stand-in never uses a GPU


ENV_TRAITS = EnvTraits(
    distributions=("autotuner",),
    device_of=_device_of,
    verify_import="autotuner.testing.standin",
    example_spec="autotuner==0.1.0",
    python_var=PYTHON_VAR,
)


def _refused_env(name: str) -> str:
    if name in RESERVED_ENV:
        return RESERVED_ENV[name]
    return f"{name} is not a variable an SLA may set for the stand-in (it reads none)"


class StandinAdapter:
    """The stand-in server (``python -m autotuner.testing.standin``) as an engine."""

    kind = "standin"
    display_name = "Stand-in (tests)"
    space_name = "standin"
    reserved_params: Mapping[str, str] = flags.RESERVED_PARAMS
    options: Mapping[str, OptionRule] = OPTIONS
    env_vars: Mapping[str, EnvRule] = {}
    reserved_env: Mapping[str, str] = RESERVED_ENV
    # It never reads weights: an architecture-only model is served as any other.
    random_weights: Mapping[str, ParamValue] = {"load_format": "dummy"}
    cpu_bind_env: str | None = None
    roles = ROLES
    env_names = EnvNames()
    metrics = METRICS
    crash_traits = CRASH_TRAITS
    levers_file: Path | None = None
    env_traits = ENV_TRAITS
    deploy: DeployRenderer = StandinDeploy()

    def params_to_args(self, params: Params) -> list[str]:
        return flags.params_to_args(params)

    def check_extra_args(self, args: Sequence[str]) -> None:
        flags.check_extra_args(args)

    def sla_args_settings(
        self, args: Sequence[str], rules: Mapping[str, OptionRule]
    ) -> list[tuple[int, str, bool | int | float | str]]:
        out: list[tuple[int, str, bool | int | float | str]] = []
        refused = {i for i, _ in self.check_sla_args(args, rules)}
        i = 0
        while i < len(args):
            flag, eq, value = args[i].partition("=")
            name = flags.option_of(flag)
            takes_next = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
            at = i + 1 if takes_next else i
            if flag.startswith("--") and (eq or takes_next) and not refused & {i, at}:
                out.append((i, name, rules[name].from_word(value if eq else args[at])))
            i += 2 if takes_next else 1
        return out

    def check_sla_args(
        self, args: Sequence[str], rules: Mapping[str, OptionRule]
    ) -> list[tuple[int, str]]:
        """Words are ``--option value`` or ``--option=value`` (the stand-in has no switches)."""
        problems: list[tuple[int, str]] = []
        i = 0
        while i < len(args):
            word = args[i]
            if not word.startswith("--") or word == "--":
                problems.append((i, f"{word!r} follows no option (options start with '--')"))
                i += 1
                continue
            flag, eq, value = word.partition("=")
            name = flags.option_of(flag)
            takes_next = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
            rule = rules.get(name)
            why: str | None = self.reserved_params.get(name)
            if why is None and any(r.startswith(flag) for r in flags.RESERVED_FLAGS):
                why = "set by the tuner"
            if why is None and rule is None:
                close = difflib.get_close_matches(name, list(rules), n=1)
                hint = f" (did you mean {flags.flag_of(close[0])!r}?)" if close else ""
                why = f"{flag} is not an option an SLA may set{hint}"
            if why is not None or rule is None:
                problems.append((i, why or "refused"))
                i += 2 if takes_next else 1
                continue
            if not eq and not takes_next:
                problems.append((i, f"{flag} needs a value"))
                i += 1
                continue
            bad = rule.problem(rule.from_word(value if eq else args[i + 1]))
            if bad is not None:
                problems.append((i if eq else i + 1, bad))
            i += 1 if eq else 2
        return problems

    def check_env(self, env: Mapping[str, str]) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        for name, value in env.items():
            rule = self.env_vars.get(name)
            if rule is None or name in RESERVED_ENV:
                problems.append((name, _refused_env(name)))
            elif (bad := rule.problem(value)) is not None:
                problems.append((name, bad))
        return problems

    def process(self, spec: LaunchSpec) -> EngineProcess:
        return StandinEngine(
            python=spec.python,
            model=spec.model,
            served_name=spec.served_name,
            params=spec.params,
            extra_args=list(spec.extra_args),
            env=spec.env,
            cuda_devices=None if spec.cuda_devices is None else list(spec.cuda_devices),
            log_path=spec.log_path,
            startup_timeout_s=spec.startup_timeout_s,
            cpus=spec.cpus,
        )

    def classify_failure(self, log_tail: str) -> LaunchCause:
        return logs.classify_failure(log_tail)

    def root_cause(self, log: str) -> list[str]:
        return logs.root_cause(log)

    def defaults(self, hardware: HardwareProfile, params: Params | None = None) -> Params:
        # The same on every device: the stand-in's own start-up values.
        return {
            "max_model_len": memory.DEFAULT_MAX_MODEL_LEN,
            "kv_cache_tokens": memory.DEFAULT_KV_CACHE_TOKENS,
        }

    def estimate_memory(
        self,
        model_cfg: Mapping[str, object],
        params: Params,
        hardware: HardwareProfile,
        *,
        context_len: int | None = None,
        env: Mapping[str, str] | None = None,
        check_free: bool = True,
    ) -> MemoryEstimate:
        return memory.estimate(params, hardware, context_len)

    def check(
        self,
        params: Params,
        *,
        model_cfg: Mapping[str, object],
        hardware: HardwareProfile,
        context_len: int | None,
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        est = memory.estimate(params, hardware, context_len)
        return [] if est.fits else [est.reason]

    def memory_claim(self, params: Params, hardware: HardwareProfile) -> MemoryClaim | None:
        return memory.claim(params, hardware)

    def profiler(self, version: str, trace_dir: Path) -> ProfilerSetup | None:
        return None  # the stand-in has no profiler


ADAPTER = StandinAdapter()
