"""The contract every engine follows: one :class:`EngineAdapter` per engine kind.

An engine is a server process the tuner starts, load-tests and stops. Engines never run in the
tuner's interpreter: they are subprocesses with their own environment, started from an argv
list in their own process group, bound to 127.0.0.1 on a port the tuner picked.

The adapter owns everything engine-specific (flags, defaults, metric names, log patterns,
memory model, pruning rules, deploy files, how its interpreters are installed); the rest of
the tuner holds an adapter from :mod:`autotuner.engines.registry` and talks only to the
Protocols below. An engine kind is added by a subpackage of :mod:`autotuner.engines` whose
import registers its adapter, plus its ``search_spaces/<space_name>.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from autotuner.core.errors import EngineStartFailed
from autotuner.core.options import EnvRule, OptionRule
from autotuner.core.types import Device, Params, ParamValue

if TYPE_CHECKING:
    import psutil

    from autotuner.core.hardware import HardwareProfile
    from autotuner.engines.memory import MemoryEstimate


class LaunchCause(StrEnum):
    """Why an engine failed to come up, as read from its log."""

    UNKNOWN_FLAG = "unknown_flag"
    OUT_OF_MEMORY = "out_of_memory"
    CUDA_ERROR = "cuda_error"
    TIMEOUT = "timeout"
    OTHER = "other"


class EngineLaunchError(EngineStartFailed, RuntimeError):
    """The engine exited, or never became healthy, before serving.

    ``cause`` is the classification, ``log_tail`` the last lines of its log (for humans),
    ``returncode`` the exit status when it exited (``None`` on a time-out), ``root_cause`` the
    lines of the whole log that say why (the tail often ends at "see root cause above"); the
    message quotes the first of them.
    """

    def __init__(
        self,
        cause: LaunchCause,
        message: str,
        log_tail: str,
        returncode: int | None,
        *,
        root_cause: Sequence[str] = (),
    ) -> None:
        super().__init__(f"engine failed to start ({cause.value}): {message}")
        self.cause = cause
        self.message = message
        self.log_tail = log_tail
        self.returncode = returncode
        self.root_cause = tuple(root_cause)


@dataclass(frozen=True)
class Endpoint:
    """A running engine's OpenAI-compatible server."""

    base_url: str
    model: str
    pid: int
    argv: tuple[str, ...]
    log_path: Path
    startup_s: float
    # Every server's base URL when the config runs as several engine servers (replicas);
    # empty: just ``base_url``.
    replica_urls: tuple[str, ...] = ()

    @property
    def urls(self) -> tuple[str, ...]:
        """The base URLs the load generator spreads requests over."""
        return self.replica_urls or (self.base_url,)


# --------------------------------------------------------------------------- one launch


@dataclass(frozen=True)
class LaunchSpec:
    """What one launch needs besides the engine itself; the adapter makes argv and env of it.

    ``params`` are engine options in snake_case, ``extra_args`` literal command-line words
    (the SLA's ``engine.args``), ``env`` variables added to the child's environment.
    ``cuda_devices`` None: no GPU is visible to the engine (a CPU run). ``cpus``: the CPU
    cores every engine process may run on (:mod:`autotuner.engines.cores`); None: the tuner's.
    """

    python: Path
    model: Path
    served_name: str
    params: Params
    log_path: Path
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cuda_devices: tuple[str, ...] | None = None
    startup_timeout_s: float = 900.0
    cpus: tuple[int, ...] | None = None


class EngineProcess(Protocol):
    """One engine server for one config. Lifecycle: ``launch`` once, then ``stop`` (always,
    in ``finally``); ``kill_now`` is the synchronous stop for signal handlers."""

    kind: str
    log_path: Path
    cuda_devices: list[str] | None

    def argv(self) -> list[str]:
        """The exact command line that ``launch`` runs (for manifests and deploy files)."""
        ...

    @property
    def pid(self) -> int | None:
        """The server's process id once launched."""
        ...

    async def launch(self) -> Endpoint:
        """Start the engine and return once it answers its health check.

        Raises :class:`EngineLaunchError` when it exits early or misses its deadline; the
        process group is already reaped then.
        """
        ...

    async def stop(self) -> None:
        """Reap the whole process group (SIGTERM, then SIGKILL). Safe to call twice."""
        ...

    def kill_now(self) -> None:
        """:meth:`stop` without an event loop (signal handlers, ``atexit``)."""
        ...

    def processes(self) -> list[psutil.Process]:
        """The engine's live process tree (the monitor samples its memory)."""
        ...

    def returncode(self) -> int | None:
        """The exit status once the server exited, else None."""
        ...


