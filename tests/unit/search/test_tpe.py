"""TPE on a multi-objective study that holds raced-out trials (PRUNED with their level)."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.study import StudyDirection
from optuna.trial import TrialState, create_trial

from autotuner.search.study import make_sampler

SEQS = IntDistribution(16, 2048, log=True)


def _study(directions: list[str], sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """The baseline (no params) complete, two candidates complete and one raced out at the
    baseline's capacity: PRUNED, the level stored as its intermediate value (step 0)."""
    study = optuna.create_study(
        directions=[StudyDirection[d.upper()] for d in directions], sampler=sampler
    )
    values = [18.8, 10.5][: len(directions)]
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=values))
    for seqs, cap in ((97, 18.0), (256, 19.3)):
        done = [cap, 11.0][: len(directions)]
        study.add_trial(
            create_trial(
                state=TrialState.COMPLETE,
                values=done,
                params={"max_num_seqs": seqs},
                distributions={"max_num_seqs": SEQS},
            )
        )
    study.add_trial(
        create_trial(
            state=TrialState.PRUNED,
            params={"max_num_seqs": 120},
            distributions={"max_num_seqs": SEQS},
            intermediate_values={0: 18.8},
        )
    )
    return study


@pytest.mark.parametrize("directions", [["maximize", "minimize"], ["maximize"]])
def test_tpe_samples_past_a_raced_out_trial(directions: list[str]) -> None:
    # Optuna's TPE ranks pruned trials by their last intermediate value in the direction of
    # `study.direction`, which a multi-objective study refuses: the H200 study crashed
    # ("A single direction cannot be retrieved ...") at its first TPE suggestion.
    sampler = make_sampler("auto", budget=3, n_objectives=len(directions), seed=0)
    study = _study(directions, sampler)
    for _ in range(3):
        trial = study.ask()
        seqs = trial.suggest_int("max_num_seqs", 16, 2048, log=True)
        assert 16 <= seqs <= 2048
        study.tell(trial, [seqs / 10.0, 11.0][: len(directions)])
    assert study.trials[3].intermediate_values == {0: 18.8}  # the level is kept
