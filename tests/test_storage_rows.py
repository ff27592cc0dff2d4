"""A trial created and ended in few statements (autosearch.storage._rdb) stores what
Optuna's own path stores, row for row, refuses what Optuna refuses, and ends a trial
all at once or not at all."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RDBStorage as OptunaRDB
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial

from autosearch import load_study
from autosearch.errors import AutosearchError
from autosearch.storage._rdb import RDBStorage
from autosearch.storage._urls import database, end_trial, open_storage

NAMES = st.text("abcdefgh_", min_size=1, max_size=6)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def params(draw: Any) -> tuple[dict[str, Any], dict[str, BaseDistribution]]:
    values: dict[str, Any] = {}
    dists: dict[str, BaseDistribution] = {}
    for name in draw(st.lists(NAMES, unique=True, max_size=5)):
        kind = draw(st.sampled_from(["categorical", "int", "float"]))
        if kind == "categorical":
            choices = draw(st.lists(st.text(max_size=4), min_size=1, max_size=4, unique=True))
            dists[name] = CategoricalDistribution(choices)
            values[name] = draw(st.sampled_from(choices))
        elif kind == "int":
            dists[name] = IntDistribution(0, 10)
            values[name] = draw(st.integers(0, 10))
        else:
            dists[name] = FloatDistribution(-1.0, 1.0)
            values[name] = draw(st.floats(-1.0, 1.0))
    return values, dists


@st.composite
def templates(draw: Any) -> FrozenTrial:
    values, dists = draw(params())
    return create_trial(
        state=TrialState.RUNNING,
        params=values,
        distributions=dists,
        user_attrs=draw(st.dictionaries(NAMES, JSON, max_size=6)),
        system_attrs=draw(st.dictionaries(NAMES, JSON, max_size=2)),
    )


def _pair(tmp: Path) -> tuple[RDBStorage, OptunaRDB, int, int]:
    ours = RDBStorage(f"sqlite:///{tmp}/ours.db")
    theirs = OptunaRDB(f"sqlite:///{tmp}/theirs.db")
    directions = [StudyDirection.MAXIMIZE]
    return ours, theirs, ours.create_new_study(directions), theirs.create_new_study(directions)


def _same(a: FrozenTrial, b: FrozenTrial) -> None:
    for field in (
        "number",
        "state",
        "params",
        "distributions",
        "user_attrs",
        "system_attrs",
        "values",
        "intermediate_values",
        "datetime_start",
    ):
        assert getattr(a, field) == getattr(b, field), field
    assert (a.datetime_complete is None) == (b.datetime_complete is None)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(templates(), min_size=1, max_size=4))
def test_created_trials_store_what_optunas_path_stores(tmp_path_factory, drawn):
    ours, theirs, a, b = _pair(tmp_path_factory.mktemp("rows"))
    for template in drawn:
        try:
            expected = theirs.get_trial(theirs.create_new_trial(b, template_trial=template))
        except ValueError:  # a name drawn again with another distribution: refused by both
            with pytest.raises(ValueError):
                ours.create_new_trial(a, template_trial=template)
            continue
        _same(ours.get_trial(ours.create_new_trial(a, template_trial=template)), expected)
    stored, expected_all = ours.get_all_trials(a), theirs.get_all_trials(b)
    for x, y in zip(stored, expected_all, strict=True):
        _same(x, y)


def test_a_refused_first_trial_leaves_no_distribution_behind(tmp_path):
    """The first distribution of a name is remembered only once it is stored: a first
    trial that fails to store does not make its distribution the study's."""
    ours = RDBStorage(f"sqlite:///{tmp_path}/s.db")
    study = ours.create_new_study([StudyDirection.MAXIMIZE])
    ints = {"depth": IntDistribution(1, 3)}
    bad = create_trial(
        state=TrialState.RUNNING,
        params={"depth": 2},
        distributions=ints,
        user_attrs={"x": "y" * 10},
    )
    bad.user_attrs["x"] = object()  # not JSON: the whole creation rolls back
    with pytest.raises(TypeError):
        ours.create_new_trial(study, template_trial=bad)
    assert ours.get_all_trials(study) == []
    other = {"depth": CategoricalDistribution(["a", "b"])}
    made = ours.create_new_trial(
        study,
        template_trial=create_trial(
            state=TrialState.RUNNING, params={"depth": "a"}, distributions=other
        ),
    )
    assert ours.get_trial(made).params == {"depth": "a"}
    with pytest.raises(ValueError, match="Cannot set different distribution"):
        ours.create_new_trial(
            study,
            template_trial=create_trial(
                state=TrialState.RUNNING, params={"depth": 2}, distributions=ints
            ),
        )
    # A study deleted: a new one (SQLite may give it the same id) binds nothing of it.
    ours.delete_study(study)
    again = ours.create_new_study([StudyDirection.MAXIMIZE])
    made = ours.create_new_trial(
        again,
        template_trial=create_trial(
            state=TrialState.RUNNING, params={"depth": 2}, distributions=ints
        ),
    )
    assert ours.get_trial(made).params == {"depth": 2}


