"""A study in its storage: the Optuna study made once with its definition (a study
user attribute) and a random creation id, the definition read back, and a stored
study continued only with a definition that measures the same."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Any

from optuna.exceptions import DuplicatedStudyError
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.study.study import _SYSTEM_ATTR_METRIC_NAMES as _METRIC_NAMES  # Optuna's key

from autosearch.data import Dataset, load_data, spec_of
from autosearch.errors import StorageError, StudyError, suggest
from autosearch.storage._urls import StorageTarget, close_storage, database, open_storage
from autosearch.study.definition import StudyDefinition
from autosearch.study.jobs import is_companion

__all__ = ["open_stored", "read_definition", "store_definition", "study_uid", "write_definition"]

logger = logging.getLogger(__name__)

_ATTR = "autosearch"  # the study user attribute that holds the definition
_UID = "autosearch:uid"  # the study system attribute: a random id, made once at creation


def open_stored(
    name: str, target: StorageTarget, data: tuple[Any, Any] | None, *, read_only: bool
) -> tuple[BaseStorage, StudyDefinition, Dataset | None]:
    """Study ``name`` at ``target`` opened: its storage, its definition, and its dataset
    when ``data`` (the arrays it was created from) is given.

    Raises:
        StorageError, StudyError: no such study, or other data than it was created from.
    """
    url = target.url
    backend = open_storage(target, create=False, write=not read_only)
    try:
        _, definition = read_definition(backend, name, url)
        if data is not None and spec_of(data) != definition.data:
            raise StudyError(
                f"study {name!r} was created from other data ({definition.data}, "
                f"given {spec_of(data)}); pass the arrays it was created from"
            )
    except BaseException:
        close_storage(backend)
        raise
    dataset = load_data(data, seed=definition.seed) if data is not None else None
    return backend, definition, dataset


def read_definition(storage: BaseStorage, name: str, url: str) -> tuple[int, StudyDefinition]:
    """The id and definition of study ``name`` in ``storage`` (at ``url``, for errors)."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        names = [s.study_name for s in storage.get_all_studies() if not is_companion(s.study_name)]
        close = suggest(name, names)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise StorageError(
            f"no study named {name!r} in {url}.{hint} Studies there: {', '.join(names) or '(none)'}"
        ) from None
    stored = storage.get_study_user_attrs(study_id).get(_ATTR)
    if not isinstance(stored, dict):
        if _half_made(storage, study_id):
            raise StudyError(
                f"study {name!r} in {url} was left half-made (no definition and no trial: a "
                "process stopped while creating it); run its study file again (or create_study "
                "with load_if_exists=True) to complete it"
            )
        raise StudyError(f"study {name!r} in {url} was not created by autosearch (no definition)")
    return study_id, StudyDefinition.from_json(stored, where=f"study {name!r} in {url}")


def study_uid(storage: BaseStorage, study_id: int) -> str:
    """The id made when the study was created ("" for a study made before there was
    one): two studies of the same name and artifacts URL, made one after the other,
    differ in it."""
    uid = storage.get_study_system_attrs(study_id).get(_UID)
    return uid if isinstance(uid, str) and uid.isalnum() else ""


def _directions(definition: StudyDefinition) -> list[StudyDirection]:
    return [StudyDirection[direction.upper()] for direction in definition.directions]


def _create(storage: BaseStorage, name: str, definition: StudyDefinition) -> StudyDefinition:
    """Make study ``name`` whole: its directions, metric names, creation id and
    definition. On a database, in one transaction (a process killed meanwhile leaves
    all of it or nothing); in a journal, one record after another, the definition last,
    so that a study that holds one is whole (a worker that joins waits for it:
    :func:`_await_definition`; one cut off before it is finished by the next process
    that continues the study: :func:`_complete`)."""
    user = {_ATTR: definition.to_json()}
    system = {_METRIC_NAMES: list(definition.objectives), _UID: uuid.uuid4().hex}
    directions = _directions(definition)
    whole = getattr(database(storage), "create_whole_study", None)
    if whole is not None:
        whole(directions, name, user_attrs=user, system_attrs=system)
        return definition
    study_id = storage.create_new_study(directions, name)
    for key, value in system.items():
        storage.set_study_system_attr(study_id, key, value)
    storage.set_study_user_attr(study_id, _ATTR, user[_ATTR])
    return definition


_CREATION_WAIT = 60.0  # seconds a joining worker waits for a new study's definition


