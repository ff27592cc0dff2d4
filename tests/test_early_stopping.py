"""Multi-fidelity early stopping: the rule on hand-made curves, and in a real study."""

from __future__ import annotations

import optuna
import pytest

import autosearch
from autosearch.training.early_stopping import Hyperband, SuccessiveHalving, from_dict


def test_rungs_and_the_top_fraction_rule():
    asha = SuccessiveHalving(min_epochs=1, reduction=3)
    assert asha.rungs(27) == [1, 3, 9]
    peers = {i: {3: v} for i, v in enumerate([0.9, 0.8, 0.7, 0.6, 0.5])}

    def decide(value: float, epoch: int = 3) -> bool:
        return asha.should_stop(trial=99, epoch=epoch, epochs=27, value=value, others=peers)

    assert decide(0.65)  # 3 of 6 better; only the best 6 // 3 = 2 go on
    assert not decide(0.85)  # second best of six
    assert not decide(0.1, epoch=4)  # not a rung
    assert not asha.should_stop(
        trial=9, epoch=3, epochs=27, value=0.0, others={0: {3: 0.9}}
    )  # too few peers to judge
    with pytest.raises(ValueError):
        SuccessiveHalving(reduction=1)


def test_hyperband_deals_trials_to_brackets():
    band = Hyperband(min_epochs=1, reduction=3)
    assert band.brackets(27) == 3
    assert [band.bracket(t, 27) for t in range(6)] == [0, 1, 2, 0, 1, 2]
    assert band.rungs(27, bracket=1) == [3, 9] and band.rungs(27, bracket=2) == [9]
    # peers in other brackets do not count
    others = {1: {3: 0.9}, 2: {3: 0.9}, 4: {3: 0.9}}
    assert not band.should_stop(trial=0, epoch=3, epochs=27, value=0.1, others=others)
    assert from_dict(band.to_dict()) == band and from_dict(None) is None


def test_a_multi_objective_study_stops_what_it_should(make_study, tiny_space):
    from controllers import RandomSearch

    stopper = SuccessiveHalving(min_epochs=1, reduction=2)
    study = make_study(
        "es",
        controller=RandomSearch(tiny_space, seed=4),
        train=autosearch.TrainConfig(epochs=4, batch_size=128, lr=0.1),
        objectives=("accuracy", "flops"),
        early_stopping=stopper,
    )
    records = study.optimize(8)
    stopped = [r for r in records if r.state == "stopped"]
    assert stopped and any(r.state == "complete" for r in records)
    trials = {t.number: t for t in study.optuna_study.trials}
    for record in records:
        curve = trials[record.trial].intermediate_values
        earlier = {n: t.intermediate_values for n, t in trials.items() if n < record.trial}
        if record.state == "complete":
            assert sorted(curve) == [1, 2, 3, 4]
            assert not any(
                stopper.should_stop(
                    trial=record.trial, epoch=e, epochs=4, value=curve[e], others=earlier
                )
                for e in stopper.rungs(4)
            )  # it passed every rung it reached
            continue
        epoch = int(record.metrics["stopped_at_epoch"])
        assert epoch in stopper.rungs(4) and sorted(curve) == list(range(1, epoch + 1))
        assert trials[record.trial].state == optuna.trial.TrialState.PRUNED
        assert stopper.should_stop(
            trial=record.trial, epoch=epoch, epochs=4, value=curve[epoch], others=earlier
        )
        assert record.metrics["accuracy"] == curve[epoch] and record.metrics["flops"] > 0
    assert study.best().state == "complete"  # stopped trials never win
    assert all(r.state == "complete" for r in study.pareto())
