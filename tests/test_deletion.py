"""A study deleted while a worker writes under it goes whole, or stays whole with an
error (autosearch.storage._rdb.RDBStorage.delete_study).

Optuna's delete reads the study's rows, then deletes them in its commit; a row a worker
commits in between made PostgreSQL refuse the deletion, which Optuna ignores (the delete
returned, nothing deleted), and was left behind by SQLite (an orphan a later study given
the same id would inherit). The writes here are real: a second storage on the same
database commits them between the delete's read and its commit."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optuna.distributions import IntDistribution
from optuna.exceptions import StorageInternalError
from optuna.storages import BaseStorage
from optuna.storages._rdb.models import StudyModel, TrialModel
from optuna.study import StudyDirection
from optuna.trial import TrialState, create_trial
from sqlalchemy import event, text
from sqlalchemy.orm import Session

import autosearch
from autosearch.errors import StudyError
from autosearch.storage import _rdb
from autosearch.storage._urls import database, open_storage
from controllers import RandomSearch

# What a running worker writes under its study, each a new row.
WRITES: dict[str, Callable[[BaseStorage, int, int, int], None]] = {
    "a new trial": lambda s, study, trial, i: s.create_new_trial(study),
    "a new trial with params": lambda s, study, trial, i: s.create_new_trial(
        study,
        template_trial=create_trial(
            state=TrialState.RUNNING, params={"d": 2}, distributions={"d": IntDistribution(1, 4)}
        ),
    ),
    "an epoch's value": lambda s, study, trial, i: s.set_trial_intermediate_value(
        trial, 100 + i, 0.5
    ),
    "a result attribute": lambda s, study, trial, i: s.set_trial_user_attr(trial, f"r{i}", i),
    "a heartbeat's attribute": lambda s, study, trial, i: s.set_trial_system_attr(
        trial, f"beat{i}", 1.5
    ),
}
TABLES = (  # every table that holds a row under a study, and how it names its owner
    ("study_directions", "study_id"),
    ("study_user_attributes", "study_id"),
    ("study_system_attributes", "study_id"),
    ("trials", "study_id"),
    ("trial_params", "trial_id"),
    ("trial_values", "trial_id"),
    ("trial_intermediate_values", "trial_id"),
    ("trial_user_attributes", "trial_id"),
    ("trial_system_attributes", "trial_id"),
    ("trial_heartbeats", "trial_id"),
)


@contextmanager
def colliding(writer: BaseStorage, study: int, trial: int, writes: list[str]) -> Iterator[None]:
    """While inside: each of the next deletions of a study commits ``writes[i]`` through
    ``writer`` after it read the study's rows, before its own commit."""
    left = list(writes)

    def collide(session: Session, *_: Any) -> None:
        if left and any(isinstance(row, StudyModel) for row in session.deleted):
            WRITES[left.pop(0)](writer, study, trial, len(left))

    event.listen(Session, "before_flush", collide)
    try:
        yield
    finally:
        event.remove(Session, "before_flush", collide)


def _rows(storage: BaseStorage, study: int) -> dict[str, int]:
    """How many rows of each table belong to ``study`` (its trials' rows counted by the
    trial ids any row still gives it), and how many name a trial or study not there."""
    trials = "SELECT trial_id FROM trials WHERE study_id = :s"
    with database(storage).engine.connect() as db:  # type: ignore[attr-defined]

        def count(table: str, where: str) -> int:
            sql = text(f"SELECT count(*) FROM {table} WHERE {where}")
            return int(db.execute(sql, {"s": study}).scalar_one())

        counts = {
            table: count(
                table, f"{owner} = :s" if owner == "study_id" else f"trial_id IN ({trials})"
            )
            for table, owner in TABLES
        }
        counts["orphans"] = count("trials", "study_id NOT IN (SELECT study_id FROM studies)") + sum(
            count(table, "trial_id NOT IN (SELECT trial_id FROM trials)")
            for table, owner in TABLES
            if owner == "trial_id"
        )
    return counts


def _study_with_rows(storage: BaseStorage, name: str) -> tuple[int, int]:
    """A study with a finished trial and a running one (rows in every table): the ids of
    the study and of its running trial."""
    study = storage.create_new_study([StudyDirection.MAXIMIZE], name)
    storage.set_study_user_attr(study, "definition", {"space": "nb201"})
    storage.set_study_system_attr(study, "uid", name)
    done = storage.create_new_trial(study, template_trial=create_trial(
        state=TrialState.RUNNING, params={"d": 1}, distributions={"d": IntDistribution(1, 4)}
    ))  # fmt: skip
    storage.set_trial_intermediate_value(done, 0, 0.4)
    storage.set_trial_user_attr(done, "result", {"acc": 0.4})
    storage.set_trial_state_values(done, TrialState.COMPLETE, [0.4])
    running = storage.create_new_trial(study)
    storage.set_trial_system_attr(running, "heartbeat", 1.0)
    database(storage).record_heartbeat(running)  # type: ignore[attr-defined]
    return study, running


