"""A tune does not print Optuna's ExperimentalWarning for the TPE options it chose on purpose,
and silencing it there leaves every other warning, and the process's filters, alone (issue 29)."""

from __future__ import annotations

import warnings

import optuna
import pytest

from autotuner.search.study import make_sampler


def test_the_tpe_sampler_is_made_without_an_experimental_warning() -> None:
    before = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_sampler("auto", 10, 1, 0)
        make_sampler("tpe", 10, 2, 0)
    assert [
        w for w in caught if issubclass(w.category, optuna.exceptions.ExperimentalWarning)
    ] == []
    assert warnings.filters == before


def test_the_experimental_warning_still_shows_elsewhere() -> None:
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        make_sampler("auto", 10, 1, 0)
        optuna.samplers.TPESampler(group=True, multivariate=True)