def test_templates_it_does_not_cover_take_optunas_path(tmp_path):
    ours, theirs, a, b = _pair(tmp_path)
    template = create_trial(
        state=TrialState.COMPLETE,
        value=0.5,
        params={"w": 3},
        distributions={"w": IntDistribution(0, 8)},
        intermediate_values={0: 0.1, 1: 0.3},
        user_attrs={"k": [1, 2]},
    )
    _same(
        ours.get_trial(ours.create_new_trial(a, template_trial=template)),
        theirs.get_trial(theirs.create_new_trial(b, template_trial=template)),
    )


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    attrs=st.dictionaries(NAMES, JSON, min_size=1, max_size=4),
    earlier=st.dictionaries(NAMES, JSON, max_size=3),
    state=st.sampled_from([TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL]),
    values=st.one_of(st.none(), st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=2)),
)
def test_ending_a_trial_stores_what_optunas_writes_store(
    tmp_path_factory, attrs, earlier, state, values
):
    """One transaction stores what an attribute at a time, then the state, stores (an
    attribute set earlier is overwritten, as Optuna's upsert does)."""
    ours, theirs, a, b = _pair(tmp_path_factory.mktemp("end"))
    if values is not None and state != TrialState.COMPLETE:
        values = None  # Optuna stores values only with a complete trial's state
    directions = [StudyDirection.MAXIMIZE] * len(values or [0])
    a = ours.create_new_study(directions)
    b = theirs.create_new_study(directions)
    template = create_trial(state=TrialState.RUNNING, user_attrs=earlier)
    x = ours.create_new_trial(a, template_trial=template)
    y = theirs.create_new_trial(b, template_trial=template)
    ours.finish_trial(x, user_attrs=attrs, state=state, values=values)
    for key, value in attrs.items():
        theirs.set_trial_user_attr(y, key, value)
    theirs.set_trial_state_values(y, state, values)
    _same(ours.get_trial(x), theirs.get_trial(y))


def test_ending_is_all_or_nothing(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path}/s.db")
    study = storage.create_new_study([StudyDirection.MAXIMIZE])
    trial = storage.create_new_trial(study, template_trial=create_trial(state=TrialState.RUNNING))
    with pytest.raises(TypeError):  # the second attribute cannot be stored: neither is
        end_trial(storage, trial, {"result": 1, "bad": object()}, TrialState.COMPLETE, [1.0])
    kept = storage.get_trial(trial)
    assert kept.state == TrialState.RUNNING and kept.user_attrs == {}
    end_trial(storage, trial, {"result": 2}, TrialState.COMPLETE, [0.5])
    with pytest.raises(UpdateFinishedTrialError):  # ended once: a second end changes nothing
        end_trial(storage, trial, {"result": 3}, TrialState.FAIL)
    done = storage.get_trial(trial)
    assert (done.state, done.values, done.user_attrs) == (TrialState.COMPLETE, [0.5], {"result": 2})
    with pytest.raises(ValueError, match="not an end"):
        storage._backend.finish_trial(trial, user_attrs={}, state=TrialState.RUNNING)


def test_journal_storage_ends_a_trial_one_write_at_a_time(tmp_path):
    storage = open_storage(f"journal:{tmp_path}/s.log")
    study = storage.create_new_study([StudyDirection.MAXIMIZE])
    trial = storage.create_new_trial(study, template_trial=create_trial(state=TrialState.RUNNING))
    end_trial(storage, trial, {"result": {"a": 1}}, TrialState.COMPLETE, [0.25])
    done = storage.get_trial(trial)
    assert (done.state, done.values, done.user_attrs) == (
        TrialState.COMPLETE,
        [0.25],
        {"result": {"a": 1}},
    )


