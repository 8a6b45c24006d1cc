"""Search space: version comparator, YAML resolution, overrides, Optuna suggestions."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from pydantic import ValidationError

from autotuner.space import (
    ParamOverride,
    SearchSpace,
    SearchSpec,
    SpaceError,
    load_space,
    parse_version,
    space_file,
    spaces_dir,
    version_in,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

QUICKSTART_PARAMS = {"enforce_eager": True, "gpu_memory_utilization": 0.3, "max_model_len": 1024}


def cpu_space(
    version: str = "0.32.0",
    *,
    overrides: Mapping[str, Any] | None = None,
    engine_params: Mapping[str, Any] | None = None,
    allow_lossy: bool = False,
    cpu_flags: set[str] | None = None,
) -> SearchSpace:
    return load_space(
        "vllm",
        version,
        device="cpu",
        gpu_count=0,
        compute_capability=None,
        allow_lossy=allow_lossy,
        overrides={k: ParamOverride.model_validate(v) for k, v in (overrides or {}).items()},
        engine_params=engine_params,
        cpu_flags=cpu_flags,
    )


def gpu_space(
    version: str = "0.32.0",
    *,
    gpus: int = 1,
    cc: tuple[int, int] | None = (9, 0),
    overrides: Mapping[str, Any] | None = None,
    engine_params: Mapping[str, Any] | None = None,
    allow_lossy: bool = False,
) -> SearchSpace:
    return load_space(
        "vllm",
        version,
        device="gpu",
        gpu_count=gpus,
        compute_capability=cc,
        allow_lossy=allow_lossy,
        overrides={k: ParamOverride.model_validate(v) for k, v in (overrides or {}).items()},
        engine_params=engine_params,
    )


def dropped(space: SearchSpace) -> dict[str, str]:
    return {d.param: d.reason for d in space.dropped if not d.is_choice}


def dropped_choices(space: SearchSpace, name: str) -> dict[Any, str]:
    return {d.value: d.reason for d in space.dropped if d.is_choice and d.param == name}


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.32.0", (0, 32)),
        ("vllm 0.32.0 (cpu)", (0, 32)),
        ("0.12.0rc1", (0, 12)),
        ("0.10.1.1+cu128", (0, 10, 1, 1)),
        ("1.0", (1,)),
    ],
)
def test_parse_version(text: str, expected: tuple[int, ...]) -> None:
    assert parse_version(text) == expected


def test_parse_version_rejects_text_without_a_version() -> None:
    with pytest.raises(ValueError, match="no version"):
        parse_version("latest")


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("0.10", ">=0.10,<0.27", True),
        ("0.9.9", ">=0.10,<0.27", False),
        ("0.26.9", ">=0.10,<0.27", True),
        ("0.27", ">=0.10,<0.27", False),
        ("0.25.2", ">=0.1,<0.26", True),
        ("0.26.0", ">=0.1,<0.26", False),
        ("0.11.2", "==0.11.*", True),
        ("0.12.0", "==0.11.*", False),
        ("0.12.0", "!=0.11.*", True),
        ("0.11.5", "~=0.11.2", True),
        ("0.12.0", "~=0.11.2", False),
        ("0.11.1", "~=0.11.2", False),
        ("0.12", "==0.12.0", True),
        ("0.12.1", ">0.12", True),
        ("0.12.0", ">0.12", False),
        ("0.12.0", "<=0.12", True),
        ("3.1", "", True),
    ],
)
def test_version_in(version: str, spec: str, ok: bool) -> None:
    assert version_in(version, spec) is ok


@pytest.mark.parametrize("spec", [">=x", "=>0.1", ">=0.1.*", "~=1"])
def test_version_in_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError):
        version_in("0.1", spec)


# --------------------------------------------------------------------------- the file


def test_the_vllm_file_is_found_and_covers_v1_releases() -> None:
    assert space_file("vllm", "0.32.0") == spaces_dir() / "vllm.yaml"
    with pytest.raises(SpaceError, match=r"no search space covers vllm 0\.9\.2"):
        space_file("vllm", "0.9.2")
    with pytest.raises(SpaceError, match="no search space for engine 'trtllm'"):
        space_file("trtllm", "1.0")


def test_quickstart_cpu_space() -> None:
    space = cpu_space(engine_params=QUICKSTART_PARAMS, cpu_flags={"avx512f"})
    assert space.names == [
        "max_num_seqs",
        "enable_chunked_prefill",
        "max_num_batched_tokens",
        "long_prefill_token_threshold",
        "stream_interval",
        "block_size",
        "enable_prefix_caching",
        "performance_mode",
    ]
    assert space.fixed == QUICKSTART_PARAMS
    assert space.param("max_num_seqs").low == 4  # the CPU range
    assert space.param("block_size").choices == (32, 64, 128, 256)
    assert space.param("performance_mode").choices == ("balanced", "throughput")
    gone = dropped(space)
    assert gone["optimization_level"] == "inactive: enforce_eager is true"
    assert gone["async_scheduling"] == "gpu only"
    assert gone["tensor_parallel_size"] == "gpu only"
    assert "0.32.0" in gone["disable_log_requests"]
    assert "lossy" in dropped_choices(space, "kv_cache_dtype")["fp8"]


def test_cpu_pins_gpu_memory_utilization_unless_the_sla_sets_it() -> None:
    space = cpu_space()
    assert space.fixed == {"gpu_memory_utilization": 0.5}
    assert space.fixed_by["gpu_memory_utilization"] == "pinned on cpu"
    assert space.baseline() == {"gpu_memory_utilization": 0.5}
    widened = cpu_space(overrides={"gpu_memory_utilization": {"low": 0.2, "high": 0.4}})
    p = widened.param("gpu_memory_utilization")
    assert (p.low, p.high) == (0.2, 0.4)
    assert "gpu_memory_utilization" not in widened.fixed


def test_h200_space() -> None:
    space = gpu_space(engine_params={"load_format": "dummy"})
    names = space.names
    assert "tensor_parallel_size" not in names  # one GPU: only the default is left
    assert "enforce_eager" not in names
    assert dropped(space)["enforce_eager"] == "superseded by optimization_level in this version"
    for name in ("gpu_memory_utilization", "async_scheduling", "optimization_level"):
        assert name in names
    assert space.param("max_num_seqs").high == 2048
    assert space.param("optimization_level").choices == (0, 1, 2)
    cond = space.param("max_cudagraph_capture_size").when
    assert [(c.param, c.values, c.negate) for c in cond] == [("optimization_level", (0,), True)]
    assert space.baseline() == {"load_format": "dummy"}


def test_tensor_parallel_choices_follow_the_gpu_count() -> None:
    assert gpu_space(gpus=4).param("tensor_parallel_size").choices == (1, 2, 4)
    assert gpu_space(gpus=8).param("tensor_parallel_size").choices == (1, 2, 4, 8)
    assert "more than the target's 2 GPU(s)" in dropped_choices(
        gpu_space(gpus=2), "tensor_parallel_size"
    ).get(4, "")


def test_lossy_choices_need_allow_lossy() -> None:
    strict = gpu_space()
    assert "kv_cache_dtype" not in strict.names
    assert "quantization" not in strict.names
    lossy = gpu_space(allow_lossy=True)
    assert lossy.param("kv_cache_dtype").choices == ("auto", "fp8")
    assert lossy.param("quantization").choices == (None, "fp8")


@pytest.mark.parametrize(("cc", "kept"), [((8, 9), True), ((8, 6), False), ((9, 0), True)])
def test_fp8_needs_compute_capability_8_9(cc: tuple[int, int], kept: bool) -> None:
    space = gpu_space(cc=cc, allow_lossy=True)
    assert ("kv_cache_dtype" in space.names) is kept
    assert ("quantization" in space.names) is kept
    if not kept:
        reason = dropped_choices(space, "kv_cache_dtype")["fp8"]
        assert reason == f"needs compute capability >= 8.9 (have {cc[0]}.{cc[1]})"


def test_unknown_compute_capability_drops_nothing() -> None:
    assert "kv_cache_dtype" in gpu_space(cc=None, allow_lossy=True).names


@pytest.mark.parametrize(
    ("flags", "kept"),
    [({"avx512f"}, True), ({"amx_tile", "avx2"}, True), ({"avx2"}, False), (None, True)],
)
def test_fp8_kv_on_cpu_needs_avx512_or_amx(flags: set[str] | None, kept: bool) -> None:
    space = cpu_space(allow_lossy=True, cpu_flags=flags)
    assert ("kv_cache_dtype" in space.names) is kept


def test_versions_add_and_remove_options() -> None:
    assert "performance_mode" not in gpu_space("0.16.1").names
    assert "performance_mode" in gpu_space("0.17.0").names
    old = gpu_space("0.11.2")
    assert "optimization_level" not in old.names
    assert "enforce_eager" in old.names  # nothing supersedes it yet
    assert "stream_interval" not in old.names
    assert dropped(old)["stream_interval"] == "needs vllm >=0.12 (have 0.11.2)"


def test_disable_log_requests_exists_until_0_26() -> None:
    pinned = gpu_space("0.25.0", overrides={"disable_log_requests": {"fixed": True}})
    assert pinned.fixed["disable_log_requests"] is True
    with pytest.raises(SpaceError, match=r"0\.26\.0 has no such option"):
        gpu_space("0.26.0", overrides={"disable_log_requests": {"fixed": True}})
    # Excluding a missing option is harmless: SLAs may be shared across releases.
    gpu_space("0.26.0", overrides={"disable_log_requests": False})


def test_version_outside_the_file_is_an_error() -> None:
    with pytest.raises(SpaceError, match=r"no search space covers vllm 0\.8\.5"):
        gpu_space("0.8.5")


# --------------------------------------------------------------------------- overrides


def test_override_forms() -> None:
    assert ParamOverride.model_validate(False).exclude
    assert ParamOverride.model_validate(True) == ParamOverride()
    assert ParamOverride.model_validate({"fixed": None}).exclude
    pinned = ParamOverride.model_validate({"fixed": False})
    assert pinned.is_fixed and pinned.fixed is False and not pinned.exclude
    assert ParamOverride.model_validate({"values": [1, 2]}).searches
    assert ParamOverride.model_validate({"log": True}).searches
    spec = SearchSpec.model_validate({"allow_lossy": True, "params": {"block_size": False}})
    assert spec.params["block_size"].exclude


@pytest.mark.parametrize(
    "raw",
    [
        {"fixed": 1, "values": [1]},
        {"values": [1], "low": 1},
        {"values": []},
        {"low": 5, "high": 1},
        {"exclude": True, "low": 1},
        {"maximum": 3},
        {"low": "8"},  # no silent coercion, as everywhere in the SLA
    ],
)
def test_bad_overrides(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ParamOverride.model_validate(raw)


def test_overrides_narrow_widen_fix_and_exclude() -> None:
    space = gpu_space(
        overrides={
            "max_num_seqs": {"low": 32, "high": 4096},
            "block_size": {"values": [16, 32]},
            "enable_prefix_caching": {"fixed": False},
            "stream_interval": False,
            "max_num_batched_tokens": {"log": False},
        }
    )
    p = space.param("max_num_seqs")
    assert (p.low, p.high, p.log) == (32, 4096, True)
    assert space.param("block_size").choices == (16, 32)
    assert space.fixed["enable_prefix_caching"] is False
    assert "stream_interval" not in space.names
    assert dropped(space)["stream_interval"] == "excluded by the SLA (the engine decides)"
    assert space.param("max_num_batched_tokens").log is False


def test_values_turn_an_int_range_into_choices() -> None:
    p = gpu_space(overrides={"max_num_seqs": {"values": [64, 256]}}).param("max_num_seqs")
    assert p.choices == (64, 256)


def test_override_switches_on_an_off_by_default_option() -> None:
    assert "scheduling_policy" not in gpu_space().names
    space = gpu_space(overrides={"scheduling_policy": {"values": ["fcfs", "priority"]}})
    assert space.param("scheduling_policy").choices == ("fcfs", "priority")


def test_single_value_left_becomes_a_pin_unless_it_is_the_default() -> None:
    space = gpu_space(
        overrides={"block_size": {"values": [32]}, "stream_interval": {"values": [1]}}
    )
    assert space.fixed["block_size"] == 32
    assert "stream_interval" not in space.fixed
    assert dropped(space)["stream_interval"] == "only the default (1) remains"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"max_num_seq": {"high": 64}},
            "not a parameter of the space (did you mean 'max_num_seqs'?)",
        ),
        ({"enable_prefix_caching": {"fixed": 1}}, "1 is not true or false"),
        ({"max_num_seqs": {"values": [8, "x"]}}, "x is not an int"),
        ({"max_num_seqs": {"low": 1.5}}, "1.5 is not an int"),
        ({"block_size": {"low": 16}}, "narrow it with 'values'"),
        ({"kv_cache_dtype": {"fixed": "fp8"}}, "changes outputs; set search.allow_lossy: true"),
        ({"kv_cache_dtype": {"values": ["auto", "fp8"]}}, "changes outputs"),
        ({"async_scheduling": {"values": [True, False]}}, "not searched on cpu"),
        ({"max_num_seqs": {"low": 0, "high": 8}}, "a log range needs low > 0"),
    ],
)
def test_override_problems(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(SpaceError) as err:
        cpu_space(overrides=overrides)
    assert any(part in str(err.value) for part in message.split("|")), str(err.value)


def test_fixed_value_the_hardware_cannot_run_is_an_error() -> None:
    with pytest.raises(SpaceError, match=r"fp8 needs compute capability >= 8.9 \(have 8.0\)"):
        gpu_space(cc=(8, 0), allow_lossy=True, overrides={"kv_cache_dtype": {"fixed": "fp8"}})


def test_engine_params_and_search_must_not_overlap() -> None:
    with pytest.raises(SpaceError, match=r"also set in engine\.params"):
        cpu_space(engine_params={"max_num_seqs": 8}, overrides={"max_num_seqs": {"high": 64}})


def test_all_problems_are_reported_together() -> None:
    with pytest.raises(SpaceError) as err:
        cpu_space(overrides={"nope": False, "max_num_seqs": {"values": ["a"]}})
    assert len(err.value.problems) == 2


# --------------------------------------------------------------------------- Optuna


def test_suggest_respects_conditions_and_distributions() -> None:
    space = gpu_space(gpus=4, allow_lossy=True)
    dists = space.distributions()
    assert list(dists) == space.names
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen_off = seen_on = False
    for _ in range(60):
        trial = study.ask()
        values = space.suggest(trial)
        for name, value in values.items():
            assert dists[name]._contains(dists[name].to_internal_repr(value))
        if values["enable_chunked_prefill"] is False:
            seen_off = True
            assert "max_num_batched_tokens" not in values
            assert "long_prefill_token_threshold" not in values
        else:
            seen_on = True
            assert "max_num_batched_tokens" in values
        assert ("max_cudagraph_capture_size" in values) == (values["optimization_level"] != 0)
        gmu = values["gpu_memory_utilization"]
        assert isinstance(gmu, float) and gmu == round(gmu, 2)
        study.tell(trial, 0.0)
    assert seen_off and seen_on


def test_suggest_with_a_fixed_trial_asks_only_active_params() -> None:
    space = cpu_space(engine_params=QUICKSTART_PARAMS)
    chosen = {
        "max_num_seqs": 16,
        "enable_chunked_prefill": False,
        "stream_interval": 2,
        "block_size": 64,
        "enable_prefix_caching": True,
        "performance_mode": "balanced",
    }
    values = space.suggest(optuna.trial.FixedTrial(chosen))
    assert values == chosen
    assert space.candidate(values) == {**QUICKSTART_PARAMS, **chosen}


def test_hash_is_stable_and_tracks_the_effective_space() -> None:
    a = gpu_space("0.32.0")
    assert a.hash() == gpu_space("0.32.0").hash()
    assert a.hash() == gpu_space("0.32.1").hash()  # same space on a patch release
    assert a.hash() != gpu_space("0.32.0", overrides={"max_num_seqs": {"high": 512}}).hash()
    assert a.hash() != gpu_space("0.32.0", engine_params={"max_model_len": 4096}).hash()
    assert len(a.hash()) == 64


def test_describe_lists_tuned_fixed_and_dropped() -> None:
    lines = gpu_space(
        gpus=2, cc=(8, 0), allow_lossy=True, engine_params={"dtype": "half"}
    ).describe()
    text = "\n".join(lines)
    assert lines[0].startswith("vllm 0.32.0 on gpu: ")
    assert "  tune  tensor_parallel_size: int {1, 2}" in text
    assert "  fixed dtype = half (engine.params)" in text
    assert "  drop  tensor_parallel_size=4, 8: more than the target's 2 GPU(s)" in text
    assert "  drop  kv_cache_dtype=fp8: needs compute capability >= 8.9 (have 8.0)" in text
    assert "  drop  async_scheduling" not in text


# --------------------------------------------------------------------------- bad files


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "vllm.yaml"
    path.write_text(body)
    return path


def _load(path: Path) -> SearchSpace:
    return load_space(
        "vllm",
        "0.32.0",
        device="gpu",
        gpu_count=1,
        compute_capability=(9, 0),
        allow_lossy=False,
        overrides={},
        path=path,
    )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("- {name: a, type: int, low: 0, high: 8, log: true}", "a log range needs low > 0"),
        ("- {name: a, type: int, choices: [1, x]}", "choice x is not an int"),
        ("- {name: a, type: categorical}", "a categorical needs 'choices'"),
        ("- {name: a, type: float, low: 2.0, high: 1.0}", "low (2.0) > high (1.0)"),
        (
            "- {name: a, type: bool, when: {b: [true]}}\n  - {name: b, type: bool}",
            "'b' is declared after it",
        ),
        ("- {name: a, type: bool, versions: '>=x'}", "bad version clause"),
        ("- {name: a, type: bool, colour: red}", "Extra inputs are not permitted"),
    ],
)
def test_bad_space_files(tmp_path: Path, params: str, message: str) -> None:
    path = _write(tmp_path, f"engine: vllm\nformat: 1\nparams:\n  {params}\n")
    with pytest.raises(SpaceError) as err:
        _load(path)
    assert message in str(err.value)


def test_a_minimal_file_resolves(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "engine: vllm\nformat: 1\nparams:\n"
        "  - {name: a, type: int, low: 1, high: 9, step: 2}\n"
        "  - {name: b, type: float, low: 0.5, high: 0.9, step: 0.1, default: 0.9}\n",
    )
    space = _load(path)
    assert [(p.name, p.low, p.high, p.step) for p in space.params] == [
        ("a", 1, 9, 2),
        ("b", 0.5, 0.9, 0.1),
    ]
    values = space.suggest(optuna.trial.FixedTrial({"a": 3, "b": 0.7000000000000001}))
    assert values == {"a": 3, "b": 0.7}


def test_overlapping_files_are_an_error(tmp_path: Path) -> None:
    (tmp_path / "vllm.yaml").write_text("engine: vllm\nformat: 1\nversions: '>=0.10'\nparams: []\n")
    (tmp_path / "vllm-new.yaml").write_text(
        "engine: vllm\nformat: 1\nversions: '>=0.30'\nparams: []\n"
    )
    with pytest.raises(SpaceError, match=r"several search spaces cover vllm 0\.32"):
        space_file("vllm", "0.32", directory=tmp_path)
    assert space_file("vllm", "0.20", directory=tmp_path).name == "vllm.yaml"
