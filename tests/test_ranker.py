"""The ranker: what it learns from trained candidates, where it asks for the next
training, and that refitting from its stored rows continues it exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from autosearch.errors import ConfigError
from autosearch.evaluation.ranker import Ranker, RankerConfig, prior


def test_before_anything_is_trained_it_ranks_by_the_estimates_log_ranks():
    features = np.array([[1.0, 10.0, 0.3], [3.0, 30.0, 0.9], [2.0, 20.0, 0.1]])
    ranker = Ranker(estimates=2)  # the third column is an encoding, not an estimate
    mean, spread = ranker.predict(features)
    # ranks 1, 3, 2 in both estimates: 2 log(rank / 3)
    assert mean == pytest.approx([2 * np.log(1 / 3), 0.0, 2 * np.log(2 / 3)])
    assert not spread.any()
    assert ranker.choose(features, 1) == [1] and ranker.choose(features, 1, taken={1}) == [2]
    assert list(prior(np.array([[np.nan], [1.0]]))) == [np.log(1 / 2), 0.0]  # NaN ranks last


def test_it_learns_a_relation_the_estimates_hold_only_together():
    """Accuracy depends on two proxies jointly (their sum); each alone ranks poorly."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(300, 2))
    accuracy = features[:, 0] + features[:, 1] + 0.05 * rng.normal(size=300)
    features[:, 1] *= -1  # the second proxy points the wrong way on its own
    ranker = Ranker(RankerConfig(seed=1)).fit(features[:60], accuracy[:60])
    held_out = stats.spearmanr(ranker.predict(features[60:])[0], accuracy[60:])[0]
    alone = max(abs(stats.spearmanr(features[60:, i], accuracy[60:])[0]) for i in range(2))
    assert held_out > 0.85 and held_out > alone + 0.1


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(
    rows=st.integers(2, 30),
    columns=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    k=st.integers(1, 5),
)
def test_refitted_from_its_rows_it_predicts_and_chooses_exactly_the_same(rows, columns, seed, k):
    """What a resumed study or a second worker does: a ranker made from the stored
    rows and config, not a pickled model."""
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(rows, columns)), rng.normal(size=rows)
    candidates = rng.normal(size=(40, columns))
    config = RankerConfig(members=3, trees=20, seed=seed)
    first = Ranker(config).fit(x, y)
    again = Ranker(config, features=first.features.copy(), targets=first.targets.copy())
    for a, b in zip(first.predict(candidates), again.predict(candidates), strict=True):
        np.testing.assert_array_equal(a, b)
    taken = {int(i) for i in rng.integers(0, 40, 3)}
    chosen = first.choose(candidates, k, taken=taken)
    assert chosen == again.choose(candidates, k, taken=taken)
    assert len(set(chosen)) == len(chosen) == k and not set(chosen) & taken
    mean, spread = first.predict(candidates)
    free = [i for i in np.argsort(-mean, kind="stable") if int(i) not in taken]
    pool = set(map(int, free[: max(k, int(np.ceil(config.top * len(free))))]))
    assert set(chosen) <= pool  # only where the estimate is high
    left = pool - set(chosen)  # and there, where the members disagree most
    assert all(spread[c] >= spread[o] for c in chosen for o in left)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"members": 0}, "members=0: expected an integer from 1 to 64"),
        ({"trees": 10**6}, "trees=1000000: expected an integer from 1 to 5000"),  # hours
        ({"seed": -1}, "seed=-1: expected an integer from 0"),
        ({"learning_rate": -1}, r"learning_rate=-1: expected a number in \(0, 1\]"),
        ({"learning_rate": float("nan")}, r"learning_rate=nan: expected a number"),
        ({"top": 0}, r"top=0: expected a number in \(0, 1\]"),
        ({"top": "0.1"}, r"top='0.1': expected a number in \(0, 1\]"),
    ],
)
def test_bad_configs_are_refused_in_one_line(changes, match):
    with pytest.raises(ConfigError, match=match):
        RankerConfig(**changes)


def test_bad_rows_are_refused():
    with pytest.raises(ConfigError, match="one row of features per accuracy"):
        Ranker().fit(np.zeros((3, 2)), np.zeros(2))
    features = np.arange(12.0).reshape(6, 2)
    for column, value in (("features", np.nan), ("features", np.inf), ("accuracies", np.nan)):
        rows, targets = features.copy(), np.linspace(0.1, 0.9, 6)
        if column == "features":
            rows[3, 0] = value
        else:
            targets[3] = value
        with pytest.raises(ConfigError, match=f"{column} hold 1 values that are not finite"):
            Ranker().fit(rows, targets)


def test_features_past_float32_fit_and_rank_as_their_scaled_copies():
    """synflow reaches 1e40 and more at NAS-Bench-201's real size: past the float32 the
    trees compute in. The ranker squashes features monotonically, so a column of such
    values ranks as the same column scaled down."""
    rng = np.random.default_rng(0)
    small = rng.uniform(1.0, 2.0, size=(30, 2))
    huge = small * np.array([1e40, 1.0])
    targets = small[:, 0] + 0.1 * rng.normal(size=30)
    a = Ranker(RankerConfig(members=3, trees=20), estimates=2).fit(small[:20], targets[:20])
    b = Ranker(RankerConfig(members=3, trees=20), estimates=2).fit(huge[:20], targets[:20])
    order_a = np.argsort(-a.predict(small)[0], kind="stable")
    order_b = np.argsort(-b.predict(huge)[0], kind="stable")
    assert np.isfinite(b.predict(huge)[0]).all()
    assert stats.kendalltau(order_a, order_b)[0] > 0.9
