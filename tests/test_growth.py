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
    assert _numbers(_runs(told), below=10**6) == told
    assert _numbers([0, 1, 2, 5], below=10**6) == {0, 1, 2, 5}  # as saved before
    assert _numbers([[0, 10**12]], below=3) == {0, 1, 2}  # never more than the study has
    assert _runs(set(range(2000))) == [[0, 1999]]


def test_the_saved_controller_state_does_not_grow_and_reopening_rebuilds_what_was_seen(
    tmp_path,
):
    import json

    import autosearch
    from autosearch.study.replay import _STATE
    from controllers import RandomSearch
    from search_spaces import NB201Space

    space = NB201Space(operations=("none", "skip_connect"))  # 64 cells
    url = f"journal:{tmp_path}/s.log"

    def saved_size(study) -> int:
        attrs = study._storage.get_study_system_attrs(study._study_id)
        return len(json.dumps(attrs[_STATE]))

    study = autosearch.create_study(
        "g", controller=RandomSearch(space, seed=0), storage=url, table=_table(tmp_path, space)
    )
    study.optimize(5)
    small = saved_size(study)
    study.optimize(40)
    assert saved_size(study) <= small + 8  # the same fields; only the numbers change
    again = autosearch.load_study("g", storage=url)
    asked = {again.controller.ask().arch_id for _ in range(19)}  # the 19 cells left
    assert not asked & {r.arch.arch_id for r in again.records()}
    assert len(asked) == 19


def _table(tmp_path, space):
    from autosearch import Table

    rows = ["arch,val_accuracy"]
    for i, arch in enumerate(_all(space)):
        rows.append(f"{space.to_string(arch)},{50 + i % 40}")
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    return Table(path=str(tmp_path / "t.csv"))


def _all(space):
    import itertools

    domains = space.domains()
    for values in itertools.product(*(d.values() for d in domains.values())):
        yield space.make(dict(zip(domains, values, strict=True)))


def test_a_new_trials_number_comes_from_optunas_cache_and_matches_the_database(tmp_path):
    import optuna

    from autosearch.storage._urls import open_storage, trial_number

    for url in (f"sqlite:///{tmp_path}/s.db", f"journal:{tmp_path}/s.log"):
        storage = open_storage(url)
        study_id = storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "n")
        for _ in range(3):
            trial_id = storage.create_new_trial(study_id)
            assert trial_number(storage, trial_id) == storage.get_trial_number_from_id(trial_id)


def test_the_told_runs_kept_as_trials_are_told_match_the_told_set():
    from autosearch.study.replay import ControllerReplay

    replay = ControllerReplay.__new__(ControllerReplay)
    replay.told, replay._told_runs = set(), []
    order = [0, 1, 2, 5, 6, 3, 9, 4, 4, 10]
    for i, number in enumerate(order):
        replay._add_told(number)
        assert replay._runs() == _runs(set(order[: i + 1])), order[: i + 1]