def _await_definition(storage: BaseStorage, name: str) -> None:
    """Wait (bounded) while study ``name`` is being created by another worker: it exists,
    holds no trial and no definition yet. A study that stays so was not made by
    autosearch, which read_definition then says."""
    study_id = storage.get_study_id_from_name(name)
    waited, pause = 0.0, 0.05
    while _ATTR not in storage.get_study_user_attrs(study_id):
        if waited >= _CREATION_WAIT or storage.get_n_trials(study_id):
            return
        time.sleep(pause)
        waited, pause = waited + pause, min(pause * 2, 1.0)


def _half_made(storage: BaseStorage, study_id: int) -> bool:
    """Whether the study holds only a prefix of what :func:`_create` writes before the
    definition (in a journal, a record each): a creation cut off by a killed process,
    or an empty study made with Optuna alone. Nothing in it can be lost by completing it."""
    return (
        not storage.get_study_user_attrs(study_id)
        and set(storage.get_study_system_attrs(study_id)) <= {_METRIC_NAMES, _UID}
        and not storage.get_n_trials(study_id)
    )


def _complete(storage: BaseStorage, name: str, url: str, definition: StudyDefinition) -> None:
    """Finish a half-made study ``name`` (:func:`_half_made`) as :func:`_create` would
    have: the records it lacks, in the same order, the definition last; a creation id
    already written is kept. Two processes completing it at once both write the
    definition (the one continued is then checked against it, as any joining worker's is).

    Raises:
        StudyError: it was begun for other objectives (left as it is).
    """
    study_id = storage.get_study_id_from_name(name)
    if not _half_made(storage, study_id):
        return
    system = storage.get_study_system_attrs(study_id)
    objectives, directions = list(definition.objectives), _directions(definition)
    if storage.get_study_directions(study_id) != directions or (
        system.get(_METRIC_NAMES, objectives) != objectives
    ):
        raise StudyError(
            f"study {name!r} in {url} was left half-made (no definition, no trial) for other "
            f"objectives than {', '.join(objectives)} "
            f"({', '.join(d.name.lower() for d in directions)}); "
            "delete it or choose another study name"
        )
    logger.warning(
        "study %s was left half-made (a process stopped while creating it): completing it", name
    )
    if _METRIC_NAMES not in system:
        storage.set_study_system_attr(study_id, _METRIC_NAMES, objectives)
    if _UID not in system:
        storage.set_study_system_attr(study_id, _UID, uuid.uuid4().hex)
    write_definition(storage, study_id, definition)


def write_definition(storage: BaseStorage, study_id: int, definition: StudyDefinition) -> None:
    storage.set_study_user_attr(study_id, _ATTR, definition.to_json())


def store_definition(
    storage: BaseStorage,
    name: str,
    url: str,
    definition: StudyDefinition,
    *,
    load_if_exists: bool,
    artifacts_given: bool = False,
) -> StudyDefinition:
    """Create study ``name`` with ``definition``; or, with ``load_if_exists``, continue
    the stored one if it measures the same (and, ``artifacts_given``, keeps its weights
    where the definition says): the definition the study then runs with."""
    if name not in {s.study_name for s in storage.get_all_studies()}:
        try:
            return _create(storage, name, definition)
        except DuplicatedStudyError:  # another worker made it this moment: join it
            logger.info("study %s was created by another worker at the same time", name)
    if not load_if_exists:
        raise StudyError(
            f"study {name!r} already exists in {url}; pass load_if_exists=True to continue "
            "it, load it with autosearch.load_study, or choose another name"
        )
    _await_definition(storage, name)
    _complete(storage, name, url, definition)
    study_id, stored = read_definition(storage, name, url)
    definition.check_continues(stored, name)
    if artifacts_given and definition.artifacts != stored.artifacts:
        raise StudyError(
            f"study {name!r} keeps its weights in {stored.artifacts or 'the default folder'}, "
            f"not {definition.artifacts}: every process of a study uses the location stored "
            "with it. Leave artifacts unset to use it, or choose another study name"
        )
    if stored.controller != definition.controller:
        # Continuing with another controller is allowed; record it, so that load_study
        # rebuilds the controller that ran last.
        logger.info("study %s continues with controller %s", name, definition.controller.name)
        stored = dataclasses.replace(stored, controller=definition.controller)
        write_definition(storage, study_id, stored)
    return stored