def _url(kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> str:
    if kind == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return f"sqlite:///{tmp_path}/studies.db"


NUMBERS = itertools.count()
KINDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.service)]


@pytest.mark.parametrize("kind", KINDS)
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    writes=st.lists(st.sampled_from(sorted(WRITES)), max_size=_rdb._DELETE_TRIES - 1),
)
def test_a_study_deleted_under_a_worker_goes_whole(
    kind, tmp_path_factory, request, monkeypatch, writes
):
    """Fewer colliding writes than tries: the study goes, with every row under it and
    every row the writes added; the study beside it keeps all of its own."""
    monkeypatch.setattr(_rdb.time, "sleep", lambda seconds: None)  # only the pauses go
    url = _url(kind, tmp_path_factory.mktemp("db"), request)  # PostgreSQL: one a test
    number = next(NUMBERS)  # study names unique in that database
    deleter, writer = open_storage(url), open_storage(url)
    kept, _ = _study_with_rows(writer, f"kept{number}")
    study, running = _study_with_rows(writer, f"gone{number}")
    before = _rows(writer, kept)
    with colliding(writer, study, running, writes):
        deleter.delete_study(study)
    assert f"gone{number}" not in [s.study_name for s in writer.get_all_studies()]
    assert _rows(writer, study) == dict.fromkeys(before, 0)
    assert _rows(writer, kept) == before
    again = writer.create_new_study([StudyDirection.MAXIMIZE], f"again{number}")
    assert writer.get_all_trials(again) == []  # SQLite may give it the same id


@pytest.mark.parametrize("kind", KINDS)
def test_a_deletion_that_keeps_colliding_says_so_and_deletes_nothing(
    kind, tmp_path, request, monkeypatch
):
    monkeypatch.setattr(_rdb.time, "sleep", lambda seconds: None)
    url = _url(kind, tmp_path, request)
    deleter, writer = open_storage(url), open_storage(url)
    study, running = _study_with_rows(writer, "busy")
    before = _rows(writer, study)
    writes = ["a new trial", "an epoch's value"] * _rdb._DELETE_TRIES
    with colliding(writer, study, running, writes[: _rdb._DELETE_TRIES]):
        with pytest.raises(StorageInternalError) as raised:
            deleter.delete_study(study)
    assert str(raised.value) == (
        f"study {study} was not deleted: each of {_rdb._DELETE_TRIES} tries collided with "
        "a write under it (a worker still running); stop its workers and delete it again"
    )
    added = _rdb._DELETE_TRIES // 2  # new trials, and as many epochs' values
    more = {"trials": added, "trial_intermediate_values": added}
    assert _rows(writer, study) == {t: n + more.get(t, 0) for t, n in before.items()}
    deleter.delete_study(study)  # the workers stopped: it goes
    assert _rows(writer, study) == dict.fromkeys(before, 0)


def test_a_worker_whose_new_trial_the_database_refuses_says_its_study_was_deleted(
    tmp_path, monkeypatch, tiny_space
):
    """The study deleted between a worker's read of it and its new trial's insert: SQLite
    now refuses the trial (its foreign key; it used to store it, an orphan), and the
    worker stops with the one line that says the study was deleted. (PostgreSQL cannot
    get there: the worker's read locks the study's row until the trial is in.)"""
    monkeypatch.chdir(tmp_path)  # a database's default artifacts land here
    url = f"sqlite:///{tmp_path}/studies.db"
    study = autosearch.create_study(
        "gone", controller=RandomSearch(tiny_space, seed=0), storage=url
    )
    deleter, study_id = open_storage(url), study.optuna_study._study_id
    deleted: list[int] = []

    def delete_first(session: Session, *_: Any) -> None:
        if not deleted and any(isinstance(row, TrialModel) for row in session.new):
            deleted.append(study_id)
            deleter.delete_study(study_id)

    event.listen(Session, "before_flush", delete_first)
    try:
        with pytest.raises(StudyError) as raised:
            study.optimize(1)
    finally:
        event.remove(Session, "before_flush", delete_first)
    assert deleted and str(raised.value) == (
        f"study 'gone' was deleted from {url} while this worker ran (its trials with it); "
        "the worker stops and stores nothing more"
    )
    assert _rows(deleter, study_id)["orphans"] == 0 and _rows(deleter, study_id)["trials"] == 0
