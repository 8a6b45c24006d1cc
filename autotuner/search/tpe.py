"""Optuna's TPE sampler for studies that hold raced-out trials.

A raced-out candidate is PRUNED with the level it missed as its intermediate value (step 0).
TPE ranks pruned trials by that value in the direction of ``study.direction``, which a
multi-objective study refuses to give: the first TPE suggestion after a raced-out trial
crashed a capacity-first H200 study with two objectives. Racing only runs when the first
objective is capacity and the level is a capacity, so TPE is shown the study with the first
objective's direction: a candidate that missed a higher level ranks higher.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import optuna
from optuna.distributions import BaseDistribution
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial


class _FirstObjective:
    """``study`` as TPE reads it: everything delegated, ``direction`` the first objective's."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    @property
    def direction(self) -> StudyDirection:
        return self._study.directions[0]


def _view(study: optuna.Study) -> optuna.Study:
    if len(study.directions) == 1:
        return study
    return cast(optuna.Study, _FirstObjective(study))  # duck-typed: TPE only reads attributes


class RacingTPESampler(optuna.samplers.TPESampler):
    """TPE that samples past raced-out trials in multi-objective studies (module docstring)."""

    def sample_relative(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        search_space: Mapping[str, BaseDistribution],
    ) -> dict[str, Any]:
        return super().sample_relative(_view(study), trial, dict(search_space))

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return super().sample_independent(_view(study), trial, param_name, param_distribution)
