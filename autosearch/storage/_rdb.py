"""Optuna's RDB storage, with a trial's creation and its end each in a few statements.

Optuna writes a new trial from a template a row at a time: for each param and attribute
it reads the trial again to check that it is still running, and for each param it reads
the study's first stored value of that name to check that the distributions agree. A
trial of six genes and eight attributes costs about thirty statements (as many round
trips to a PostgreSQL server): a weight-sharing search spends more on it than on some
subnets' evaluation. A new trial is running and nobody else's, so here its rows are
inserted together, and a param name's first distribution, which never changes once
stored, is read once per process. Ending a trial (its result attributes, state and
values) is one transaction, not one each.

The rows written are Optuna's own (tests/test_storage_rows.py compares them with what
Optuna's path writes); a template this path does not cover (with values or intermediate
values) takes Optuna's. Only ``_get_prepared_new_trial``, the step Optuna's trial
creation delegates to inside its locked transaction, is replaced; the lock on the study
row that keeps trial numbers unique is Optuna's.

Opening a storage, Optuna checks that the database's schema revision is the head of its
own migration scripts, which it finds by loading every script from disk, each time: a
large part of reading a study's status. The head is
the installed Optuna's and cannot change in a process: read once, then compared with
the database's revision on every open; where they differ, Optuna's own check says why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

import optuna
from optuna.distributions import (
    BaseDistribution,
    check_distribution_compatibility,
    distribution_to_json,
    json_to_distribution,
)
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from autosearch._compat import rdb_models, scoped_session
from autosearch.workers._failpoints import failpoint

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

models = rdb_models()  # Optuna's RDB tables (private: autosearch/_compat.py)

__all__ = ["TAKEOVER_LOCK_WAIT", "RDBStorage", "TrialLocked", "idle_transaction_limit"]

# Seconds a worker waits for the row of a trial it takes over (its silent worker may be
# inside the trial's end, paused); it tries again at its next look.
TAKEOVER_LOCK_WAIT = 2.0


class TrialLocked(Exception):
    """A trial's row held by another session (a worker inside its own end of the
    trial, perhaps paused) past the time one would wait for it."""


def idle_transaction_limit(grace: float) -> float:
    """Seconds after which PostgreSQL ends a session left idle inside a transaction (a
    worker paused or hung between two statements), releasing what it locked: its
    heartbeat's grace, and no less than a loaded machine's pause between statements."""
    return max(grace, 5.0)


def _lock_not_available(exc: BaseException) -> bool:
    """Whether ``exc`` wraps PostgreSQL's lock_timeout (SQLSTATE 55P03)."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if getattr(seen, "sqlstate", None) == "55P03" or getattr(seen, "pgcode", None) == "55P03":
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__ or seen.__context__
    return False


_optuna_logger = optuna.logging.get_logger("optuna.storages._rdb.storage")  # its words
_DELETE_TRIES = 8  # a deletion colliding with writes under the study: tried again
_HEAD: list[str] = []  # the installed Optuna's schema revision, once read


def _head_revision(versions: Any) -> str:
    """The head of the installed Optuna's migration scripts, read once a process."""
    if not _HEAD:
        _HEAD.append(versions.get_head_version())
    return _HEAD[0]