# --------------------------------------------------------------------------- what it knows


@dataclass(frozen=True)
class MetricNames:
    """Where the monitor finds its readings in the engine's Prometheus ``/metrics``.

    Keys are the tuner's reading names (``kv_cache_usage``, ``preemptions``, ``queue``, ...),
    values the engine's sample names; a reading lists every name it has had across releases,
    the first one present wins. ``phases`` are histogram base names (``_sum``/``_count``).
    """

    gauges: Mapping[str, tuple[str, ...]]
    counters: Mapping[str, tuple[str, ...]]
    phases: Mapping[str, str]

    def names(self) -> frozenset[str]:
        """Every sample name this engine may expose for the monitor."""
        out = {n for names in (*self.gauges.values(), *self.counters.values()) for n in names}
        return frozenset(out | set(self.phases.values()))


@dataclass(frozen=True)
class OptionRoles:
    """The engine's option names for the engine-neutral concepts the tuner reasons about.

    Outside its engine package the tuner never spells an engine's option: it asks the adapter
    which option plays a role (a config's ``params`` are keyed by the engine's own names, so
    ``params[roles.tensor_parallel]`` is that config's tensor-parallel size). None: the engine
    has no option for that role (the tuner then treats the role as absent: one rank, no
    limit, the engine's own choice).

    - ``tensor_parallel``: ranks one model copy's layers are split across (an int, default 1);
    - ``pipeline_parallel``: pipeline stages one model copy is cut into (an int, default 1);
    - ``data_parallel``: model copies serving side by side (an int, default 1); its presence
      among the adapter's ``options`` says the engine can run them itself;
    - ``slots``: the most sequences the engine schedules at once (its concurrent batch);
    - ``step_tokens``: the token budget of one scheduler step (prefill and decode together);
    - ``memory_fraction``: the share of the device's memory the engine claims (0..1);
    - ``kv_block``: tokens per KV-cache block (the unit the cache is allotted in);
    - ``context_length``: the longest sequence (prompt plus output) the engine serves;
    - ``eager``: a switch that runs the model without captured graphs (a bool);
    - ``weight_quantization``: how the weights are quantized at load (e.g. ``fp8``);
    - ``kv_dtype``: the data type the KV cache is stored in (e.g. ``fp8``).
    """

    tensor_parallel: str | None = None
    pipeline_parallel: str | None = None
    data_parallel: str | None = None
    slots: str | None = None
    step_tokens: str | None = None
    memory_fraction: str | None = None
    kv_block: str | None = None
    context_length: str | None = None
    eager: str | None = None
    weight_quantization: str | None = None
    kv_dtype: str | None = None

    def named(self) -> dict[str, str]:
        """Role -> option name, for the roles the engine has."""
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class EnvNames:
    """The engine's environment variables that the doctor's checks read (None: the engine has
    no such variable).

    - ``attention_backend``: names the attention kernels the engine uses;
    - ``flash_attention_version``: the FlashAttention major version (``"2"`` / ``"3"``);
    - ``cache_root``: where the engine keeps compiled artefacts; ``cache_default`` is that
      place when the variable is unset, relative to the home directory.
    """

    attention_backend: str | None = None
    flash_attention_version: str | None = None
    cache_root: str | None = None
    cache_default: str | None = None


@dataclass(frozen=True)
class CrashTraits:
    """What the crash memory needs to know of the engine's options and logs.

    ``memory_params``: numeric options where a larger value needs more memory;
    ``budget_params``: the subset that sizes the KV cache (raising them helps when the cache
    was too small for one sequence); ``neutral_params``: options that do not change memory
    use; ``kv_starved``: log text saying the KV cache could not hold one sequence.
    """

    memory_params: frozenset[str]
    budget_params: frozenset[str]
    neutral_params: frozenset[str]
    kv_starved: re.Pattern[str]


