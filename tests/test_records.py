"""How a trial is written and read back: one write of its results, the same keys for
base and variant records, and studies stored in the earlier layout still readable."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

import autosearch
from autosearch import Compression
from autosearch.storage._rdb import RDBStorage
from autosearch.study import records
from controllers import RandomSearch


def test_a_trials_results_are_one_write_and_alike_for_every_variant(
    tiny_space, tiny_train, tmp_path, monkeypatch
):
    study = autosearch.create_study(
        "one",
        controller=RandomSearch(tiny_space, seed=0),
        variants=("base", "prune-channels@0.5"),
        compression=Compression(finetune_epochs=1),
        train=tiny_train,
        storage=f"sqlite:///{tmp_path}/one.db",
    )
    written: list[tuple[int, list[str]]] = []  # (trial id, keys) of each write
    real = study._storage.set_trial_user_attr
    real_finish = RDBStorage.finish_trial

    def spy(trial_id, key, value):
        written.append((trial_id, [key]))
        return real(trial_id, key, value)

    def spy_finish(self, trial_id, *, user_attrs, **rest):
        written.append((trial_id, list(user_attrs)))
        return real_finish(self, trial_id, user_attrs=user_attrs, **rest)

    monkeypatch.setattr(study._storage, "set_trial_user_attr", spy)
    monkeypatch.setattr(RDBStorage, "finish_trial", spy_finish)
    (record,) = study.optimize(1)
    trial_id = study.trials.get(0)._trial_id  # not its job claims (measuring the front)
    writes = [keys for written_to, keys in written if written_to == trial_id]
    # All measured in one attribute, with the label of the point that gives the trial's
    # values, in the one transaction that ends it.
    assert writes == [["result", "values_from"]]
    attrs = study.optuna_study.trials[0].user_attrs
    assert "accuracy" not in attrs and attrs["result"]["best"] in ("base", "prune-channels@0.5")
    assert attrs["values_from"] == attrs["result"]["best"]  # what Optuna's tools show
    assert study.optuna_study.metric_names == ["accuracy", "flops"]
    base, variant = study.records()
    assert variant.variant == "prune-channels@0.5" and variant.trial == base.trial
    shared = {"accuracy", "test_accuracy", "flops", "macs", "sparse_macs", "params", "bops"}
    shared |= {"bytes", "latency", "latency_batched", "reward"}
    assert shared <= set(base.metrics) and shared <= set(variant.metrics)
    assert record == base


def test_the_earlier_layout_is_read_the_same_way():
    arch = autosearch.Architecture(space="x", genes={"g": 1})
    legacy = create_trial(
        state=TrialState.COMPLETE,
        values=[0.9, 2e6],
        params={"g": 1},
        distributions={"g": CategoricalDistribution((1, 2))},
        user_attrs={
            "arch": arch.to_json(),
            "arch_id": arch.arch_id,
            "description": "x g1",
            "accuracy": 0.9,
            "flops": 2e6,
            "reward": 0.95,
            "variants": {
                "int8": {"accuracy": 0.89, "flops": 2e6, "reward": 0.97},
                "prune-l1@0.5": {"fail_reason": "RuntimeError: no kernel"},
            },
            "best_variant": "int8",
        },
    )
    base, int8, pruned = records.decode(legacy)
    assert (base.variant, base.metrics) == ("base", {"accuracy": 0.9, "flops": 2e6, "reward": 0.95})
    assert int8.metrics["reward"] == 0.97 and int8.state == "complete"
    assert pruned.state == "failed" and pruned.reason == "RuntimeError: no kernel"
    told = records.outcome(legacy, ("accuracy", "flops"))
    assert told.reward == 0.97 and told.objectives == {"accuracy": 0.89, "flops": 2e6}


def test_an_unreadable_trial_is_named_and_left_out(make_study, caplog):
    study = make_study()
    study.optimize(2)
    trial = study.optuna_study.trials[0]
    # A stored trial edited by hand; a finished trial cannot be changed through Optuna.
    broken = create_trial(
        state=TrialState.COMPLETE,
        values=trial.values,
        params=trial.params,
        distributions=trial.distributions,
        user_attrs={**trial.user_attrs, "arch": "{not json"},
    )
    study._storage.create_new_trial(study._study_id, template_trial=broken)
    assert [r.trial for r in study.records(variants=False)] == [0, 1]
    assert "trial 2" in caplog.text


def test_a_records_repr_shows_the_network_it_is_not_every_gene():
    import numpy as np

    from search_spaces import ResNetSpace

    space = ResNetSpace(max_stages=3)
    arch = space.sample(np.random.default_rng(0))
    assert arch.genes["stages"] == 1  # stage2 and stage3 genes are inactive
    record = records.Record(
        trial=4,
        arch=arch,
        description=space.describe(arch),
        state="complete",
        metrics={"accuracy": 0.975, "flops": 5.84e6, "train_seconds": 3.2},
    )
    text = repr(record)
    assert text == (
        "Record(trial=4, variant='base', state='complete', "
        "arch='resnet bottleneck projection stem64 3x16', accuracy=0.975, flops=5.84e+06)"
    )


def test_naming_the_metrics_warns_no_user(tiny_space, tmp_path):
    import warnings

    import optuna

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study = autosearch.create_study(
            "named",
            controller=RandomSearch(tiny_space, seed=0),
            storage=f"sqlite:///{tmp_path}/n.db",
        )
    assert study.optuna_study.metric_names == ["accuracy", "flops"]
    assert not [w for w in caught if issubclass(w.category, optuna.exceptions.ExperimentalWarning)]


@given(
    arch_id=st.text(alphabet="0123456789abcdef", min_size=1, max_size=16),
    kinds=st.lists(
        st.one_of(st.none(), st.just("confirm"), st.text(alphabet="0123456789abcdef", min_size=1)),
        min_size=2,
        max_size=6,
    ),
)
def test_trials_of_different_kinds_never_hold_the_same_claim(arch_id, kinds):
    """A search trial, a confirmation and a population trial of one architecture each
    hold a claim of their own; two trials of the same kind hold the same one."""
    from autosearch.study.records import (
        ARCH_ID,
        CONFIRMS,
        POPULATION_KEY,
        claim_key,
        trial_kind,
    )

    def attrs(kind):
        if kind is None:
            return {ARCH_ID: arch_id}
        if kind == "confirm":
            return {ARCH_ID: arch_id, CONFIRMS: 3}
        return {ARCH_ID: arch_id, POPULATION_KEY: kind}

    for a in kinds:
        for b in kinds:
            same = trial_kind(attrs(a)) == trial_kind(attrs(b))
            assert (claim_key(attrs(a)) == claim_key(attrs(b))) == same
            assert same == (a == b)
    assert claim_key(attrs(None)) == arch_id and trial_kind(attrs(None)) is None
    assert trial_kind({ARCH_ID: arch_id, POPULATION_KEY: "k"}) == "population:k"
    assert claim_key({}) is None