class RDBStorage(optuna.storages.RDBStorage):
    """:class:`optuna.storages.RDBStorage` whose trials are created and ended in few
    statements (see the module's docstring); everything else is Optuna's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "skip_compatibility_check": True})
        if not kwargs.get("skip_compatibility_check"):
            versions = self._version_manager
            if versions.get_current_version() != _head_revision(versions):
                versions.check_table_schema_compatibility()  # Optuna's words
        # (study id, param name) -> the distribution of that name's first stored value
        self._first: dict[tuple[int, str], BaseDistribution] = {}

    def create_whole_study(
        self,
        directions: Sequence[optuna.study.StudyDirection],
        name: str,
        *,
        user_attrs: Mapping[str, Any],
        system_attrs: Mapping[str, Any],
    ) -> int:
        """Create study ``name`` with its attributes in one transaction, the rows Optuna's
        ``create_new_study`` and ``set_study_*_attr`` write one commit each: a process
        killed while it makes the study leaves all of it or none (never a study without
        the attributes that make it whole). Its id.

        Raises:
            optuna.exceptions.DuplicatedStudyError: a study of that name exists.
        """
        try:
            with scoped_session(self.scoped_session) as session:
                study = models.StudyModel(
                    study_name=name,
                    directions=[
                        models.StudyDirectionModel(objective=objective, direction=direction)
                        for objective, direction in enumerate(directions)
                    ],
                )
                session.add(study)
                session.flush()  # its id, for the rows below
                session.add_all(
                    [
                        model(study_id=study.study_id, key=key, value_json=json.dumps(value))
                        for model, attrs in (
                            (models.StudyUserAttributeModel, user_attrs),
                            (models.StudySystemAttributeModel, system_attrs),
                        )
                        for key, value in attrs.items()
                    ]
                )
                study_id = int(study.study_id)
        except IntegrityError:  # the unique name: another process made it first
            raise optuna.exceptions.DuplicatedStudyError(
                f"Another study with name '{name}' already exists."
            ) from None
        _optuna_logger.info(f"A new study created in RDB with name: {name}")
        return study_id

    def delete_study(self, study_id: int) -> None:
        """Delete the study and everything under it, or raise.

        Optuna's delete reads the study's rows, then deletes them and the study in its
        commit. A row a running worker commits in between (a new trial, an epoch's
        value) makes the database refuse the study's deletion (its foreign key), and
        Optuna ignores that IntegrityError: the delete returns having deleted nothing.
        Here the delete is tried again with the rows read again, and fails aloud if it
        keeps colliding.

        Raises:
            KeyError: no study has this id (Optuna's error).
            optuna.exceptions.StorageInternalError: every try collided with a write.
        """
        for attempt in range(_DELETE_TRIES):
            try:
                with scoped_session(self.scoped_session) as session:
                    session.delete(models.StudyModel.find_or_raise_by_id(study_id, session))
                break
            except IntegrityError:
                time.sleep(0.01 * 2**attempt)  # 10 ms, then twice as long each time
        else:
            raise optuna.exceptions.StorageInternalError(
                f"study {study_id} was not deleted: each of {_DELETE_TRIES} tries collided "
                "with a write under it (a worker still running); stop its workers and "
                "delete it again"
            )
        # A later study may be given the same id: what this one stored no longer binds.
        self._first = {key: d for key, d in self._first.items() if key[0] != study_id}

    def _get_prepared_new_trial(
        self, study_id: int, template_trial: FrozenTrial | None, session: Session
    ) -> Any:  # optuna's TrialModel
        template = template_trial
        if template is None or template.values is not None or template.intermediate_values:
            return super()._get_prepared_new_trial(study_id, template, session)
        for name, distribution in template.distributions.items():
            self._check_compatible(session, study_id, name, distribution)
        trial = models.TrialModel(
            study_id=study_id,
            number=None,
            state=TrialState.RUNNING,
            datetime_start=template.datetime_start,
            datetime_complete=template.datetime_complete,
        )
        session.add(trial)
        session.flush()  # its id, for the rows below
        rows: list[Any] = [
            models.TrialParamModel(
                trial_id=trial.trial_id,
                param_name=name,
                param_value=template.distributions[name].to_internal_repr(value),
                distribution_json=distribution_to_json(template.distributions[name]),
            )
            for name, value in template.params.items()
        ]
        for model, attrs in (
            (models.TrialUserAttributeModel, template.user_attrs),
            (models.TrialSystemAttributeModel, template.system_attrs),
        ):
            rows += [
                model(trial_id=trial.trial_id, key=key, value_json=json.dumps(value))
                for key, value in attrs.items()
            ]
        session.add_all(rows)
        trial.state = template.state
        trial.number = trial.count_past_trials(session)
        return trial

    def _check_compatible(
        self, session: Session, study_id: int, name: str, distribution: BaseDistribution
    ) -> None:
        """Raise ValueError (as Optuna does) where ``distribution`` disagrees with the one
        the study first stored under ``name``."""
        first = self._first.get((study_id, name))
        if first is None:
            record = (
                session.query(models.TrialParamModel.distribution_json)
                .join(models.TrialModel)
                .filter(models.TrialModel.study_id == study_id)
                .filter(models.TrialParamModel.param_name == name)
                .first()
            )
            if record is None:
                return  # this trial's is the first: kept only once it is stored
            first = self._first[(study_id, name)] = json_to_distribution(record[0])
        check_distribution_compatibility(first, distribution)

    def finish_trial(
        self,
        trial_id: int,
        *,
        user_attrs: Mapping[str, Any],
        state: TrialState,
        values: Sequence[float] | None = None,
        lock_wait: float | None = None,
    ) -> None:
        """Set a running trial's ``user_attrs`` and end it with ``state`` and
        ``values``, in one transaction (all of it stored, or none). ``lock_wait``: at
        most this many seconds for a trial another session is ending (another worker
        taking over a trial waits no longer; its owner waits as long as it takes).

        Raises:
            optuna.exceptions.UpdateFinishedTrialError: the trial has ended already.
            TrialLocked: another session held the trial's row past ``lock_wait``.
        """
        if not state.is_finished():
            raise ValueError(f"finish_trial ends a trial; {state.name} is not an end")
        try:
            self._finish(trial_id, user_attrs, state, values, lock_wait)
        except optuna.exceptions.StorageInternalError as exc:
            if _lock_not_available(exc):
                raise TrialLocked(
                    f"trial id {trial_id} is being ended by another session (its row is "
                    f"locked past {lock_wait} s)"
                ) from None
            raise

    def _finish(
        self,
        trial_id: int,
        user_attrs: Mapping[str, Any],
        state: TrialState,
        values: Sequence[float] | None,
        lock_wait: float | None,
    ) -> None:
        with scoped_session(self.scoped_session) as session:
            if lock_wait is not None and session.get_bind().dialect.name == "postgresql":
                # A worker paused inside its own end of this trial holds the row: wait a
                # bounded time for it, never for as long as it stays paused.
                session.execute(text(f"SET LOCAL lock_timeout = {max(1, int(lock_wait * 1000))}"))
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            self.check_trial_is_updatable(trial_id, cast(TrialState, trial.state))
            for key, value in user_attrs.items():
                self._set_trial_attr_without_commit(
                    session, models.TrialUserAttributeModel, trial_id, key, value
                )
            for objective, value in enumerate(values or ()):
                self._set_trial_value_without_commit(session, trial, objective, value)
            trial.state = state
            trial.datetime_complete = datetime.now()
            failpoint("end_trial.inside")  # written, not committed
