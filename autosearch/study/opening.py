"""Opening a study: create one (its definition checked, stored once) or load a stored
one; both give the facade (autosearch.study.study.Study)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from optuna.storages import BaseStorage

from autosearch.compress import Compression
from autosearch.controller import Controller
from autosearch.data import Dataset, load_data, spec_of
from autosearch.errors import ConfigError, PlatformError
from autosearch.evaluation.proxies import ProxyConfig
from autosearch.evaluation.tabular import Table
from autosearch.evaluation.user import Evaluator, Scorer, check_evaluator
from autosearch.space import SearchSpace
from autosearch.storage._urls import (
    StorageTarget,
    close_storage,
    default_storage,
    open_storage,
    storage_target,
)
from autosearch.storage.artifacts import location_of, stored_location
from autosearch.study.definition import StudyDefinition, resolve_components
from autosearch.study.jobs import COMPANION, is_companion
from autosearch.study.stored import store_definition
from autosearch.study.study import Study, open_study
from autosearch.tracking.spec import Tracking
from autosearch.training.early_stopping import SuccessiveHalving
from autosearch.training.train import TrainConfig
from autosearch.weight_sharing.supernet import SupernetConfig
from autosearch.workers._failpoints import check_armed
from autosearch.workers._heartbeat import heartbeat_settings

__all__ = ["check_study_name", "create_study", "default_storage", "load_study"]

logger = logging.getLogger(__name__)


def check_study_name(name: object) -> str:
    """``name`` as a study's name: printable text, and not a companion study's.

    Raises:
        ConfigError: saying what was given and what a name may hold.
    """
    if not isinstance(name, str) or not name or len(name) > 512 or not name.isprintable():
        raise ConfigError(
            f"a study's name must be printable text of 1 to 512 characters, got {name!r}"
        )
    if name != name.strip():
        raise ConfigError(
            f"a study's name must not start or end with spaces (names are compared exactly), "
            f"got {name!r}" + ("" if name.strip() else ": it is only spaces")
        )
    if is_companion(name):
        raise ConfigError(f"study names ending in {COMPANION!r} are autosearch's own; got {name!r}")
    return name


def create_study(
    name: str,
    *,
    controller: Controller | str,
    space: SearchSpace | str | None = None,
    data: str | tuple[Any, Any] = "digits",
    objectives: Iterable[str] = ("accuracy", "flops"),
    reward: str = "mnas",
    variants: Iterable[str] = ("base",),
    compression: Compression | None = None,
    train: TrainConfig | None = None,
    storage: str | BaseStorage | None = None,
    artifacts: str | None = None,
    seed: int = 0,
    table: Table | None = None,
    early_stopping: SuccessiveHalving | None = None,
    supernet: SupernetConfig | None = None,
    proxies: ProxyConfig | None = None,
    mlflow: str | bool | None = None,
    tensorboard: str | Path | None = None,
    evaluator: Evaluator | None = None,
    metrics: Mapping[str, str] | None = None,
    load_if_exists: bool = False,
) -> Study:
    """Create a study (or, with ``load_if_exists``, continue the stored one of the same
    name and definition): the arguments are :class:`autosearch.StudySpec`'s fields.
    ``storage`` may also be an Optuna storage object: ``RDBStorage(url,
    engine_kwargs=...)`` (its engine settings apply in every worker, over autosearch's
    own) or ``JournalStorage(JournalFileBackend(path))``; the URL it names is checked as a
    URL is. ``evaluator``: your own training or evaluation (a function or callable object
    given each :class:`autosearch.Candidate`, returning its figures: autosearch.evaluation.user)
    instead of autosearch's trainer; ``metrics`` declares figures it returns as objectives
    (``{"f1": "maximize"}``: then ``objectives=("f1", "flops")`` may name them).

    Raises:
        UnknownNameError, ConfigError: an unknown name, or a setting that cannot be used.
        StorageError: an unusable storage URL.
        StudyError: the study exists (without ``load_if_exists``) or is stored with a
            different definition.
    """
    check_study_name(name)
    heartbeat_settings()  # every setting is checked before data or storage is touched
    check_armed()
    tracking = Tracking.of(mlflow=mlflow, tensorboard=tensorboard)
    evaluator_path = check_evaluator(evaluator) if evaluator is not None else None
    space, controller = resolve_components(space, controller, seed)
    definition = StudyDefinition.define(
        space=space,
        controller=controller,
        data=spec_of(data),
        objectives=list(objectives),
        reward=reward,
        variants=list(variants),
        compression=compression,
        train=train,
        seed=seed,
        artifacts=artifacts,
        table=table,
        early_stopping=early_stopping,
        supernet=supernet,
        proxies=proxies,
        evaluator=evaluator_path,
        metrics=metrics,
    )
    if evaluator is not None and not isinstance(evaluator, Scorer):
        _say_skipped(definition)
    target = storage_target(storage if storage is not None else default_storage(name))
    dataset = _check_data(space, data, table=table, seed=seed)
    url = target.url
    definition = definition.with_data(space, dataset)
    backend, definition = _store(name, target, definition, artifacts, load_if_exists)
    source = None if isinstance(data, str) else data
    opened: dict[str, Any] = {"storage": backend, "definition": definition, "data_source": source}
    study = Study(
        name=name,
        url=url,
        target=target,
        controller=controller,
        data=dataset,
        evaluator=evaluator,
        **opened,
    )
    study.track(mlflow=tracking.mlflow, tensorboard=tracking.tensorboard)  # None: kept
    return study


def _store(
    name: str,
    target: StorageTarget,
    definition: StudyDefinition,
    artifacts: str | None,
    load_if_exists: bool,
) -> tuple[BaseStorage, StudyDefinition]:
    """Store a new study's definition (or continue the stored one): its storage, and the
    definition it runs with. Where its weights go is stored with it: refused here if
    unusable, before the storage is touched."""
    url = target.url
    definition = dataclasses.replace(definition, artifacts=location_of(artifacts, url, name))
    backend = open_storage(target)
    try:
        definition = store_definition(
            backend,
            name,
            url,
            definition,
            load_if_exists=load_if_exists,
            artifacts_given=artifacts is not None,
        )
    except BaseException:
        close_storage(backend)
        raise
    if definition.table is None:
        _make_folder(stored_location(definition.artifacts, url, name))
    return backend, definition


def _make_folder(location: str) -> None:
    """Create a new study's artifacts folder, so that its other processes find it (they
    never create a stored folder: on a machine without it, that would scatter weights)."""
    if location.startswith("s3://"):
        return
    try:
        Path(location).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlatformError(
            f"cannot create the artifacts folder {location}: {exc.strerror or exc}; choose a "
            "writable folder with artifacts="
        ) from None


def _say_skipped(definition: StudyDefinition) -> None:
    """Say once, at creation, which variants a user's evaluator cannot score."""
    skipped = [v.name for v in definition.variants if v.kind != "base"]
    if skipped:
        logger.warning(
            "variants %s will be skipped: evaluator %s scores no given network (give it a "
            "score(model, candidate) method to score them)",
            ", ".join(skipped),
            definition.evaluator,
        )