@dataclass(frozen=True)
class EnvTraits:
    """What :mod:`autotuner.engines.envs` needs to install, recognise and pick interpreters.

    ``distributions``: pip distribution names that provide the engine, in probe order;
    ``device_of(distribution, version)``: the device a distribution serves on;
    ``verify_import``: the module a fresh install must import; ``uninstall_after``: packages
    removed after installing (conflicts); ``python_var``: the environment variable that forces
    the interpreter; ``example_spec``: a pinned spec for help texts.
    """

    distributions: tuple[str, ...]
    device_of: Callable[[str, str], Device]
    verify_import: str
    example_spec: str
    python_var: str
    uninstall_after: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemoryClaim:
    """Device memory a config takes up front, for the SLA's memory limit before launch."""

    gib: float
    how: str  # the arithmetic, for the reason a config is pruned


@dataclass(frozen=True)
class ProfilerSetup:
    """How to run an engine under its own profiler (a separate launch, never a measured one).

    ``args`` and ``env`` are added to the launch; ``start_path`` / ``stop_path`` are POSTed
    to the running server around the profiled window; the traces land in the ``trace_dir``
    the setup was made for, and files whose name contains one of ``skip`` are not the
    workers' (e.g. the API server's own CPU trace).
    """

    args: tuple[str, ...]
    env: Mapping[str, str]
    start_path: str = "/start_profile"
    stop_path: str = "/stop_profile"
    skip: tuple[str, ...] = ()


