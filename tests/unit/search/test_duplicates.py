"""Near-duplicates (search/duplicates.py): a candidate within the measurement's resolution of
a measured config in every knob it changes is not launched; the config that stands for it is
named."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState, create_trial

from autotuner.records.trial import TrialRecord
from autotuner.search.duplicates import DUPLICATE_STEPS, near_duplicate
from autotuner.search.misses import MissBook
from autotuner.space import ParamOverride, SearchSpace, load_space

optuna.logging.set_verbosity(optuna.logging.WARNING)

H200 = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.92}


def _space() -> SearchSpace:
    return load_space(
        "vllm",
        "0.26.0",
        device="gpu",
        gpu_count=1,
        compute_capability=(9, 0),
        allow_lossy=False,
        overrides={"performance_mode": ParamOverride(exclude=True)},
    )


def _study(*configs: dict[str, object], state: TrialState = TrialState.COMPLETE) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for i, params in enumerate(configs):
        attrs = TrialRecord(
            role="baseline" if i == 0 else "candidate", config_key=str(params), params_full=params
        ).attrs()
        value = 1.0 if state == TrialState.COMPLETE else None
        study.add_trial(create_trial(state=state, value=value, user_attrs=attrs))
    return study


def test_slot_counts_one_apart_are_one_config() -> None:
    book = MissBook(_space(), engine_defaults=lambda p: H200)
    study = _study({}, {"max_num_seqs": 33}, {"max_num_seqs": 43})
    near = near_duplicate(study, book, {"max_num_seqs": 34})
    assert near is not None and near.trial == 1
    assert "max_num_seqs 34 (trial 1: 33)" in near.describe()
    near = near_duplicate(study, book, {"max_num_seqs": 44})
    assert near is not None and near.trial == 2


def test_a_change_the_measurement_resolves_is_launched() -> None:
    book = MissBook(_space(), engine_defaults=lambda p: H200)
    study = _study({}, {"max_num_seqs": 33})
    assert 2**DUPLICATE_STEPS < 38 / 33
    assert near_duplicate(study, book, {"max_num_seqs": 38}) is None
    # A knob within the resolution, another changed by a whole choice: a new config.
    assert near_duplicate(study, book, {"max_num_seqs": 34, "block_size": 32}) is None


def test_the_engine_default_set_explicitly_is_the_defaults() -> None:
    book = MissBook(_space(), engine_defaults=lambda p: H200)
    study = _study({})
    near = near_duplicate(study, book, {"max_num_seqs": 1024})
    assert near is not None and near.trial == 0
    assert near.describe() == "the same config as trial 0 in effect"


def test_only_measured_launches_stand_for_a_candidate() -> None:
    book = MissBook(_space(), engine_defaults=lambda p: H200)
    failed = _study({"max_num_seqs": 33}, state=TrialState.FAIL)
    assert near_duplicate(failed, book, {"max_num_seqs": 34}) is None
