"""The engine adapter contract: every registered adapter passes the same checks.

A new engine kind registers its adapter and gets these tests for free; what cannot be said
without knowing the engine (sample log tails, a parameter to render) is asked of it in the
tables below, and a kind missing from them fails loudly.

An engine outside ``autotuner/engines`` (a test-only one) runs the same suite: its test module
imports these tests and overrides the ``adapter``, ``samples`` and ``space_dir`` fixtures
(tests/unit/engines/test_standin_engine.py).
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.core.errors import BadInput
from autotuner.core.hardware import GIB, CpuInfo, GpuInfo, HardwareProfile
from autotuner.core.types import ParamValue
from autotuner.engines import registry
from autotuner.engines.base import (
    EngineAdapter,
    EngineProcess,
    LaunchCause,
    LaunchSpec,
    MetricNames,
)
from autotuner.engines.memory import MemoryEstimate
from autotuner.models import synth
from autotuner.sla.spec import SlaError, parse_sla
from autotuner.space import spaces_dir

ADAPTERS = registry.adapters()
KINDS = [a.kind for a in ADAPTERS]

# Log tails as each engine prints them when a launch fails, per cause.
SAMPLE_LOGS: dict[str, dict[LaunchCause, str]] = {
    "vllm": {
        LaunchCause.UNKNOWN_FLAG: "api_server.py: error: unrecognized arguments: --bogus",
        LaunchCause.OUT_OF_MEMORY: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate",
        LaunchCause.CUDA_ERROR: "RuntimeError: CUDA error: no kernel image is available",
        LaunchCause.OTHER: "KeyError: 'model_type'",
    },
}
# One ordinary option per engine with the command-line words it must become.
SAMPLE_PARAM: dict[str, tuple[dict[str, ParamValue], list[str]]] = {
    "vllm": ({"max_num_seqs": 8}, ["--max-num-seqs", "8"]),
}
# Readings the monitor and the bench report use; every engine must say where to find them.
READINGS = {
    "gauges": {"kv_cache_usage", "running", "waiting"},
    "counters": {"preemptions", "prompt_tokens", "generation_tokens"},
    "phases": {"queue", "prefill", "decode"},
}

ROOT = Path(__file__).resolve().parents[3]


def protocol_members(proto: type) -> set[str]:
    """Attributes and methods a Protocol class declares (its own, not ``object``'s)."""
    names = set(getattr(proto, "__annotations__", {}))
    names |= {n for n, v in vars(proto).items() if not n.startswith("_") and callable(v)}
    names |= {n for n, v in vars(proto).items() if isinstance(v, property)}
    return names


def host() -> CpuInfo:
    return CpuInfo(
        model="test CPU",
        cores=8,
        logical_cpus=8,
        memory_total=32 * GIB,
        memory_available=30 * GIB,
        numa_memory=(32 * GIB,),
        numa_node_of_first_cpu=0,
        flags=frozenset({"avx2", "avx512f"}),
    )


def cpu_profile() -> HardwareProfile:
    return HardwareProfile(device="cpu", cpu=host())


def gpu_profile() -> HardwareProfile:
    gpu = GpuInfo(0, "GPU-0", "NVIDIA H200", (9, 0), 150 * GIB)
    return HardwareProfile(device="gpu", cpu=host(), gpus=(gpu,))


def spec(
    tmp_path: Path, params: Mapping[str, ParamValue], extra: tuple[str, ...] = ()
) -> LaunchSpec:
    return LaunchSpec(
        python=Path("/venv/bin/python"),
        model=Path("/models/tiny"),
        served_name="tiny",
        params=dict(params),
        log_path=tmp_path / "engine.log",
        extra_args=extra,
    )


def space_params(adapter: EngineAdapter, space_dir: Path) -> set[str]:
    files = sorted(space_dir.glob(f"{adapter.space_name}*.yaml"))
    names: set[str] = set()
    for f in files:
        data = yaml.safe_load(f.read_text())
        assert data["engine"] == adapter.kind, f
        names |= {p["name"] for p in data["params"]}
    return names


@dataclass(frozen=True)
class Samples:
    """What the suite cannot know of an engine: ``logs``, a log tail per launch cause;
    ``param``, one ordinary option and the command-line words it must become (None: the
    engine has no entry in the tables)."""

    logs: Mapping[LaunchCause, str] | None
    param: tuple[dict[str, ParamValue], list[str]] | None


@pytest.fixture(params=ADAPTERS, ids=KINDS)
def adapter(request: pytest.FixtureRequest) -> EngineAdapter:
    a: EngineAdapter = request.param
    return a


@pytest.fixture
def samples(adapter: EngineAdapter) -> Samples:
    """The adapter's entries in :data:`SAMPLE_LOGS` and :data:`SAMPLE_PARAM`."""
    return Samples(SAMPLE_LOGS.get(adapter.kind), SAMPLE_PARAM.get(adapter.kind))


@pytest.fixture
def space_dir() -> Path:
    """The folder the adapter's ``<space_name>*.yaml`` files are in."""
    return spaces_dir()


# --------------------------------------------------------------------------- registry


def test_the_registry_has_a_default_and_finds_each_kind() -> None:
    assert KINDS, "no engine adapter registered"
    assert registry.default_kind() in KINDS
    for a in ADAPTERS:
        assert registry.get(a.kind) is a


def test_an_unknown_kind_is_a_clear_bad_input() -> None:
    with pytest.raises(BadInput) as info:
        registry.get("no-such-engine")
    message = str(info.value)
    assert "unknown engine kind 'no-such-engine'" in message
    assert all(kind in message for kind in KINDS)
    assert info.value.exit_code == 2


def test_registering_a_second_default_is_refused(adapter: EngineAdapter) -> None:
    class Other:
        kind = "other-engine"

    if registry.default_kind() == adapter.kind:
        with pytest.raises(ValueError, match="both claim the default"):
            registry.register(Other(), default=True)  # type: ignore[arg-type]
    assert "other-engine" not in registry.kinds()


def test_every_kind_has_contract_samples(samples: Samples) -> None:
    assert samples.logs is not None and samples.param is not None


# --------------------------------------------------------------------------- completeness


def test_the_adapter_has_every_member_of_the_protocol(adapter: EngineAdapter) -> None:
    missing = {n for n in protocol_members(EngineAdapter) if not hasattr(adapter, n)}
    assert not missing
    assert adapter.kind and adapter.display_name and adapter.space_name


def test_the_process_has_every_member_of_the_protocol(
    adapter: EngineAdapter, tmp_path: Path
) -> None:
    proc = adapter.process(spec(tmp_path, {}))
    missing = {n for n in protocol_members(EngineProcess) if not hasattr(proc, n)}
    assert not missing
    assert proc.kind == adapter.kind
    assert proc.log_path == tmp_path / "engine.log"
    # Before launch: nothing runs, and stopping is harmless.
    assert proc.pid is None and proc.returncode() is None and proc.processes() == []
    proc.kill_now()
    asyncio.run(proc.stop())
    assert not (tmp_path / "engine.log").exists()


# --------------------------------------------------------------------------- argv and flags


def test_argv_binds_loopback_and_carries_the_params(
    adapter: EngineAdapter, samples: Samples, tmp_path: Path
) -> None:
    assert samples.param is not None
    params, words = samples.param
    assert adapter.params_to_args(params) == words
    argv = adapter.process(spec(tmp_path, params, ("--extra", "1"))).argv()
    assert "127.0.0.1" in argv
    assert not any("0.0.0.0" in a for a in argv)
    assert argv[-4:] == [*words, "--extra", "1"]


def test_reserved_params_are_refused(adapter: EngineAdapter, tmp_path: Path) -> None:
    assert adapter.reserved_params
    for name in adapter.reserved_params:
        with pytest.raises(ValueError, match="set by the tuner"):
            adapter.params_to_args({name: "x"})
        with pytest.raises(ValueError, match="set by the tuner"):
            adapter.process(spec(tmp_path, {name: "x"})).argv()


def test_flags_the_tuner_sets_are_refused_as_extra_args(
    adapter: EngineAdapter, tmp_path: Path
) -> None:
    argv = adapter.process(spec(tmp_path, {})).argv()
    owned = [a for a in argv if a.startswith("--")]
    assert owned, "the tuner sets at least the bind address and port"
    for flag in owned:
        for words in ([flag, "x"], [f"{flag}=x"]):
            with pytest.raises(ValueError, match="set by the tuner"):
                adapter.check_extra_args(words)
            with pytest.raises(ValueError, match="set by the tuner"):
                adapter.process(spec(tmp_path, {}, tuple(words)))
    adapter.check_extra_args(["--seed", "1"])


def test_the_sla_schema_refuses_reserved_params_and_accepts_the_kind(
    adapter: EngineAdapter,
) -> None:
    base = (
        "model: {synth: tiny-llama}\n"
        "workload: {input_tokens: 8, output_tokens: 8, arrival: {process: poisson, rate: 1},"
        " requests: 4}\n"
        "constraints: {p99_ttft_ms: 5}\n"
    )
    sla = parse_sla(base + f"engine: {{kind: {adapter.kind}}}\n", "slo.yaml")
    assert sla.engine.kind == adapter.kind
    for name in adapter.reserved_params:
        with pytest.raises(SlaError, match="cannot be set here"):
            parse_sla(base + f"engine: {{params: {{{name}: x}}}}\n", "slo.yaml")


def test_random_weights_render_as_ordinary_options(adapter: EngineAdapter) -> None:
    assert not set(adapter.random_weights) & set(adapter.reserved_params)
    assert adapter.params_to_args(adapter.random_weights)


# --------------------------------------------------------------------------- logs and metrics


def test_failure_classification_on_sample_logs(adapter: EngineAdapter, samples: Samples) -> None:
    assert samples.logs is not None
    for cause, text in samples.logs.items():
        assert adapter.classify_failure("INFO starting\n" + text + "\n") == cause
    assert adapter.classify_failure("") == LaunchCause.OTHER


def test_metric_names_cover_the_readings(adapter: EngineAdapter) -> None:
    m: MetricNames = adapter.metrics
    for group, wanted in READINGS.items():
        table: Mapping[str, Any] = getattr(m, group)
        assert wanted <= set(table), group
        assert all(names for names in table.values()), group
    assert all(isinstance(n, str) and n for n in m.names())


def test_crash_traits_are_consistent(adapter: EngineAdapter, space_dir: Path) -> None:
    t = adapter.crash_traits
    assert t.memory_params and t.budget_params <= t.memory_params
    assert not t.memory_params & t.neutral_params
    declared = space_params(adapter, space_dir)
    assert t.memory_params <= declared | {"max_model_len", "kv_cache_memory_bytes"}


def test_roles_name_options_the_engine_has(adapter: EngineAdapter, space_dir: Path) -> None:
    # Code outside the engine's package spells its options only through these roles.
    known = space_params(adapter, space_dir) | set(adapter.options)
    named = adapter.roles.named()
    assert {role: name for role, name in named.items() if name not in known} == {}
    assert len(set(named.values())) == len(named)  # one option plays one role
    # The variables the doctor reads are ones an SLA may set (the cache root is the host's).
    names = adapter.env_names
    for var in (names.attention_backend, names.flash_attention_version):
        assert var is None or var in adapter.env_vars


# --------------------------------------------------------------------------- defaults, memory


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_defaults_per_device_name_space_parameters(
    adapter: EngineAdapter, space_dir: Path, device: str
) -> None:
    hw = cpu_profile() if device == "cpu" else gpu_profile()
    defaults = adapter.defaults(hw)
    assert defaults, f"no defaults on {device}"
    assert set(defaults) <= space_params(adapter, space_dir)
    assert all(v is not None for v in defaults.values())


def test_memory_hooks(adapter: EngineAdapter) -> None:
    cfg = synth.ARCHS["tiny-llama"].config()
    for hw in (cpu_profile(), gpu_profile()):
        est = adapter.estimate_memory(cfg, {}, hw, context_len=1024)
        assert isinstance(est, MemoryEstimate) and est.device == hw.device
        assert est.fits, est.reason
        assert adapter.check({}, model_cfg=cfg, hardware=hw, context_len=1024) == []
    assert adapter.memory_claim({}, cpu_profile()) is None
    claim = adapter.memory_claim({}, gpu_profile())
    assert claim is not None and claim.gib > 0 and claim.how


def test_env_traits(adapter: EngineAdapter) -> None:
    t = adapter.env_traits
    assert t.distributions and t.verify_import and t.python_var
    assert t.example_spec.split("==")[0] in t.distributions
    for dist in t.distributions:
        assert t.device_of(dist, "1.0.0") in ("cpu", "gpu")


# --------------------------------------------------------------------------- deploy renderer


def test_deploy_renderer(adapter: EngineAdapter, samples: Samples) -> None:
    d = adapter.deploy
    assert samples.param is not None
    params, words = samples.param
    argv = d.serve_command(params, model="/models/m", served_name="m")
    assert "127.0.0.1" in argv and argv[-len(words) :] == words
    via_python = d.serve_command(params, model="/models/m", served_name="m", python="/py")
    assert via_python[0] == "/py"
    script = d.serve_script(argv, header=["tuned"])
    assert script.startswith("#!/usr/bin/env bash\n# tuned\n") and "\nexec " in script
    image = d.default_image(f"{adapter.kind} 1.2.3", cpu=False)
    assert image.endswith("1.2.3")
    docker = d.docker_run(
        params, model_dir="/models/m", served_name="m", gpu_uuids=["GPU-1"], image=image
    )
    assert "127.0.0.1:8000:" in docker and image in docker
    docs = list(
        yaml.safe_load_all(
            d.k8s_deployment(
                params, name="m", served_name="m", image=image, gpus=1, model_subpath="m"
            )
        )
    )
    assert [doc["kind"] for doc in docs] == ["Deployment", "Service"]
    assert docs[1]["spec"]["type"] == "ClusterIP"
    with pytest.raises(ValueError):
        d.serve_command({next(iter(adapter.reserved_params)): "x"}, model="m", served_name="m")


# --------------------------------------------------------------------------- isolation


def _engine_modules() -> dict[str, str]:
    """Each engine package's module prefix (``autotuner.engines.<kind package>``)."""
    return {a.kind: type(a).__module__.rsplit(".", 1)[0] for a in ADAPTERS}


def test_nothing_outside_an_engine_package_imports_it() -> None:
    """The rest of the tuner reaches an engine only through the registry (the stand-in
    server used by tests may borrow its metric names)."""
    packages = set(_engine_modules().values())
    offenders = []
    for path in sorted((ROOT / "autotuner").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if any(module.startswith(p) for p in packages) or module.startswith("autotuner.testing"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [f"{module}: {n}" for n in names if any(n.startswith(p) for p in packages)]
    assert offenders == []