def test_concurrent_creators_number_trials_uniquely(tmp_path):
    """Trial numbers stay unique and gapless with creators in threads of their own
    (Optuna's lock on the study's row is kept)."""
    url = f"sqlite:///{tmp_path}/s.db"
    study = open_storage(url).create_new_study([StudyDirection.MAXIMIZE], "s")
    dists = {"g": IntDistribution(0, 9)}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        storage = open_storage(url)
        try:
            for i in range(15):
                template = create_trial(
                    state=TrialState.RUNNING,
                    params={"g": (seed + i) % 10},
                    distributions=dists,
                    user_attrs={"worker": seed},
                    system_attrs={"beat": float(i)},
                )
                storage.create_new_trial(study, template_trial=template)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors and not any(t.is_alive() for t in threads)
    trials = open_storage(url).get_all_trials(study)
    assert sorted(t.number for t in trials) == list(range(60))
    assert all(len(t.params) == 1 and len(t.system_attrs) == 1 for t in trials)


@pytest.mark.service
def test_postgresql_stores_what_optunas_path_stores(postgres_url):
    ours = open_storage(postgres_url)
    theirs = OptunaRDB(postgres_url)
    a = ours.create_new_study([StudyDirection.MAXIMIZE], "ours")
    b = theirs.create_new_study([StudyDirection.MAXIMIZE], "theirs")
    start = datetime.datetime(2026, 11, 26, 12, 0, 0)
    for i in range(3):
        template = create_trial(
            state=TrialState.RUNNING,
            params={"depth": i, "op": "conv"},
            distributions={
                "depth": IntDistribution(0, 4),
                "op": CategoricalDistribution(["conv", "skip"]),
            },
            user_attrs={"arch": {"depth": i}, "seed": i},
            system_attrs={"beat": 1.5},
        )
        template.datetime_start = start
        x = ours.create_new_trial(a, template_trial=template)
        y = theirs.create_new_trial(b, template_trial=template)
        end_trial(ours, x, {"result": {"acc": 0.5}}, TrialState.COMPLETE, [0.5])
        theirs.set_trial_user_attr(y, "result", {"acc": 0.5})
        theirs.set_trial_state_values(y, TrialState.COMPLETE, [0.5])
        _same(ours.get_trial(x), theirs.get_trial(y))
    bad = create_trial(
        state=TrialState.RUNNING,
        params={"depth": 0.5},
        distributions={"depth": FloatDistribution(0, 1)},
    )
    with pytest.raises(ValueError):
        ours.create_new_trial(a, template_trial=bad)
    assert len(ours.get_all_trials(a)) == 3


def test_a_database_of_an_older_schema_is_refused_with_optunas_words(tmp_path, make_study):
    """Opening reads the installed Optuna's schema head once a process (not from its
    migration scripts at every open); a database at another revision still gets
    Optuna's own refusal, and one at the head opens, however often."""
    import sqlite3

    url = f"sqlite:///{tmp_path}/old.db"
    RDBStorage(url)
    for _ in range(3):
        RDBStorage(url, skip_table_creation=True)
    with sqlite3.connect(tmp_path / "old.db") as db:
        db.execute("UPDATE alembic_version SET version_num = 'v3.0.0.a'")
    with pytest.raises(RuntimeError, match="optuna storage upgrade --storage"):
        RDBStorage(url, skip_table_creation=True)
    RDBStorage(url, skip_table_creation=True, skip_compatibility_check=True)  # as asked
    study = make_study("new")
    with sqlite3.connect(tmp_path / "new.db") as db:
        db.execute("UPDATE alembic_version SET version_num = 'v3.0.0.a'")
    with pytest.raises(AutosearchError, match="optuna storage upgrade") as refused:
        load_study(study.name, storage=study.storage_url)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.service)])
