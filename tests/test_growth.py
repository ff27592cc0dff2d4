"""A claim's cost does not grow with the study: finished trials are indexed once, and
the controller's saved state keeps its told trials as runs."""

from __future__ import annotations

from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from autosearch.study.claims import ArchIndex
from autosearch.study.records import ARCH_ID, RESUME, SUPERSEDED
from autosearch.study.replay import _numbers, _runs


def _trial(number: int, arch: str, state=TrialState.COMPLETE, **attrs):
    trial = create_trial(
        state=state,
        values=[0.5, 1.0] if state == TrialState.COMPLETE else None,
        params={"x": 0},
        distributions={"x": CategoricalDistribution([0])},
        user_attrs={ARCH_ID: arch, **attrs},
    )
    trial.number = number
    return trial


def test_finished_trials_are_indexed_once_and_running_ones_read_again():
    index = ArchIndex()
    trials = [
        _trial(0, "a"),
        _trial(1, "b", TrialState.FAIL, **{SUPERSEDED: "its worker died", RESUME: True}),
        _trial(2, "c", TrialState.RUNNING),
        _trial(3, "a"),
    ]
    view = index.read(trials)
    assert view.first("a").number == 0 and view.last("a").number == 3
    assert view.first("b") is None  # superseded: holds nothing
    assert view.first("c").number == 2
    assert index.unfinished(trials) == trials[2:]  # 0 and 1 are finished: never read again
    assert [t.number for t in index.resumable] == [1]
    # Trial 2 is superseded while running; trials 0 and 1 are not looked at again.
    trials[2] = _trial(2, "c", TrialState.FAIL, **{SUPERSEDED: "duplicate: trial 9"})
    trials[0] = None  # type: ignore[call-overload]  # would fail if it were read
    view = index.read([trials[0], trials[1], trials[2], trials[3], _trial(4, "d")])
    assert view.first("c") is None and view.first("d").number == 4
    assert view.first("a").number == 0


def test_an_index_given_another_studys_trials_starts_again():
    index = ArchIndex()
    index.read([_trial(0, "a"), _trial(1, "b")])
    view = index.read([_trial(0, "z")])
    assert view.first("a") is None and view.first("z").number == 0


def test_told_trials_are_saved_as_runs_and_the_earlier_list_still_reads():
    told = {0, 1, 2, 3, 7, 8, 10}
    assert _runs(told) == [[0, 3], [7, 8], [10, 10]]
    assert _numbers(_runs(told)) == told
    assert _numbers([0, 1, 2, 5]) == {0, 1, 2, 5}  # as saved before
    assert _runs(set(range(2000))) == [[0, 1999]]
