"""The study facade: create or open a study, run it, read its results, export one.

The storage is the single source of truth; the package docstring maps each concern
(definition, records, claims, replay, loop, workers, artifacts) to its file.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import optuna
import torch.nn as nn
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

from autosearch._storage import close_storage, default_storage, open_storage
from autosearch.architecture import Architecture
from autosearch.compress import Compression, VariantSpec
from autosearch.controller import Controller
from autosearch.data import Dataset, load_data, spec_of
from autosearch.early_stopping import SuccessiveHalving
from autosearch.errors import PlatformError, StudyError
from autosearch.runner import TrialPlan
from autosearch.runtime import broadcast_object, world
from autosearch.scoring import Reward
from autosearch.space import SearchSpace
from autosearch.study import progress, rebuild, records, results, workers
from autosearch.study.artifacts import Artifacts, location_of, opened_location
from autosearch.study.claims import Claims, heartbeat_settings
from autosearch.study.definition import (
    StudyDefinition,
    read_definition,
    resolve_components,
    store_definition,
    study_uid,
    trial_seed,
)
from autosearch.study.executors import Executor
from autosearch.study.loop import EpochCallback, SearchLoop, TrialCallback, check_run
from autosearch.study.records import Record, State, UnreadableTrial
from autosearch.study.replay import ControllerReplay
from autosearch.study.supernet_job import SupernetJob
from autosearch.supernet import SubnetEvaluator, SupernetConfig
from autosearch.tabular import Table
from autosearch.train import TrainConfig

__all__ = ["Study", "create_study", "default_storage", "load_study"]

logger = logging.getLogger(__name__)


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
    storage: str | None = None,
    artifacts: str | None = None,
    seed: int = 0,
    table: Table | None = None,
    early_stopping: SuccessiveHalving | None = None,
    supernet: SupernetConfig | None = None,
    load_if_exists: bool = False,
) -> Study:
    """Create a study (or, with ``load_if_exists``, continue the stored one of the same
    name and definition). The arguments are the fields of :class:`autosearch.StudySpec`,
    documented there (a study file declares the same).

    Raises:
        UnknownNameError, ConfigError: an unknown name, or a setting that cannot be used.
        StorageError: an unusable storage URL.
        StudyError: the study exists (without ``load_if_exists``) or is stored with a
            different definition.
    """
    # Every setting is checked before data is read or storage touched: bad input
    # changes nothing stored.
    heartbeat_settings()
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
    )
    dataset = _check_data(space, data, table=table, seed=seed)
    definition = definition.with_data(space, dataset)
    url = storage or default_storage(name)
    # Where weights go, stored with the study: refused here if unusable, before storage.
    definition = dataclasses.replace(definition, artifacts=location_of(artifacts, url, name))
    backend = open_storage(url)
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
    if table is None:
        _make_folder(definition.artifacts)
    return Study(
        name=name,
        url=url,
        storage=backend,
        definition=definition,
        controller=controller,
        data=dataset,
        data_source=None if isinstance(data, str) else data,
    )


def _make_folder(location: str | None) -> None:
    """Create a new study's artifacts folder, so that its other processes find it (they
    never create a stored folder: on a machine without it, that would scatter weights)."""
    if location is None or location.startswith("s3://"):
        return
    try:
        Path(location).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlatformError(
            f"cannot create the artifacts folder {location}: {exc.strerror or exc}; choose a "
            "writable folder with artifacts="
        ) from None


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
    name: str, *, storage: str, data: tuple[Any, Any] | None = None, read_only: bool = False
) -> Study:
    """Open a stored study, rebuilding its space and controller from storage.

    The controller gets its stored state back, then every finished trial it has not
    seen is replayed into it, so ``optimize`` continues where the study stopped.
    A study created from ``(images, labels)`` arrays needs the same arrays again.
    ``read_only``: to read results; opening creates and changes nothing in storage.
    """
    backend = open_storage(storage, create=not read_only)
    try:
        _, definition = read_definition(backend, name, storage)
    except BaseException:
        close_storage(backend)
        raise
    dataset = None
    if data is not None:
        if spec_of(data) != definition.data:
            raise StudyError(
                f"study {name!r} was created from other data ({definition.data}, "
                f"given {spec_of(data)}); pass the arrays it was created from"
            )
        dataset = load_data(data, seed=definition.seed)
    controller = definition.build(where=f"study {name!r} in {storage}")
    study = Study(
        name=name,
        url=storage,
        storage=backend,
        definition=definition,
        controller=controller,
        data=dataset,
        data_source=data,
    )
    study.read_only = read_only
    return study


class Study:
    """A running or stored architecture search. Make one with create_study / load_study."""

    def __init__(
        self,
        *,
        name: str,
        url: str,
        storage: BaseStorage,
        definition: StudyDefinition,
        controller: Controller,
        data: Dataset | None,
        data_source: tuple[Any, Any] | None = None,
    ) -> None:
        self.name = name
        self.storage_url = url
        self.storage = storage
        self.definition = definition
        self.space: SearchSpace = controller.space
        self.controller = controller
        self.data_source = data_source  # (images, labels) a study from arrays was given
        self.worker_attrs: dict[str, Any] = {}  # added to every trial this process starts
        # The signal that stopped the last optimize() (SIGTERM: it returned early), if any.
        self.interrupted: str | None = None
        self.read_only = False  # opened to read (load_study(read_only=True)): runs nothing
        self._dataset = data
        self._study_id = storage.get_study_id_from_name(name)
        self._decoded: dict[int, list[Record]] = {}  # finished trials never change
        self.unreadable: dict[int, str] = {}  # stored trials left out: number -> why
        self.heartbeat_interval, self.heartbeat_grace = heartbeat_settings()
        uid = study_uid(storage, self._study_id)
        self.artifacts = Artifacts.at(opened_location(definition.artifacts, url, name), uid)
        self.claims = Claims(storage, self._study_id, self.space, grace=self.heartbeat_grace)
        self.replay = ControllerReplay(controller, storage, self._study_id, self.objectives)
        self.replay.restore()
        self.supernet_job = (
            None
            if definition.supernet is None
            else SupernetJob(
                study=name,
                storage=storage,
                study_id=self._study_id,
                uid=uid,
                config=definition.supernet,
                train=definition.train,
                seed=definition.seed,
                space=self.space,
                artifacts=self.artifacts,
                heartbeat=(self.heartbeat_interval, self.heartbeat_grace),
            )
        )

    # The definition, typed ------------------------------------------------------------
    @property
    def objectives(self) -> tuple[str, ...]:
        return self.definition.objectives

    @property
    def reward(self) -> Reward:
        return self.definition.reward

    @property
    def variants(self) -> tuple[VariantSpec, ...]:
        return self.definition.variants

    @property
    def compression(self) -> Compression:
        return self.definition.compression

    @property
    def train_config(self) -> TrainConfig:
        return self.definition.train

    @property
    def seed(self) -> int:
        return self.definition.seed

    @property
    def table(self) -> Table | None:
        return self.definition.table

    @property
    def early_stopping(self) -> SuccessiveHalving | None:
        return self.definition.early_stopping

    @property
    def supernet(self) -> SupernetConfig | None:
        """How the study's supernet is trained and evaluated (None: trials train)."""
        return self.definition.supernet

    @property
    def data_report(self) -> Mapping[str, Any] | None:
        """The cleaning report stored when the study was created (None for tables)."""
        return self.definition.data_report

    @property
    def reward_name(self) -> str:
        return str(self.definition.reward)

    @property
    def artifacts_dir(self) -> Path:
        return self.artifacts.folder

    # Data ---------------------------------------------------------------------------------
    @property
    def data(self) -> Dataset:
        if self._dataset is None:
            if self.definition.data.startswith("arrays:"):
                raise StudyError(
                    f"study {self.name!r} was created from arrays; pass them again: "
                    "autosearch.load_study(name, storage=..., data=(images, labels))"
                )
            self._dataset = load_data(self.definition.data, seed=self.seed)
        return self._dataset

    @property
    def training_data(self) -> Dataset | None:
        """What trials train on (None: a table study looks results up instead)."""
        return None if self.table is not None else self.data

    @cached_property
    def data_hash(self) -> str | None:
        """Content hash of the data every trial trains on (None for table studies)."""
        return None if self.table is not None else self.data.content_hash()

    # Reading ------------------------------------------------------------------------------
    @property
    def optuna_study(self) -> optuna.Study:
        """The underlying Optuna study (same storage), for Optuna's own tools."""
        return optuna.load_study(study_name=self.name, storage=self.storage)

    def optuna_trials(self) -> list[FrozenTrial]:
        return self.storage.get_all_trials(self._study_id, deepcopy=False)

    def decode(self, trial: FrozenTrial) -> list[Record]:
        """A stored trial's records (see records.decode); an unreadable trial is logged
        and left out."""
        if trial.number in self._decoded:
            return self._decoded[trial.number]
        try:
            decoded = records.decode(trial, self.objectives)
        except UnreadableTrial as exc:
            if trial.number not in self.unreadable:
                logger.warning("left out of study %s: %s", self.name, exc)
            self.unreadable[trial.number] = str(exc)
            decoded = []
        if trial.state.is_finished():
            self._decoded[trial.number] = decoded
        return decoded

    def records(self, *, variants: bool = True) -> list[Record]:
        """Every trial of the study as Records, in trial order: the base record, then
        one per variant (``variants=False``: base records only)."""
        return [r for t in self.optuna_trials() for r in self.decode(t) if variants or r.is_base]

    def record(self, trial: int, variant: str = "base") -> Record:
        """The record of trial number ``trial`` and ``variant``."""
        try:
            found = self.storage.get_trial_id_from_study_id_trial_number(self._study_id, trial)
        except KeyError:
            found = None
        for r in self.decode(self.storage.get_trial(found)) if found is not None else []:
            if r.variant == variant:
                return r
        raise StudyError(
            f"study {self.name!r} has no trial number {trial} with variant {variant!r}"
        )

    def curves(self) -> dict[int, dict[int, float]]:
        """Each trial's validation accuracy after every epoch it trained (learning
        curves; also what early stopping compares)."""
        return {
            t.number: dict(sorted(t.intermediate_values.items()))
            for t in self.optuna_trials()
            if t.intermediate_values and not records.superseded(t)
        }

    def count(self, *states: State) -> int:
        """Trials (not variants) in any of ``states``."""
        return sum(r.state in states for r in self.records(variants=False))

    def pareto(self) -> list[Record]:
        """The complete (architecture, variant) records that no other complete record
        dominates on the study's objectives, ordered by the second objective."""
        return results.front(self.records(), self.objectives)

    def best(
        self,
        *,
        max_flops: float | None = None,
        max_params: float | None = None,
        variants: bool = False,
        variant: str | None = None,
    ) -> Record:
        """The most accurate (validation) complete base record within the given budget
        (``variants=True``: any variant's record; ``variant="int8"``: that variant's
        records only); ties go to fewer FLOPs. The test split plays no part in this
        choice."""
        done = [
            r
            for r in self.records(variants=variants or variant is not None)
            if r.state == "complete" and (variant is None or r.variant == variant)
        ]
        if variant is not None and not done:
            measured = sorted({r.variant for r in self.records() if r.state == "complete"})
            raise StudyError(
                f"study {self.name!r} has no complete {variant!r} record; measured variants: "
                f"{', '.join(measured) or 'none'}"
            )
        return results.best(done, max_flops=max_flops, max_params=max_params, study=self.name)

    # Searching ----------------------------------------------------------------------------
    def plan(self, arch: Architecture, *, number: int = 0, seed: int | None = None) -> TrialPlan:
        """How this study evaluates ``arch`` (as trial ``number``; with its own seed
        unless ``seed`` is given)."""
        d = self.definition
        return TrialPlan(
            space=self.space,
            arch=arch,
            train=d.train,
            seed=trial_seed(d.seed, arch) if seed is None else seed,
            number=number,
            reward=d.reward,
            variants=d.variants,
            compression=d.compression,
            early_stopping=d.early_stopping,
            table=d.table,
            supernet=self.supernet_evaluator if d.supernet else None,
            work=None if d.table or d.supernet else self.artifacts.attempt(arch, number),
        )

    # Weight sharing -------------------------------------------------------------------------
    def train_supernet(
        self, *, retrain: bool = False, show_progress_bar: bool | None = None
    ) -> dict[str, Any]:
        """Train the study's supernet, unless it is trained: a job of the study that one
        worker does (others wait for it; a dead one is taken over), stored in its
        storage (weights as an artifact, with their content hash), resumed from its last
        epoch after a kill, with an epoch bar on a terminal. Under torchrun every rank
        trains (DDP) and rank 0 stores. Returns the job's stored state (epochs, seconds,
        history, digest; {} on the other ranks).

        ``retrain``: train it again if its stored weights are missing or damaged
        (without it, that is a PlatformError that says so).
        """
        state = self._supernet_job().train(
            self.data, retrain=retrain, show_progress_bar=show_progress_bar
        )
        return state.to_json() if state is not None else {}

    @cached_property
    def supernet_evaluator(self) -> SubnetEvaluator:
        """What the study's trials are scored with: its trained supernet (StudyError
        while it is not trained; PlatformError when its weights are lost or changed)."""
        return self._supernet_job().evaluator(self.data)

    def save_supernet(self, path: str | Path) -> Path:
        """Write the trained supernet's weights (to a file, or ``supernet.safetensors``
        in a folder), for another study of the same supernet (another budget:
        ``SupernetConfig(weights=path)``) to use without training."""
        return self._supernet_job().export_weights(self.data, path)  # type: ignore[no-any-return]

    def _supernet_job(self) -> SupernetJob:
        if self.supernet_job is None:
            raise StudyError(f"study {self.name!r} has no supernet (create it with supernet=...)")
        return self.supernet_job

    def optimize(
        self,
        n_trials: int,
        *,
        callbacks: Iterable[TrialCallback] = (),
        max_failures_in_a_row: int = 10,
        epoch_callbacks: Iterable[EpochCallback] = (),
        n_workers: int = 1,
        show_progress_bar: bool | None = None,
        executor: str | Executor = "process",
    ) -> list[Record]:
        """Evaluate ``n_trials`` new architectures; return their records.

        ``callbacks`` are called with each finished trial's record; ``epoch_callbacks``
        with ``(trial number, EpochResult)`` after every training epoch. A failing trial
        is stored as failed with its reason and the search goes on;
        ``max_failures_in_a_row`` failures in a row stop it with a StudyError, since
        that points at the setup rather than at the architectures.

        On a terminal (or with ``show_progress_bar=True``) a bar shows the trials and
        one the current trial's epochs; every finished trial is logged. With
        ``n_workers=K``, K processes share the trials (and the CPU threads and GPUs),
        each controller on a random stream of its own; ``callbacks`` then run here as
        the workers' trials finish. A trial whose worker died (no heartbeat for the
        grace period) resumes from its last checkpoint on the next claim. Ctrl-C lets
        the epoch's checkpoint finish, marks the trial to resume, then raises
        KeyboardInterrupt (a second Ctrl-C raises it at once); SIGTERM does the same but
        returns, with :attr:`interrupted` set to ``"SIGTERM"``. ``executor`` places
        the workers: ``"process"`` (this machine), ``"ray"`` or a ``RayExecutor``,
        ``"slurm"`` or a ``SlurmExecutor`` (autosearch.study.executors).
        """
        callbacks, epoch_callbacks = list(callbacks), list(epoch_callbacks)
        self.interrupted = None
        if self.read_only and n_trials:
            raise StudyError(
                f"study {self.name!r} was opened read-only; open it with "
                "autosearch.load_study(name, storage=...) to run trials"
            )
        rank, size = world()
        check_run(n_trials, n_workers, max_failures_in_a_row, epoch_callbacks, ranks=size)
        _ = self.training_data  # data that cannot be loaded stops the study here, not in a trial
        if self.table is not None and n_trials:
            self.table.rows()  # so does a table that cannot be read: not every trial failing
        if self.supernet is not None and n_trials:
            _ = self.supernet_evaluator  # an untrained supernet stops the study here
        elif self.table is None and n_trials:
            self.artifacts.check_reachable()  # where weights go, before any worker starts
        if size > 1 and rank != 0:
            return workers.follow(self)  # under torchrun, rank 0 alone drives the search
        epochs = self.train_config.epochs if n_workers == 1 and self.table is None else None
        with progress.bars(n_trials, epochs, show=show_progress_bar) as (trial_bar, epoch_bar):
            if n_workers > 1:
                return workers.run_pool(
                    self,
                    n_trials,
                    n_workers,
                    worker_main=_worker_main,
                    callbacks=callbacks + trial_bar,
                    max_failures_in_a_row=max_failures_in_a_row,
                    executor=executor,
                )
            loop = SearchLoop(
                self,
                callbacks=callbacks + trial_bar,
                epoch_callbacks=epoch_callbacks + epoch_bar,
                max_failures_in_a_row=max_failures_in_a_row,
            )
            try:
                with loop.graceful_interrupts():
                    done = loop.run(n_trials)
            finally:
                if size > 1:
                    broadcast_object(None)  # release the other ranks
        self.interrupted = loop.signal
        if loop.signal == "SIGINT":  # the checkpoint is written: now Ctrl-C interrupts
            raise KeyboardInterrupt
        return done

    def rerun(self, trial: int) -> dict[str, Any]:
        """Train trial ``trial``'s architecture again, from scratch, with its stored seed
        and the study's data and training config (nothing is stored), and compare: see
        autosearch.study.rebuild.rerun."""
        return rebuild.rerun(self, trial)

    def export(self, record: Record, out_dir: str | Path, *, finetune_epochs: int = 0) -> Path:
        """Write an export folder of ``record`` (``model.py``, weights, ONNX checked in
        onnxruntime, ``arch.json``, a README); a variant is derived again from its
        trial's weights; a supernet-evaluated subnet, with its inherited weights,
        fine-tuned for ``finetune_epochs`` first if asked: see
        autosearch.study.rebuild.export."""
        return rebuild.export(self, record, out_dir, finetune_epochs=finetune_epochs)

    def load_model(self, record: Record) -> nn.Module:
        """The trained network of a complete base record, in eval mode."""
        return rebuild.load_model(self, record)

    def optuna_trial(self, number: int) -> FrozenTrial:
        """The stored Optuna trial number ``number``."""
        return self.storage.get_trial(
            self.storage.get_trial_id_from_study_id_trial_number(self._study_id, number)
        )


def _worker_main(
    *,
    name: str,
    storage: str,
    data: Any,
    n_trials: int,
    worker: int,
    run: str,
    trials_before: int | None = None,
    max_failures_in_a_row: int,
) -> list[int]:
    """One process of ``optimize(n_workers=K)``: the numbers of the trials it finished."""
    study = load_study(name, storage=storage, data=data)
    # The pool's parent logs each finished trial; a worker logging it too would say it twice.
    logging.getLogger(progress.__name__).setLevel(logging.WARNING)
    owed = workers.start_worker(
        study, str(worker), run=run, share=n_trials, trials_before=trials_before
    )
    done = study.optimize(
        owed or 0, max_failures_in_a_row=max_failures_in_a_row, show_progress_bar=False
    )
    return [r.trial for r in done]