class DeployRenderer(Protocol):
    """Renders a promoted config as files to serve it with; every method is pure."""

    def default_image(self, engine_version: str, *, cpu: bool = False) -> str:
        """The official container image pinned to ``engine_version``."""
        ...

    def serve_command(
        self,
        params: Mapping[str, object],
        *,
        model: str,
        served_name: str,
        port: int = 8000,
        host: str = "127.0.0.1",
        python: str | None = None,
    ) -> list[str]:
        """The argv that serves ``model`` with ``params`` (``python``: through that
        interpreter instead of the engine's console script)."""
        ...

    def serve_script(
        self,
        argv: Sequence[str],
        *,
        header: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        """A bash script that ``exec``s ``argv`` with the environment the engine was measured
        with (``env``: the SLA's ``engine.env``, to which the engine's launcher adds its own);
        ``header`` lines become comments."""
        ...

    def docker_run(
        self,
        params: Mapping[str, object],
        *,
        model_dir: str,
        served_name: str,
        gpu_uuids: Sequence[str],
        image: str,
        port: int = 8000,
        shm_size: str | None = "16g",
        env: Mapping[str, str] | None = None,
    ) -> str:
        """A locked-down ``docker run`` script (port published on 127.0.0.1 only)."""
        ...

    def compose_file(
        self,
        params: Mapping[str, object],
        *,
        model_dir: str,
        served_name: str,
        gpu_slices: Sequence[Sequence[str]],
        image: str,
        port: int = 8000,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """A Docker Compose file, one service per engine server (``gpu_slices``: each one's
        GPU UUIDs, empty on a CPU target), published on 127.0.0.1 from ``port`` up; ``env``
        as for :meth:`serve_script`."""
        ...

    def k8s_deployment(
        self,
        params: Mapping[str, object],
        *,
        name: str,
        served_name: str,
        image: str,
        gpus: int,
        model_subpath: str,
        model_pvc: str = "models",
        env: Mapping[str, str] | None = None,
        startup_timeout_s: int = 1200,
        replicas: int = 1,
    ) -> str:
        """A Kubernetes Deployment (``replicas`` pods of ``gpus`` GPUs each) and its ClusterIP
        Service as YAML."""
        ...


class EngineAdapter(Protocol):
    """Everything the tuner knows about one engine kind.

    ``kind`` is the SLA's ``engine.kind`` and the registry key; ``display_name`` is for
    people; ``space_name`` names ``search_spaces/<space_name>*.yaml``; ``reserved_params``
    maps the options the tuner sets itself (snake_case) to why; ``random_weights`` are the
    options that load random weights (architecture-only models).

    What an SLA may pass the engine is allow-listed (it runs as the tuner's user): ``options``
    are the options an SLA may fix besides those its search space declares, with the values
    they take; ``env_vars`` the environment variables it may set, with the values they take;
    ``reserved_env`` the variables the engine process sets itself, last (leased devices), and
    why.
    """

    kind: str
    display_name: str
    space_name: str
    reserved_params: Mapping[str, str]
    options: Mapping[str, OptionRule]
    env_vars: Mapping[str, EnvRule]
    reserved_env: Mapping[str, str]
    random_weights: Mapping[str, ParamValue]
    # The environment variable that pins one engine server to CPU cores (a list such as
    # "0,1"): replicas on a CPU target get disjoint cores. None: the engine has none.
    cpu_bind_env: str | None
    # Which of the engine's options plays each engine-neutral role (layout, slots, step
    # budget, memory share...): the only way code outside the engine's package names one.
    roles: OptionRoles
    # The engine's environment variables the doctor reads.
    env_names: EnvNames
    metrics: MetricNames
    crash_traits: CrashTraits
    env_traits: EnvTraits
    deploy: DeployRenderer
    # The engine's lever table (which option moves which SLA limit, and where that was
    # measured; autotuner/search/levers.py reads it). None: the engine has none.
    levers_file: Path | None

    def params_to_args(self, params: Params) -> list[str]:
        """Engine options -> command-line words. Raises ValueError for a reserved option."""
        ...

    def check_extra_args(self, args: Sequence[str]) -> None:
        """Raise ValueError when literal arguments would set a reserved flag."""
        ...

    def check_sla_args(
        self, args: Sequence[str], rules: Mapping[str, OptionRule]
    ) -> list[tuple[int, str]]:
        """``(index, why)`` for each refused word of an SLA's ``engine.args``: options not in
        ``rules`` (the space's and :attr:`options`), reserved flags in any spelling, values
        their rule refuses."""
        ...

    def sla_args_settings(
        self, args: Sequence[str], rules: Mapping[str, OptionRule]
    ) -> list[tuple[int, str, bool | int | float | str]]:
        """``(index, option, value)`` for each option an SLA's ``engine.args`` sets (args
        :meth:`check_sla_args` accepted), typed by its rule: the args as engine options, to
        be merged with ``engine.params`` (never appended to a command line as words)."""
        ...

    def check_env(self, env: Mapping[str, str]) -> list[tuple[str, str]]:
        """``(name, why)`` for each variable of an SLA's ``engine.env`` that is refused: not in
        :attr:`env_vars`, in :attr:`reserved_env`, or a value of the wrong shape."""
        ...

    def process(self, spec: LaunchSpec) -> EngineProcess:
        """The (not yet started) server process for ``spec``; binds 127.0.0.1."""
        ...

    def classify_failure(self, log_tail: str) -> LaunchCause:
        """Why a launch failed, from the last lines of the engine's log."""
        ...

    def root_cause(self, log: str) -> list[str]:
        """The first lines of an engine log that say why it failed (empty: none found)."""
        ...

    def defaults(self, hardware: HardwareProfile, params: Params | None = None) -> Params:
        """The engine's own values, on ``hardware``, of options it decides per device
        (given the other ``params``, e.g. a performance mode that scales them)."""
        ...

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
        """How the engine would size weights, overhead and KV cache of ``params``
        (``context_len``: the context length to size for; None: the one ``params`` or the
        model's config gives)."""
        ...

    def check(
        self,
        params: Params,
        *,
        model_cfg: Mapping[str, object],
        hardware: HardwareProfile,
        context_len: int | None,
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Reasons ``params`` must not be launched on ``hardware`` (empty: launch it);
        ``context_len`` as for :meth:`estimate_memory`."""
        ...

    def memory_claim(self, params: Params, hardware: HardwareProfile) -> MemoryClaim | None:
        """Device memory ``params`` takes up front; None when the engine claims none ahead
        (a CPU run)."""
        ...

    def profiler(self, version: str, trace_dir: Path) -> ProfilerSetup | None:
        """How engine ``version`` profiles into ``trace_dir`` (an absolute path); None when
        that version has no profiler the tuner can drive."""
        ...