def test_a_study_created_whole_stores_what_optunas_path_stores_in_one_commit(
    kind, tmp_path, request
):
    """autosearch's creation (directions, metric names, creation id and definition in
    one transaction) against Optuna's (a commit each): the same study, read back; a
    creation that fails part way stores nothing; a second of the same name is Optuna's
    DuplicatedStudyError."""
    import optuna
    from optuna.exceptions import DuplicatedStudyError

    url = (
        str(request.getfixturevalue("postgres_url"))
        if kind == "postgresql"
        else f"sqlite:///{tmp_path}/s.db"
    )
    ours, theirs = open_storage(url), OptunaRDB(url)
    backend = database(ours)
    directions = [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]
    user = {"autosearch": {"space": {"name": "nb201"}, "seed": 3}, "note": [1, "x"]}
    system = {"study:metric_names": ["accuracy", "flops"], "autosearch:uid": "0a1b"}
    a = backend.create_whole_study(directions, "ours", user_attrs=user, system_attrs=system)
    b = theirs.create_new_study(directions, "theirs")
    for key, value in system.items():
        theirs.set_study_system_attr(b, key, value)
    for key, value in user.items():
        theirs.set_study_user_attr(b, key, value)
    for read in (ours, theirs):
        assert read.get_study_directions(a) == read.get_study_directions(b) == directions
        assert read.get_study_user_attrs(a) == read.get_study_user_attrs(b) == user
        assert read.get_study_system_attrs(a) == read.get_study_system_attrs(b) == system
        assert read.get_study_name_from_id(a) == "ours"
    assert optuna.load_study(study_name="ours", storage=url).metric_names == ["accuracy", "flops"]
    with pytest.raises(TypeError):  # not JSON: the study's row goes back with the rest
        backend.create_whole_study(
            directions, "half", user_attrs={"x": object()}, system_attrs=system
        )
    assert "half" not in [s.study_name for s in ours.get_all_studies()]
    with pytest.raises(DuplicatedStudyError):
        backend.create_whole_study(directions, "ours", user_attrs={}, system_attrs={})
    assert sorted(s.study_name for s in ours.get_all_studies()) == ["ours", "theirs"]


@pytest.mark.parametrize("cut", [0, 1, 2])
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_creation_cut_off_before_its_definition_is_completed_by_the_next_run(
    kind, cut, make_study, tmp_path, monkeypatch
):
    """A process killed while it makes a study in a journal (a record each: the study,
    its metric names, its creation id, its definition) leaves a prefix of them. Loading
    it says so; the next run of the same study finishes it (keeping a creation id already
    written) and runs, where it used to be refused as not autosearch's after a minute.
    A study that holds anything else, or other directions, is still refused, untouched."""
    from autosearch.study import stored

    monkeypatch.setattr(stored, "_CREATION_WAIT", 0.0)  # nobody else is making it here
    url = f"journal:{tmp_path}/s.log" if kind == "journal" else f"sqlite:///{tmp_path}/s.db"
    whole = make_study("whole", storage=url)
    storage = open_storage(url)
    keys = [stored._METRIC_NAMES, stored._UID]  # _create's order
    system = storage.get_study_system_attrs(whole._study_id)
    assert set(system) == set(keys)
    directions = storage.get_study_directions(whole._study_id)
    cut_id = storage.create_new_study(directions, "cut")
    for key in keys[:cut]:  # the records written before the kill
        storage.set_study_system_attr(cut_id, key, system[key])
    foreign = storage.create_new_study(directions, "foreign")
    storage.set_study_user_attr(foreign, "owner", "someone")
    other = storage.create_new_study([StudyDirection.MINIMIZE] * len(directions), "other")

    with pytest.raises(AutosearchError, match="half-made") as said:
        load_study("cut", storage=url)
    assert "\n" not in str(said.value)
    study = make_study("cut", storage=url, load_if_exists=True)
    assert len(study.optimize(1)) == 1
    done = open_storage(url)
    kept = done.get_study_system_attrs(cut_id)
    assert kept[stored._METRIC_NAMES] == system[stored._METRIC_NAMES]
    assert (kept[stored._UID] == system[stored._UID]) == (cut == 2)  # made once
    assert (
        stored.read_definition(done, "cut", url)[1] == stored.read_definition(done, "whole", url)[1]
    )
    assert len(load_study("cut", storage=url).optuna_study.trials) == 1

    refusals = [
        ("foreign", foreign, "not created by autosearch"),
        ("other", other, "other objectives"),
    ]
    for name, study_id, says in refusals:
        before = done.get_study_user_attrs(study_id)
        with pytest.raises(AutosearchError, match=says) as refused:
            make_study(name, storage=url, load_if_exists=True)
        assert "\n" not in str(refused.value)
        study_id = done.get_study_id_from_name(name)
        assert done.get_study_user_attrs(study_id) == before
        assert not done.get_study_system_attrs(study_id) and not done.get_n_trials(study_id)
