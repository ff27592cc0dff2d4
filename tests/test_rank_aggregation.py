"""Several estimates of a pool combined by their ranks: AZ-NAS's sum of log ranks and
the mean rank, against values worked out by hand, and what the definitions promise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autosearch.errors import ConfigError, UnknownNameError
from autosearch.scoring.ranks import combined


def test_log_ranks_are_summed_and_mean_ranks_averaged():
    columns = {"a": [1.0, 2.0, 3.0], "b": [3.0, 2.0, 1.0]}
    assert combined(columns, "log_rank") == pytest.approx(
        [math.log(1 / 3), 2 * math.log(2 / 3), math.log(1 / 3)]
    )
    assert list(combined(columns, "mean_rank")) == [2.0, 2.0, 2.0]


def test_a_candidate_ranked_low_by_one_estimate_falls_below_one_ranked_middling_by_all():
    """Where the mean rank ties them, the log ranks prefer consistency (AZ-NAS's point)."""
    columns = {"a": [1.0, 2.0, 3.0, 4.0], "b": [4.0, 3.0, 2.0, 1.0]}  # ranks (1, 4), (2, 3)...
    mean, logs = combined(columns, "mean_rank"), combined(columns, "log_rank")
    assert mean[0] == mean[1] and logs[0] < logs[1]


def test_ties_share_their_rank_and_what_is_not_finite_ranks_last():
    found = combined({"a": [float("nan"), 5.0, 5.0, -float("inf"), 1.0]}, "mean_rank")
    assert list(found) == [1.5, 4.5, 4.5, 1.5, 3.0]


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    values=st.lists(
        st.lists(st.integers(-1000, 1000), min_size=6, max_size=6), min_size=1, max_size=4
    ),
    how=st.sampled_from(["log_rank", "mean_rank"]),
)
def test_any_increasing_transform_of_an_estimate_leaves_the_ranking_as_it_is(values, how):
    columns = {str(i): np.array(v, dtype=float) for i, v in enumerate(values)}
    moved = {k: np.exp(v / 100) * 3 + 7 for k, v in columns.items()}  # strictly increasing
    assert combined(moved, how) == pytest.approx(combined(columns, how))
    best = combined(columns, how)
    assert (best <= (0.0 if how == "log_rank" else 6.0) + 1e-12).all()


def test_bad_input_is_refused_in_one_line():
    with pytest.raises(UnknownNameError, match="unknown aggregation 'median'"):
        combined({"a": [1.0]}, "median")
    with pytest.raises(ConfigError, match="at least one"):
        combined({}, "log_rank")
    with pytest.raises(ConfigError, match="one value a candidate in every column"):
        combined({"a": [1.0, 2.0], "b": [1.0]}, "log_rank")
    assert combined({"a": []}, "log_rank").shape == (0,)
