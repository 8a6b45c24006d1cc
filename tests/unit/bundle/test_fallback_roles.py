"""The fallback plan's picks by role (no fp8, lossless, less memory, fewer GPUs, next best,
the baseline last) and the notes that name, per hardware-specific setting, what to run
without it with its measured capacity."""

from __future__ import annotations

from typing import Any

from autotuner.bundle.fallback_roles import Pick, hardware_notes, pick
from autotuner.bundle.report import Fallback
from autotuner.engines import registry
from autotuner.search.capability import SettingTraits, traits_of
from autotuner.search.pareto import Candidate
from autotuner.space import spaces_dir

TRAITS = traits_of(spaces_dir() / "vllm.yaml")
ROLES = registry.get("vllm").roles


def cand(trial: int, params: dict[str, Any], memory: float, **kw: Any) -> Candidate:
    metrics: dict[str, float | None] = {"peak_memory_gib": memory}
    return Candidate(trial, (0.0,), True, metrics=metrics, params=params, **kw)


BASE = cand(0, {}, 70.0, baseline=True)
FP8 = cand(1, {"kv_cache_dtype": "fp8", "tensor_parallel_size": 2}, 60.0)
TP2 = cand(2, {"tensor_parallel_size": 2}, 80.0)  # best without fp8
SMALL = cand(3, {"tensor_parallel_size": 2, "max_num_seqs": 64}, 40.0)  # least memory
TP1 = cand(4, {"max_num_seqs": 64}, 75.0)  # the only one on one GPU (with the baseline)


def roles(picks: list[Pick]) -> list[tuple[int, tuple[str, ...]]]:
    return [(p.cand.trial, p.roles) for p in picks]


def test_an_fp8_config_on_two_gpus_gets_a_fallback_for_each_way_it_can_fail() -> None:
    feasible = [FP8, TP2, SMALL, TP1, BASE]  # ranked best first
    picks = pick(FP8, [FP8], feasible, BASE, TRAITS, "gpu", engine_roles=ROLES)
    assert roles(picks) == [
        (2, ("no fp8",)),  # also the next best: listed once
        (3, ("less memory",)),
        (4, ("fewer GPUs",)),
        (0, ("engine defaults",)),
    ]
    assert picks[0].title == "trial 2 (no fp8)"
    assert picks[-1].title == "baseline (engine defaults)"


def test_a_single_objective_study_lists_its_other_feasible_configs() -> None:
    # One objective: the Pareto front is the promoted config alone. Before, the plan said
    # "No fallback was measured"; now the next best and the role picks are listed.
    chosen = cand(5, {"max_num_seqs": 128}, 50.0)
    feasible = [chosen, cand(6, {"max_num_seqs": 256}, 55.0), cand(7, {}, 45.0)]
    picks = pick(chosen, [chosen], feasible, None, TRAITS, "gpu", engine_roles=ROLES)
    assert roles(picks) == [(7, ("less memory",)), (6, ("next best",))]


def test_lossy_configs_other_than_the_promoted_one_are_no_fallbacks() -> None:
    chosen = cand(8, {"max_num_seqs": 64}, 50.0)
    other_fp8 = cand(9, {"kv_cache_dtype": "fp8"}, 30.0)  # less memory, but never gated
    feasible = [chosen, other_fp8, BASE]
    picks = pick(chosen, [chosen, other_fp8], feasible, BASE, TRAITS, "gpu", engine_roles=ROLES)
    assert roles(picks) == [(0, ("engine defaults",))]


def test_the_baseline_stays_last_with_every_role_it_fills() -> None:
    picks = pick(FP8, [FP8], [FP8, BASE], BASE, TRAITS, "gpu", engine_roles=ROLES)
    assert roles(picks) == [(0, ("no fp8", "fewer GPUs", "engine defaults"))]
    assert picks[0].title == "baseline (engine defaults): no fp8, fewer GPUs"


def fallback(rank: int, c: Candidate, capacity: float | None) -> Fallback:
    return Fallback(
        rank=rank,
        label=f"trial {c.trial} (no fp8)",
        params=dict(c.params),
        argv=[],
        metrics={"capacity": capacity},
        cost={"capacity": None if capacity is None else capacity / 20.0 - 1},
        triggers=[],
        basis={"capacity": "single run"},
    )


def test_hardware_notes_name_the_fallback_without_fp8_and_its_capacity() -> None:
    notes = hardware_notes(FP8.params, [fallback(1, TP2, 15.0)], TRAITS, "gpu", "req/s")
    assert notes == [
        "`kv_cache_dtype=fp8` needs compute capability >= 8.9 and changes outputs: on a "
        "device without it (or to keep outputs) run fallback 1, trial 2 (no fp8) "
        "(`kv_cache_dtype=auto`): capacity 15 req/s (single run), -25.0 % (worse) against "
        "the promoted config"
    ]


def test_hardware_notes_say_when_no_fallback_without_it_was_measured() -> None:
    notes = hardware_notes({"quantization": "fp8"}, [], TRAITS, "gpu", "req/s")
    assert notes == [
        "`quantization=fp8` needs compute capability >= 8.9 and changes outputs: no config "
        "without it was "
        "measured in this study; without it, set `quantization` to the engine default "
        "(not measured)"
    ]
    # On a CPU target the CPU's requirement is named instead; settings without one, none.
    cpu = hardware_notes({"kv_cache_dtype": "fp8"}, [], TRAITS, "cpu", "req/s")
    assert cpu[0].startswith("`kv_cache_dtype=fp8` needs a CPU with avx512f or amx_tile and")
    assert hardware_notes({"max_num_seqs": 8}, [], TRAITS, "gpu", "req/s") == []


def test_a_lossy_setting_without_a_hardware_need_is_named_too() -> None:
    traits = SettingTraits({"speculative": ("ngram",)}, {}, {"speculative": None})
    chosen = {"speculative": "ngram"}
    notes = hardware_notes(chosen, [fallback(1, TP1, 18.0)], traits, "gpu", "req/s")
    assert notes[0].startswith(
        "`speculative=ngram` changes outputs: on a device without it (or to keep outputs) run "
        "fallback 1, trial 4 (no fp8) (`speculative` the engine default): capacity 18 req/s"
    )