def _check_data(
    space: SearchSpace, data: str | tuple[Any, Any], *, table: Table | None, seed: int
) -> Dataset | None:
    """The study's data, loaded and cleaned; or, for a table study, the table checked."""
    if table is None:
        return load_data(data, seed=seed)
    table.check_space(space)
    table.rows()  # a missing or malformed table fails here, before storage is touched
    return None


def load_study(
    name: str,
    *,
    storage: str | BaseStorage,
    data: tuple[Any, Any] | None = None,
    read_only: bool = False,
    evaluator: Evaluator | None = None,
) -> Study:
    """Open a stored study, rebuilding its space and controller from storage.

    ``storage``: a URL, or an Optuna storage object (``RDBStorage(url,
    engine_kwargs=...)``, ``JournalStorage(JournalFileBackend(path))``) as in
    :func:`create_study`.

    The controller gets its stored state back, then every finished trial it has not
    seen is replayed into it, so ``optimize`` continues where the study stopped.
    A study created from ``(images, labels)`` arrays needs the same arrays again.
    ``read_only``: to read results; opening creates and changes nothing in storage.
    ``evaluator``: the evaluator a study created with one trains with (the same, by its
    import path); reading its results needs none.
    """
    return open_study(name, storage=storage, data=data, read_only=read_only, evaluator=evaluator)
