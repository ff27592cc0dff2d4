"""The study facade: create or open a study, run it, read its results, export one. The
storage is the single source of truth; the package docstring maps each concern
(definition, records, claims, replay, loop, workers, artifacts) to its file."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import torch.nn as nn
from optuna.storages import BaseStorage

from autosearch.architecture import Architecture
from autosearch.controller import Controller
from autosearch.data import Dataset
from autosearch.errors import StudyError
from autosearch.evaluation.ranker import RankerConfig
from autosearch.evaluation.supernet import SubnetEvaluator
from autosearch.evaluation.trial import TrialPlan
from autosearch.space import SearchSpace
from autosearch.study import progress, results
from autosearch.study._typed import DefinitionView, TrackingView, TrialsView
from autosearch.study.claims import Claims
from autosearch.study.dataset import StudyData
from autosearch.study.definition import StudyDefinition
from autosearch.study.jobs import Jobs
from autosearch.study.loop import EpochCallback, RecordCallback, SearchLoop, SearchParts, check_run
from autosearch.study.measure import FrontMeasurer
from autosearch.study.overlays import is_estimated
from autosearch.study.plans import Planner
from autosearch.study.population.rules import PopulationBasedTraining
from autosearch.study.population.study import train_as_population
from autosearch.study.rebuild import Rebuilder
from autosearch.study.records import Record
from autosearch.study.replay import ControllerReplay
from autosearch.study.storage.artifacts import Artifacts, opened_location
from autosearch.study.storage.stored import open_stored, study_uid
from autosearch.study.storage.sweep import sweep
from autosearch.study.supernet.confirm import (
    Confirmation,
    Confirmer,
    Estimate,
    confirmations,
    ranker_config,
)
from autosearch.study.supernet.job import SupernetJob
from autosearch.study.trials import StoredTrials
from autosearch.study.workers import pool
from autosearch.study.workers._failpoints import check_armed
from autosearch.study.workers._heartbeat import heartbeat_settings
from autosearch.study.workers.executors import Executor, ProcessExecutor, resolve_executor
from autosearch.training.runtime import broadcast_object, world

__all__ = ["Study", "TrialCallback"]

logger = logging.getLogger(__name__)

TrialCallback = Callable[["Study", Record], None]  # called as each trial finishes


class Study(DefinitionView, TrialsView, TrackingView):
    """A running or stored architecture search. Make one with create_study / load_study.

    The facade over the study's parts, each of which reads only what it is given: the
    stored trials (:attr:`trials`), the claims, the controller's replay, the artifacts,
    the data, how trials are planned, the supernet's job, and the rebuild of a trial."""

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
        self.name, self.storage_url, self.storage = name, url, storage
        self.definition = definition
        self.space: SearchSpace = controller.space
        self.controller = controller
        self.data_source = data_source  # (images, labels) a study from arrays was given
        self.worker_attrs: dict[str, Any] = {}  # added to every trial this process starts
        # The signal that stopped the last optimize() (SIGTERM: it returned early), if any.
        self.interrupted: str | None = None
        self.read_only = False  # opened to read (load_study(read_only=True)): runs nothing
        self._study_id = storage.get_study_id_from_name(name)
        self.heartbeat_interval, self.heartbeat_grace = heartbeat_settings()
        check_armed()  # a misspelt failpoint refused now, not at its first pass
        uid = study_uid(storage, self._study_id)
        self.artifacts = Artifacts.at(opened_location(definition.artifacts, url, name), uid)
        self.inputs = StudyData.of(definition, name=name, source=data_source, loaded=data)
        self.trials = StoredTrials(storage, self._study_id, name=name, objectives=self.objectives)
        self.claims = Claims(storage, self._study_id, self.space, grace=self.heartbeat_grace)
        self.replay = ControllerReplay(controller, storage, self._study_id, self.objectives)
        self.replay.use_scorer(definition, space=self.space, data=lambda: self.inputs.dataset)
        self.replay.restore()
        self._uid = uid
        self.tracker = self._tracker()
        self.supernet_job = self._supernet_job(uid)
        supernet = (lambda: self.supernet_evaluator) if self.supernet_job else None
        parts: dict[str, Any] = {"space": self.space, "artifacts": self.artifacts}
        self.planner = Planner(definition=definition, evaluator=supernet, **parts)
        self.rebuilder = Rebuilder(
            name=name, trials=self.trials, planner=self.planner, data=self.inputs, supernet=supernet
        )
        self.measurer = FrontMeasurer(
            rebuilder=self.rebuilder,
            storage=storage,
            study_id=self._study_id,
            objectives=self.objectives,
            jobs=Jobs(storage, name, grace=self.heartbeat_grace),
            interval=self.heartbeat_interval,
        )

    def _supernet_job(self, uid: str) -> SupernetJob | None:
        if self.definition.supernet is None:
            return None
        job = SupernetJob(
            study=self.name,
            storage=self.storage,
            study_id=self._study_id,
            uid=uid,
            definition=self.definition,
            space=self.space,
            artifacts=self.artifacts,
            heartbeat=(self.heartbeat_interval, self.heartbeat_grace),
        )
        job.on_epoch = self.tracker.supernet_epoch if self.tracker.on else None
        return job

    @classmethod
    def open(
        cls,
        name: str,
        *,
        storage: str,
        data: tuple[Any, Any] | None = None,
        read_only: bool = False,
    ) -> Study:
        """Open a stored study (autosearch.load_study, which documents it)."""
        backend, definition, dataset = open_stored(name, storage, data, read_only=read_only)
        study = cls(
            name=name,
            url=storage,
            storage=backend,
            definition=definition,
            controller=definition.build(where=f"study {name!r} in {storage}"),
            data=dataset,
            data_source=data,
        )
        study.read_only = read_only
        return study

    @property
    def artifacts_dir(self) -> Path:
        return self.artifacts.folder

    # Data ---------------------------------------------------------------------------------
    @property
    def data(self) -> Dataset:
        return self.inputs.dataset

    @property
    def training_data(self) -> Dataset | None:
        """What trials train on (None: a table study looks results up instead)."""
        return self.inputs.training

    @property
    def data_hash(self) -> str | None:
        """Content hash of the data every trial trains on (None for table studies)."""
        return self.inputs.hash

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
        choice. A choice whose figures are estimates is measured first (and the choice
        made again, on the measured figures). Confirmed subnets (:meth:`confirm`) come
        first: a supernet study's inherited figures only where none fits."""
        for _ in range(20):
            chosen = results.best(
                self.records(variants=variants or variant is not None),
                max_flops=max_flops,
                max_params=max_params,
                variant=variant,
                study=self.name,
                prefer=lambda r: r.confirms is not None,
            )
            if self.read_only or not is_estimated(chosen):
                return chosen
            self.measurer.measure([chosen])
        return chosen

    def measure_front(self) -> list[Record]:
        """The front (:meth:`pareto`), its estimated points measured for real first:
        int8 programs lowered, latency timed (autosearch.study.measure). ``optimize``
        does it when its trials are done."""
        return self.measurer.front()

    # Searching ----------------------------------------------------------------------------
    def plan(self, arch: Architecture, *, number: int = 0, seed: int | None = None) -> TrialPlan:
        """How this study evaluates ``arch`` (as trial ``number``; with its own seed
        unless ``seed`` is given)."""
        return self.planner.plan(arch, number=number, seed=seed)

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
        with self.tracker.supernet():
            state = self._job().train(
                self.data, retrain=retrain, show_progress_bar=show_progress_bar
            )
        return state.to_json() if state is not None else {}

    @cached_property
    def supernet_evaluator(self) -> SubnetEvaluator:
        """What the study's trials are scored with: its trained supernet (StudyError
        while it is not trained; PlatformError when its weights are lost or changed)."""
        return self._job().evaluator(self.data)

    def save_supernet(self, path: str | Path) -> Path:
        """Write the trained supernet's weights (to a file, or ``supernet.safetensors``
        in a folder), for another study of the same supernet (another budget:
        ``SupernetConfig(weights=path)``) to use without training."""
        return self._job().export_weights(self.data, path)  # type: ignore[no-any-return]

    def confirm(
        self,
        k: int,
        *,
        ranker: RankerConfig | bool | None = None,
        population: PopulationBasedTraining | None = None,
        callbacks: Iterable[TrialCallback] = (),
    ) -> list[Record]:
        """Train the ``k`` most accurate subnets of the supernet's front from scratch, as
        trials of the study (autosearch.study.supernet.confirm): each once across workers,
        resumed after a kill or Ctrl-C (SIGTERM returns, :attr:`interrupted` set). Their
        records; :meth:`confirmations` compares inherited and confirmed accuracy, and
        :meth:`best` prefers confirmed subnets. ``ranker`` (True: the study's seed): ``k``
        in all, each chosen where the top is uncertain by a ranker fitted on those
        confirmed before it (:meth:`ranking`), continued alike by a resumed study or
        another worker. ``population``: each trained as that population (its winner)."""
        self._job()  # a study without a supernet has nothing to confirm
        self._check_run(1, 1, [], here=True, max_failures_in_a_row=1)
        confirmer = Confirmer(self._search_parts())
        done = confirmer.confirm(
            k,
            ranker=ranker_config(ranker, seed=self.seed),
            population=population,
            callbacks=[partial(c, self) for c in callbacks],
        )
        self.interrupted = confirmer.signal
        if confirmer.signal == "SIGINT":
            raise KeyboardInterrupt
        return done

    def train_population(
        self, population: PopulationBasedTraining, arch: Architecture | None = None
    ) -> Record | None:
        """Train ``arch`` (default: the best so far) as ``population``, its training
        settings adapted while it trains, as one trial of the study
        (autosearch.study.population.study): once across workers (others asking train
        members beside it), resumed after a kill. Its record; None if SIGTERM cut it."""
        self._check_run(1, 1, [], here=True, max_failures_in_a_row=1)
        chosen = arch if arch is not None else self.best().arch
        record, self.interrupted = train_as_population(self._search_parts(), chosen, population)
        if self.interrupted == "SIGINT":
            raise KeyboardInterrupt
        return record

    def ranking(self, ranker: RankerConfig | bool = True) -> list[Estimate]:
        """Every subnet scored on the supernet, best estimate first, as the ranker of a
        ranked :meth:`confirm` sees it now: fitted on the confirmed subnets (before
        two are, the mean rank of the estimates: supernet accuracy, zero-cost proxies,
        FLOPs, parameters)."""
        self._job()
        config = ranker_config(ranker, seed=self.seed) or RankerConfig(seed=self.seed)
        return Confirmer(self._search_parts()).estimates(config)

    def confirmations(self) -> list[Confirmation]:
        """Each confirmed subnet's inherited against confirmed validation accuracy."""
        return confirmations(self.records(variants=False), self.trials.all())

    def _job(self) -> SupernetJob:
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
        total: int | None = None,
    ) -> list[Record]:
        """Evaluate ``n_trials`` new architectures; return their records.

        ``total``: stop sooner, once the study holds ``total`` search trials (finished or
        running), counting every worker's (``autosearch run`` runs a study file's so).
        ``callbacks`` are called with each finished trial's study and record;
        ``epoch_callbacks`` with ``(trial number, EpochResult)`` after every training
        epoch. A failing trial is stored as failed with its reason and the search goes
        on; ``max_failures_in_a_row`` failures in a row stop it with a StudyError, since
        that points at the setup rather than at the architectures.

        On a terminal (or ``show_progress_bar=True``) bars show the trials and the current
        trial's epochs; every finished trial is logged. ``n_workers=K``: K processes share
        the trials (and CPU threads and GPUs), each controller on a random stream of its
        own; ``callbacks`` run here as their trials finish. A trial whose worker died (no
        heartbeat for the grace period) resumes from its last checkpoint. Ctrl-C lets the
        epoch's checkpoint finish, marks the trial to resume, then raises KeyboardInterrupt
        (a second Ctrl-C at once); SIGTERM does the same but returns, :attr:`interrupted`
        ``"SIGTERM"``. ``executor`` places the workers: ``"process"`` (this machine),
        ``"ray"`` or a ``RayExecutor``, ``"slurm"`` or a ``SlurmExecutor``
        (autosearch.study.workers.executors), which run even one worker there."""
        told = [partial(callback, self) for callback in callbacks]
        epoch_callbacks = list(epoch_callbacks)
        self.interrupted = None
        limits: dict[str, Any] = {"max_failures_in_a_row": max_failures_in_a_row, "total": total}
        here = n_workers == 1 and isinstance(resolve_executor(executor), ProcessExecutor)
        rank, size = self._check_run(n_trials, n_workers, epoch_callbacks, here=here, **limits)
        if size > 1 and rank != 0:
            return pool.follow(self.planner, self.inputs)  # under torchrun, rank 0 searches
        epochs = self.train_config.epochs if here and self.table is None else None
        with progress.bars(n_trials, epochs, show=show_progress_bar) as (trial_bar, epoch_bar):
            if not here:  # one worker of Ray or Slurm runs there, not here
                done = self._pool(n_trials, n_workers, told + trial_bar, executor, **limits)
            else:
                bars = (told + trial_bar, epoch_callbacks + epoch_bar)
                done = self._search(n_trials, *bars, size=size, **limits)
        if self.interrupted is None and not self.read_only:  # also once no claim is left:
            self.claims.tidy()  # dead workers' trials given up,
            self.measurer.jobs.tidy()  # and their job claims,
            self._sweep()  # and what no trial needs any more
        if done and self.interrupted is None:
            self.measurer.front()  # what the front shows is measured, not estimated
            fresh = {(r.trial, r.variant): r for r in self.records()}
            ended = not pool.in_pool(self.worker_attrs)  # the search's own process
            self.tracker.search_ended(done, fresh, self.pareto, ended=ended)
            done = [fresh.get((r.trial, r.variant), r) for r in done]
        return done

    def _sweep(self) -> None:
        """Remove the weights no trial refers to and the checkpoints of finished
        architectures (autosearch.study.storage.sweep), where no trial is unfinished."""
        state = self.supernet_job.stored() if self.supernet_job is not None else None
        kept = [state.weights] if state is not None else []
        sweep(self.artifacts, self.trials.all(), self.measurer.jobs.all_claims(), kept=kept)

    def _search(
        self,
        n_trials: int,
        callbacks: list[RecordCallback],
        epoch_callbacks: list[EpochCallback],
        *,
        size: int,
        **limits: Any,
    ) -> list[Record]:
        """Run ``n_trials`` trials in this process (rank 0 of ``size``), fewer where the
        study reaches its ``total`` (``limits``: SearchLoop's)."""
        loop = SearchLoop(
            self._search_parts(), callbacks=callbacks, epoch_callbacks=epoch_callbacks, **limits
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

    def _check_run(
        self,
        n_trials: int,
        n_workers: int,
        epoch_callbacks: list[EpochCallback],
        *,
        here: bool,
        max_failures_in_a_row: int,
        total: int | None = None,
    ) -> tuple[int, int]:
        """Refuse a run that cannot go, before any trial: (rank, world size)."""
        if self.read_only and n_trials:
            raise StudyError(
                f"study {self.name!r} was opened read-only; open it with "
                "autosearch.load_study(name, storage=...) to run trials"
            )
        rank, size = world()
        limits: dict[str, Any] = {"ranks": size, "total": total, "here": here}
        check_run(n_trials, n_workers, max_failures_in_a_row, epoch_callbacks, **limits)
        _ = self.training_data  # data that cannot be loaded stops the study here, not in a trial
        if self.table is not None and n_trials:
            self.table.rows()  # so does a table that cannot be read: not every trial failing
        if self.supernet is not None and n_trials:
            _ = self.supernet_evaluator  # an untrained supernet stops the study here
        elif self.table is None and n_trials:
            self.artifacts.check_reachable()  # where weights go, before any worker starts
        return rank, size

    def _pool(
        self,
        n_trials: int,
        n_workers: int,
        callbacks: list[RecordCallback],
        executor: str | Executor,
        **limits: Any,
    ) -> list[Record]:
        return pool.run_pool(
            self.trials,
            self.replay,
            storage_url=self.storage_url,
            data_source=self.data_source,
            n_trials=n_trials,
            n_workers=n_workers,
            worker_main=_worker_main,
            callbacks=callbacks,
            executor=executor,
            need=partial(pool.trial_need, self.space, self.train_config, self.training_data),
            **limits,
        )

    def _search_parts(self) -> SearchParts:
        return SearchParts(
            name=self.name, where=self.storage_url, objectives=self.objectives, seed=self.seed,
            trials=self.trials, claims=self.claims, replay=self.replay, artifacts=self.artifacts,
            planner=self.planner, data=self.inputs, teacher=self.rebuilder.teacher,
            heartbeat_interval=self.heartbeat_interval, worker_attrs=self.worker_attrs,
            tracker=self.tracker, uid=self._uid,
        )  # fmt: skip

    def rerun(self, trial: int) -> dict[str, Any]:
        """Train trial ``trial``'s architecture again, from scratch, with its stored seed
        and the study's data and training config (nothing is stored), and compare: see
        autosearch.study.rebuild.Rebuilder.rerun. A supernet's subnet is evaluated again
        on the supernet."""
        return self.rebuilder.rerun(trial)

    def export(self, record: Record, out_dir: str | Path, *, finetune_epochs: int = 0) -> Path:
        """Write an export folder of ``record`` (``model.py``, weights, ONNX checked in
        onnxruntime, ``arch.json``, a README); a variant is derived again from its
        trial's weights; a supernet-evaluated subnet, with its inherited weights,
        fine-tuned for ``finetune_epochs`` first if asked: see
        autosearch.study.rebuild.Rebuilder.export. Estimated figures are measured first."""
        record = self.measurer.measured(record, store=not self.read_only)
        return self.rebuilder.export(record, out_dir, finetune_epochs=finetune_epochs)

    def load_model(self, record: Record) -> nn.Module:
        """The trained network of a complete base record, in eval mode."""
        return self.rebuilder.load_model(record)


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
    total: int | None = None,
) -> list[int]:
    """One process of ``optimize(n_workers=K)``: the numbers of the trials it finished."""
    study = Study.open(name, storage=storage, data=data)
    # The pool's parent logs each finished trial; a worker logging it too would say it twice.
    logging.getLogger(progress.__name__).setLevel(logging.WARNING)
    owed = pool.start_worker(
        study.trials,
        study.replay,
        study.worker_attrs,
        seed=study.seed,
        worker=str(worker),
        run=run,
        share=n_trials,
        trials_before=trials_before,
    )
    options: dict[str, Any] = {"max_failures_in_a_row": max_failures_in_a_row, "total": total}
    return [r.trial for r in study.optimize(owed or 0, show_progress_bar=False, **options)]
