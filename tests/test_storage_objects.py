"""Storage objects as well as URLs: Optuna's ``RDBStorage`` (its engine settings kept,
in every worker) and ``JournalStorage`` on a file, accepted where a URL is, with the
same checks; any other object refused in one line, with nothing stored."""

from __future__ import annotations

import optuna
import pytest
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend

import autosearch
from autosearch import StorageError
from autosearch.storage._urls import StorageTarget, _engine_kwargs, storage_target


def test_an_rdb_storage_object_is_opened_with_its_engine_settings(make_study, tmp_path):
    url = f"sqlite:///{tmp_path}/rdb.db"
    given = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 5}})
    study = make_study("rdb", storage=given)
    assert study.storage_url == url
    assert study._target == StorageTarget(url, {"connect_args": {"timeout": 5}})
    study.optimize(1)
    again = autosearch.load_study("rdb", storage=optuna.storages.RDBStorage(url))
    assert [r.trial for r in again.records(variants=False)] == [0]


def test_a_users_engine_settings_go_over_autosearchs_key_by_key():
    pg = "postgresql://u@h/db"
    ours = _engine_kwargs(pg)
    mine = _engine_kwargs(pg, {"pool_size": 3, "connect_args": {"application_name": "mine"}})
    assert mine["pool_size"] == 3 and mine["pool_pre_ping"] is True
    assert mine["connect_args"]["application_name"] == "mine"
    assert mine["connect_args"]["options"] == ours["connect_args"]["options"]  # kept
    timeout = _engine_kwargs("sqlite:///x.db", {"connect_args": {"timeout": 5}})
    assert timeout["connect_args"] == {"timeout": 5}


def test_a_journal_storage_on_a_file_is_its_journal_url(make_study, tmp_path):
    path = tmp_path / "study.log"
    study = make_study(
        "journal", storage=optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    )
    assert study.storage_url == f"journal:{path}"
    study.optimize(1)
    assert path.is_file() and len(study.records(variants=False)) == 1


class _MemoryBackend(BaseJournalBackend):
    def __init__(self) -> None:
        self.logs: list[dict] = []

    def read_logs(self, log_number_from: int):
        return self.logs[log_number_from:]

    def append_logs(self, logs) -> None:
        self.logs.extend(logs)


@pytest.mark.parametrize(
    ("storage", "match"),
    [
        (optuna.storages.InMemoryStorage(), "storage must be a URL .* or a storage object"),
        (optuna.storages.JournalStorage(_MemoryBackend()), "on a JournalFileBackend"),
        (42, "got int"),
    ],
)
def test_other_objects_are_refused_before_anything_is_stored(make_study, tmp_path, storage, match):
    with pytest.raises(StorageError, match=match):
        make_study("other", storage=storage)
    assert not list(tmp_path.iterdir())  # no storage file, no artifacts folder


def test_the_checks_of_a_url_apply_to_the_url_an_object_names(tmp_path):
    given = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/x.db")
    with pytest.raises(StorageError, match="no study named 'absent'"):
        autosearch.load_study("absent", storage=given)
    with pytest.raises(StorageError, match="engine settings apply to a database URL only"):
        from autosearch.storage._urls import open_storage

        open_storage(StorageTarget(f"journal:{tmp_path}/j.log", {"pool_size": 1}))
    assert storage_target("sqlite:///a.db") == StorageTarget("sqlite:///a.db")


@pytest.mark.slow
def test_pool_workers_open_the_storage_with_the_users_engine_settings(make_study, tmp_path):
    url = f"sqlite:///{tmp_path}/pool.db"
    given = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
    study = make_study("pool", storage=given)
    records = study.optimize(2, n_workers=2)
    assert len(records) == 2 and {r.state for r in records} == {"complete"}


@pytest.mark.service
def test_on_postgresql_the_users_settings_and_autosearchs_both_hold(make_study, postgres_url):
    given = optuna.storages.RDBStorage(
        postgres_url, engine_kwargs={"connect_args": {"application_name": "my-search"}}
    )
    study = make_study("pg", storage=given)
    study.optimize(1)
    from sqlalchemy import text

    from autosearch.storage._urls import database

    with database(study._storage).engine.connect() as connection:
        name = connection.execute(text("SHOW application_name")).scalar()
        idle = connection.execute(text("SHOW idle_in_transaction_session_timeout")).scalar()
    assert name == "my-search" and idle not in ("0", None)
