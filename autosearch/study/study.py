"""The study facade: run a stored study, read its results, export one.

:class:`Study` keeps a small surface: what a study is (its name, storage, definition,
space and controller), running it (``optimize``), its results (``trials``, ``records``,
``best``, ``pareto``), and what a user does with one (``export``, ``load_model``,
``rerun``). A feature is reached through its own object: the supernet of a
weight-sharing study (:attr:`Study.supernet`, a :class:`WeightSharing`), the stored
trials (:attr:`Study.trials`), live tracking (``track``, ``log_model``). The parts the
facade composes each read only what they are given, never the facade; the storage is
the single source of truth.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import torch.nn as nn
from optuna.storages import BaseStorage

from autosearch.architecture import Architecture
from autosearch.controller import Controller
from autosearch.data import Dataset
from autosearch.errors import ConfigError, StudyError
from autosearch.evaluation.ranker import RankerConfig
from autosearch.evaluation.user import Evaluator, check_evaluator
from autosearch.population.rules import PopulationBasedTraining
from autosearch.population.trial import train_as_population
from autosearch.space import SearchSpace
from autosearch.storage._urls import StorageTarget, storage_target
from autosearch.storage.artifacts import Artifacts, opened_location
from autosearch.study import progress, results
from autosearch.study.claims import Claims
from autosearch.study.dataset import StudyData
from autosearch.study.definition import StudyDefinition
from autosearch.study.jobs import Jobs
from autosearch.study.leftovers import sweep
from autosearch.study.loop import (
    UNBOUNDED,
    AskedTrial,
    Asker,
    EpochCallback,
    RecordCallback,
    SearchLoop,
    SearchParts,
    check_run,
    check_timeout,
    deadline,
)
from autosearch.study.measure import FrontMeasurer
from autosearch.study.overlays import is_estimated
from autosearch.study.plans import Planner
from autosearch.study.rebuild import Rebuilder
from autosearch.study.records import Record
from autosearch.study.replay import ControllerReplay
from autosearch.study.stored import open_stored, study_uid
from autosearch.study.trials import StoredTrials
from autosearch.tracking import spec as tracking_spec
from autosearch.tracking.spec import Tracking
from autosearch.tracking.tracker import Tracker
from autosearch.training.runtime import broadcast_object, world
from autosearch.weight_sharing.confirm import (
    Confirmation,
    Confirmer,
    Estimate,
    confirmations,
    ranker_config,
)
from autosearch.weight_sharing.job import SupernetJob
from autosearch.weight_sharing.supernet import SubnetEvaluator, SupernetConfig
from autosearch.workers import pool
from autosearch.workers._failpoints import check_armed
from autosearch.workers._heartbeat import heartbeat_settings
from autosearch.workers.executors import Executor, ProcessExecutor, resolve_executor

if TYPE_CHECKING:
    from autosearch.tracking.mlflow_model import LoggedModel

__all__ = ["Study", "TrialCallback", "WeightSharing", "join_as_worker", "open_study"]

logger = logging.getLogger(__name__)

TrialCallback = Callable[["Study", Record], None]  # called as each trial finishes


class Study:
    """A running or stored architecture search. Make one with create_study / load_study.

    Attributes:
        name: The study's name in its storage.
        storage_url: Where it is stored.
        definition: What it searches, how it trains and scores (the stored, frozen
            :class:`~autosearch.study.definition.StudyDefinition`: ``objectives``,
            ``reward``, ``variants``, ``train``, ``seed``, ``table``, ...).
        space: Its search space.
        controller: Its controller, in step with the stored results.
        trials: Its stored trials, read (Optuna's trials, records, curves, counts).
        supernet: Its supernet (:class:`WeightSharing`), where it searches by weight
            sharing; None where every candidate trains.
        interrupted: The signal that stopped the last run (``"SIGTERM"``: it returned
            early), if any.
    """

    def __init__(
        self,
        *,
        name: str,
        url: str,
        storage: BaseStorage,
        definition: StudyDefinition,
        target: StorageTarget | None = None,
        evaluator: Evaluator | None = None,
        controller: Controller,
        data: Dataset | None,
        data_source: tuple[Any, Any] | None = None,
        read_only: bool = False,
    ) -> None:
        self.name = name
        self.storage_url = url
        self._target = target or StorageTarget(url)  # what its workers open again
        self._evaluator = _checked_evaluator(name, definition, evaluator)
        self._asker: Asker | None = None  # ask and tell, made on the first ask
        self.definition = definition
        self.space: SearchSpace = controller.space
        self.controller = controller
        self.interrupted: str | None = None
        self._storage = storage
        self._read_only = read_only  # opened to read (load_study(read_only=True)): runs nothing
        self._data_source = data_source  # (images, labels) a study from arrays was given
        self._worker_attrs: dict[str, Any] = {}  # added to every trial this process starts
        self._study_id = storage.get_study_id_from_name(name)
        self._heartbeat = heartbeat_settings()  # (interval, grace) in seconds
        check_armed()  # a misspelt failpoint refused now, not at its first pass
        self._uid = study_uid(storage, self._study_id)
        self._artifacts = Artifacts.at(opened_location(definition.artifacts, url, name), self._uid)
        self._inputs = StudyData.of(definition, name=name, source=data_source, loaded=data)
        objectives = definition.objectives
        self.trials = StoredTrials(storage, self._study_id, name=name, objectives=objectives)
        self._claims = Claims(storage, self._study_id, self.space, grace=self._heartbeat[1])
        self._replay = ControllerReplay(controller, storage, self._study_id, objectives)
        self._replay.use_scorer(definition, space=self.space, data=lambda: self._inputs.dataset)
        self._replay.restore()
        self._tracker = self._make_tracker()
        job = self._supernet_job()
        self.supernet = supernet = WeightSharing(self, job) if job is not None else None
        subnets = (lambda: supernet.evaluator) if supernet is not None else None
        self._planner = Planner(
            definition=definition,
            evaluator=subnets,
            space=self.space,
            artifacts=self._artifacts,
            user_evaluator=self._evaluator,
        )
        self._rebuilder = Rebuilder(
            name=name, trials=self.trials, planner=self._planner, data=self._inputs,
            supernet=subnets,
        )  # fmt: skip
        self._measurer = FrontMeasurer(
            rebuilder=self._rebuilder,
            storage=storage,
            study_id=self._study_id,
            objectives=objectives,
            jobs=Jobs(storage, name, grace=self._heartbeat[1]),
            interval=self._heartbeat[0],
        )

    def _supernet_job(self) -> SupernetJob | None:
        if self.definition.supernet is None:
            return None
        job = SupernetJob(
            study=self.name,
            storage=self._storage,
            study_id=self._study_id,
            uid=self._uid,
            definition=self.definition,
            space=self.space,
            artifacts=self._artifacts,
            heartbeat=self._heartbeat,
        )
        job.on_epoch = self._tracker.supernet_epoch if self._tracker.on else None
        return job

    # What it holds ------------------------------------------------------------------------
    @property
    def data(self) -> Dataset:
        """The study's data (loaded when first asked for)."""
        return self._inputs.dataset

    @property
    def optuna_study(self) -> optuna.Study:
        """The underlying Optuna study (same storage), for Optuna's own tools."""
        return optuna.load_study(study_name=self.name, storage=self._storage)

    def records(self, *, variants: bool = True) -> list[Record]:
        """Every trial of the study as Records, in trial order: the base record, then
        one per variant (``variants=False``: base records only)."""
        return self.trials.records(variants=variants)

    def records_dataframe(self, *, variants: bool = True, multi_index: bool = False) -> Any:
        """The records as a pandas DataFrame (pandas is optional): a row per (trial,
        variant), a ``params_GENE`` column per gene and a ``metrics_NAME`` column per
        figure, as Optuna's ``trials_dataframe`` lays out a study
        (autosearch.study.results.table)."""
        return results.table(self.records(variants=variants), multi_index=multi_index)

    def record(self, trial: int, variant: str = "base") -> Record:
        """The record of trial number ``trial`` and ``variant``."""
        return self.trials.record(trial, variant)

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
        made again, on the measured figures). Confirmed subnets
        (:meth:`WeightSharing.confirm`) come first: a supernet study's inherited
        figures only where none fits."""
        for _ in range(20):
            chosen = results.best(
                self.records(variants=variants or variant is not None),
                max_flops=max_flops,
                max_params=max_params,
                variant=variant,
                study=self.name,
                prefer=lambda r: r.confirms is not None,
            )
            if self._read_only or not is_estimated(chosen):
                return chosen
            self._measurer.measure([chosen])
        return chosen

    def pareto(self, *, measured: bool = False) -> list[Record]:
        """The complete (architecture, variant) records that no other complete record
        dominates on the study's objectives, ordered by the second objective.
        ``measured``: its estimated points measured for real first (int8 programs
        lowered, latency timed: autosearch.study.measure), as ``optimize`` does when its
        trials are done."""
        if measured:
            return self._measurer.front()
        return results.front(self.records(), self.trials.objectives)

    # Running ------------------------------------------------------------------------------
    def optimize(
        self,
        n_trials: int | None = None,
        *,
        timeout: float | None = None,
        callbacks: Iterable[TrialCallback] = (),
        max_failures_in_a_row: int = 10,
        epoch_callbacks: Iterable[EpochCallback] = (),
        n_workers: int = 1,
        show_progress_bar: bool | None = None,
        executor: str | Executor = "process",
        total: int | None = None,
    ) -> list[Record]:
        """Evaluate ``n_trials`` new architectures; return their records.

        ``timeout``: a time budget in seconds: no trial starts after it (one running then
        finishes, and every worker of a pool keeps the same end); with ``n_trials`` too,
        whichever comes first ends the run; alone, trials run until it is spent.
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
        (autosearch.workers.executors), which run even one worker there."""
        check_timeout(timeout)
        bounded = n_trials is not None
        if n_trials is None:
            if timeout is None:
                raise ConfigError("give optimize n_trials, a timeout in seconds, or both")
            n_trials = UNBOUNDED  # the time budget ends the run
        end = deadline(timeout)
        told = [partial(callback, self) for callback in callbacks]
        epoch_callbacks = list(epoch_callbacks)
        self.interrupted = None
        limits: dict[str, Any] = {"max_failures_in_a_row": max_failures_in_a_row, "total": total}
        here = n_workers == 1 and isinstance(resolve_executor(executor), ProcessExecutor)
        rank, size = self._check_run(n_trials, n_workers, epoch_callbacks, here=here, **limits)
        limits["deadline"] = end
        if size > 1 and rank != 0:
            return pool.follow(self._planner, self._inputs)  # under torchrun, rank 0 searches
        table = self.definition.table
        epochs = self.definition.train.epochs if here and table is None else None
        shown = progress.bars(n_trials, epochs, show=show_progress_bar, bounded=bounded)
        with shown as (trial_bar, epoch_bar):
            if not here:  # one worker of Ray or Slurm runs there, not here
                done = self._pool(n_trials, n_workers, told + trial_bar, executor, **limits)
            else:
                bars = (told + trial_bar, epoch_callbacks + epoch_bar)
                done = self._search(n_trials, *bars, size=size, **limits)
        if self.interrupted is None and not self._read_only:  # also once no claim is left:
            self._claims.tidy()  # dead workers' trials given up,
            self._measurer.jobs.tidy()  # and their job claims,
            self._sweep()  # and what no trial needs any more
        if done and self.interrupted is None:
            self._measurer.front()  # what the front shows is measured, not estimated
            fresh = {(r.trial, r.variant): r for r in self.records()}
            ended = not pool.in_pool(self._worker_attrs)  # the search's own process
            self._tracker.search_ended(done, fresh, self.pareto, ended=ended)
            done = [fresh.get((r.trial, r.variant), r) for r in done]
        return done

    def train_population(
        self, population: PopulationBasedTraining, arch: Architecture | None = None
    ) -> Record | None:
        """Train ``arch`` (default: the best so far) as ``population``, its training
        settings adapted while it trains, as one trial of the study
        (autosearch.population.trial): once across workers (others asking train
        members beside it), resumed after a kill. Its record; None if SIGTERM cut it."""
        if self.definition.evaluator:
            raise ConfigError(
                f"study {self.name!r} trains with evaluator {self.definition.evaluator}; a "
                "population trains with autosearch's trainer: train one of its "
                "architectures as a population in a study without an evaluator"
            )
        self._check_run(1, 1, [], here=True, max_failures_in_a_row=1)
        chosen = arch if arch is not None else self.best().arch
        record, self.interrupted = train_as_population(self._search_parts(), chosen, population)
        if self.interrupted == "SIGINT":
            raise KeyboardInterrupt
        return record

    def ask(self) -> AskedTrial:
        """The next candidate for a loop of your own (as Optuna's ``study.ask()``): claimed
        as ``optimize`` claims it and held until :meth:`tell` (autosearch.study.loop);
        ``trial.build()`` makes its network, ``trial.report(epoch, accuracy)`` records
        its curve and says whether early stopping would stop it."""
        if self._read_only:
            raise StudyError(
                f"study {self.name!r} was opened read-only; open it with "
                "autosearch.load_study(name, storage=...) to ask for trials"
            )
        if self.supernet is not None:
            raise ConfigError(
                f"study {self.name!r} scores its candidates on its supernet; ask and tell "
                "run them in your own loop: use a study without supernet="
            )
        return self._asking().ask()

    def tell(
        self,
        trial: AskedTrial,
        figures: Mapping[str, float] | None = None,
        *,
        model: nn.Module | None = None,
        failed: str | None = None,
        stopped: bool = False,
    ) -> Record | None:
        """Store a trial :meth:`ask` gave: its ``figures`` (at least ``"accuracy"``), the
        trained ``model`` if you have it (its weights stored, its costs measured; else
        counted from the architecture), or ``failed="the reason"``; ``stopped``: ended
        early. The controller learns from it as from any trial. Its record (None where
        another worker took the trial over meanwhile)."""
        return self._asking().tell(trial, figures, model=model, failed=failed, stopped=stopped)

    def _asking(self) -> Asker:
        if self._asker is None:
            loop = SearchLoop(
                self._search_parts(), callbacks=[], epoch_callbacks=[], max_failures_in_a_row=1
            )
            data = self._inputs.training if self.definition.table is None else None
            self._asker = Asker(loop, data, self._heartbeat[0])
        return self._asker

    # What a user does with a result --------------------------------------------------------
    def export(self, record: Record, out_dir: str | Path, *, finetune_epochs: int = 0) -> Path:
        """Write an export folder of ``record`` (``model.py``, weights, ONNX checked in
        onnxruntime, ``arch.json``, a README); a variant is derived again from its
        trial's weights; a supernet-evaluated subnet, with its inherited weights,
        fine-tuned for ``finetune_epochs`` first if asked: see
        autosearch.study.rebuild.Rebuilder.export. Estimated figures are measured first."""
        record = self._measurer.measured(record, store=not self._read_only)
        return self._rebuilder.export(record, out_dir, finetune_epochs=finetune_epochs)

    def load_model(self, record: Record) -> nn.Module:
        """The trained network of a complete base record, in eval mode."""
        return self._rebuilder.load_model(record)

    def rerun(self, trial: int) -> dict[str, Any]:
        """Train trial ``trial``'s architecture again, from scratch, with its stored seed
        and the study's data and training config (nothing is stored), and compare: see
        autosearch.study.rebuild.Rebuilder.rerun. A supernet's subnet is evaluated again
        on the supernet."""
        return self._rebuilder.rerun(trial)

    # Shown live ---------------------------------------------------------------------------
    @property
    def tracking(self) -> Tracking:
        """Where the study is shown live (MLflow, TensorBoard), as stored with it."""
        return self._tracker.tracking

    def track(
        self, *, mlflow: str | bool | None = None, tensorboard: str | Path | bool | None = None
    ) -> Tracking:
        """Show the study live in MLflow (a tracking URI; True: MLflow's default) and/or
        TensorBoard (a folder), from every process that runs its trials from now on
        (stored with the study; a process already running keeps what it read). None
        keeps a setting, False switches it off. See autosearch.tracking."""
        tracking = self.tracking.changed(mlflow=mlflow, tensorboard=tensorboard)
        tracking.check_apart(self.storage_url)
        if tracking != self.tracking:
            tracking_spec.store(self._storage, self._study_id, tracking)
            self._tracker.close()
            self._tracker = self._make_tracker(tracking)
            if self.supernet is not None:
                on_epoch = self._tracker.supernet_epoch if tracking.on else None
                self.supernet._job.on_epoch = on_epoch
        return tracking

    def log_model(
        self, folder: str | Path, *, mlflow: str | bool = True, register: str | None = None
    ) -> LoggedModel:
        """Log an export folder (written by ``export``) as an MLflow model, in the run
        of its trial where the study was tracked when it ran: ``mlflow`` a tracking URI,
        or True for where the study is tracked (else MLflow's default); registered as
        ``register`` in MLflow's model registry if given. See
        autosearch.tracking.mlflow_model."""
        from autosearch.tracking.mlflow_model import log_export

        uri: str | None
        if mlflow is True and self.tracking.mlflow:
            uri = self.tracking.mlflow
        else:
            uri = Tracking.of(mlflow=mlflow).mlflow
        if uri is None:
            raise ConfigError("log_model(mlflow=False): give a tracking URI, or True")
        Tracking(mlflow=uri).check_apart(self.storage_url)
        return log_export(folder, uri=uri, study=self.name, uid=self._uid, register=register)

    # The parts ----------------------------------------------------------------------------
    def _make_tracker(self, tracking: Tracking | None = None) -> Tracker:
        tracking = tracking or tracking_spec.stored(self._storage, self._study_id)
        return Tracker(tracking, study=self.name, uid=self._uid, definition=self.definition)

    def _sweep(self) -> None:
        """Remove the weights no trial refers to and the checkpoints of finished
        architectures (autosearch.study.leftovers), where no trial is unfinished."""
        state = self.supernet._job.stored() if self.supernet is not None else None
        kept = [state.weights] if state is not None else []
        sweep(self._artifacts, self.trials.all(), self._measurer.jobs.all_claims(), kept=kept)

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
        if self._read_only and n_trials:
            raise StudyError(
                f"study {self.name!r} was opened read-only; open it with "
                "autosearch.load_study(name, storage=...) to run trials"
            )
        if n_trials and self.definition.evaluator and self._evaluator is None:
            raise ConfigError(self._evaluator_missing())
        rank, size = world()
        limits: dict[str, Any] = {"ranks": size, "total": total, "here": here}
        check_run(n_trials, n_workers, max_failures_in_a_row, epoch_callbacks, **limits)
        _ = self._inputs.training  # data that cannot be loaded stops the study here
        table = self.definition.table
        if table is not None and n_trials:
            table.rows()  # so does a table that cannot be read: not every trial failing
        if self.supernet is not None and n_trials:
            _ = self.supernet.evaluator  # an untrained supernet stops the study here
        elif table is None and n_trials:
            self._artifacts.check_reachable()  # where weights go, before any worker starts
        return rank, size

    def _evaluator_missing(self) -> str:
        name = self.definition.evaluator or ""
        return (
            f"study {self.name!r} trains its candidates with evaluator {name}: give it "
            f"(load_study(..., evaluator={name.split(':')[-1]}), or `autosearch worker "
            f"--evaluator {name}`) to run trials"
        )

    def _pool(
        self,
        n_trials: int,
        n_workers: int,
        callbacks: list[RecordCallback],
        executor: str | Executor,
        **limits: Any,
    ) -> list[Record]:
        need = partial(pool.trial_need, self.space, self.definition.train, self._inputs.training)
        return pool.run_pool(
            self.trials,
            self._replay,
            storage=self._target,
            data_source=self._data_source,
            n_trials=n_trials,
            n_workers=n_workers,
            worker_main=_worker_main,
            callbacks=callbacks,
            executor=executor,
            need=need,
            evaluator=self._evaluator,
            **limits,
        )

    def _search_parts(self) -> SearchParts:
        definition = self.definition
        return SearchParts(
            name=self.name, where=self.storage_url, objectives=definition.objectives,
            seed=definition.seed, trials=self.trials, claims=self._claims,
            replay=self._replay, artifacts=self._artifacts, planner=self._planner,
            data=self._inputs, teacher=self._rebuilder.teacher,
            heartbeat_interval=self._heartbeat[0], worker_attrs=self._worker_attrs,
            tracker=self._tracker, uid=self._uid,
        )  # fmt: skip


class WeightSharing:
    """A weight-sharing study's supernet (:attr:`Study.supernet`): trained once, as a job
    of the study that one worker does; every trial scored on it; its front confirmed by
    training, where a ranker may choose what to train (autosearch.weight_sharing)."""

    def __init__(self, study: Study, job: SupernetJob) -> None:
        self._study, self._job = study, job

    @property
    def config(self) -> SupernetConfig:
        """How the supernet is trained and its subnets evaluated."""
        config = self._study.definition.supernet
        assert config is not None  # a study with a supernet job has its config
        return config

    def train(
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
        study = self._study
        with study._tracker.supernet():
            state = self._job.train(
                study.data, retrain=retrain, show_progress_bar=show_progress_bar
            )
        return state.to_json() if state is not None else {}

    @cached_property
    def evaluator(self) -> SubnetEvaluator:
        """What the study's trials are scored with: its trained supernet (StudyError
        while it is not trained; PlatformError when its weights are lost or changed)."""
        return self._job.evaluator(self._study.data)

    def save(self, path: str | Path) -> Path:
        """Write the trained supernet's weights (to a file, or ``supernet.safetensors``
        in a folder), for another study of the same supernet (another budget:
        ``SupernetConfig(weights=path)``) to use without training."""
        return self._job.export_weights(self._study.data, path)  # type: ignore[no-any-return]

    def confirm(
        self,
        k: int,
        *,
        ranker: RankerConfig | bool | None = None,
        population: PopulationBasedTraining | None = None,
        callbacks: Iterable[TrialCallback] = (),
    ) -> list[Record]:
        """Train the ``k`` most accurate subnets of the supernet's front from scratch, as
        trials of the study (autosearch.weight_sharing.confirm): each once across
        workers, resumed after a kill or Ctrl-C (SIGTERM returns, the study's
        ``interrupted`` set). Their records; :meth:`confirmations` compares inherited and
        confirmed accuracy, and ``Study.best`` prefers confirmed subnets. ``ranker``
        (True: the study's seed): ``k`` in all, each chosen where the top is uncertain
        by a ranker fitted on those confirmed before it (:meth:`ranking`), continued
        alike by a resumed study or another worker. ``population``: each trained as
        that population (its winner)."""
        study = self._study
        study._check_run(1, 1, [], here=True, max_failures_in_a_row=1)
        confirmer = Confirmer(study._search_parts())
        done = confirmer.confirm(
            k,
            ranker=ranker_config(ranker, seed=study.definition.seed),
            population=population,
            callbacks=[partial(c, study) for c in callbacks],
        )
        study.interrupted = confirmer.signal
        if confirmer.signal == "SIGINT":
            raise KeyboardInterrupt
        return done

    def ranking(self, ranker: RankerConfig | bool = True) -> list[Estimate]:
        """Every subnet scored on the supernet, best estimate first, as the ranker of a
        ranked :meth:`confirm` sees it now: fitted on the confirmed subnets (before
        two are, the estimates' log ranks summed: supernet accuracy, zero-cost proxies,
        FLOPs, parameters)."""
        seed = self._study.definition.seed
        config = ranker_config(ranker, seed=seed) or RankerConfig(seed=seed)
        return Confirmer(self._study._search_parts()).estimates(config)

    def confirmations(self) -> list[Confirmation]:
        """Each confirmed subnet's inherited against confirmed validation accuracy."""
        study = self._study
        return confirmations(study.records(variants=False), study.trials.all())


def open_study(
    name: str,
    *,
    storage: str | BaseStorage | StorageTarget,
    data: tuple[Any, Any] | None = None,
    read_only: bool = False,
    evaluator: Evaluator | None = None,
) -> Study:
    """Open a stored study (autosearch.load_study, which documents it)."""
    target = storage_target(storage)
    backend, definition, dataset = open_stored(name, target, data, read_only=read_only)
    storage = target.url
    return Study(
        name=name,
        url=storage,
        target=target,
        storage=backend,
        definition=definition,
        controller=definition.build(where=f"study {name!r} in {storage}"),
        data=dataset,
        data_source=data,
        read_only=read_only,
        evaluator=evaluator,
    )


def _checked_evaluator(
    name: str, definition: StudyDefinition, evaluator: Evaluator | None
) -> Evaluator | None:
    """The evaluator a study is opened with, if it is the one it was created with.

    Raises:
        ConfigError: one given to a study of the built-in trainer, or another than its
            own (by import path).
    """
    if evaluator is None:
        return None
    given = check_evaluator(evaluator)
    stored = definition.evaluator
    if stored is None:
        raise ConfigError(
            f"study {name!r} trains its candidates with autosearch's trainer; it was not "
            f"created with an evaluator (given {given})"
        )
    if given != stored:
        raise ConfigError(
            f"study {name!r} trains its candidates with evaluator {stored}, not {given}: "
            "give it the evaluator it was created with"
        )
    return evaluator


def join_as_worker(study: Study, worker: str) -> None:
    """Make this process one of the study's several workers: its controller on a random
    stream of its own, its trials marked with the worker (``autosearch worker``)."""
    pool.start_worker(
        study.trials, study._replay, study._worker_attrs, seed=study.definition.seed,
        worker=worker,
    )  # fmt: skip


def _worker_main(
    *,
    name: str,
    storage: str | StorageTarget,
    data: Any,
    n_trials: int,
    worker: int,
    run: str,
    trials_before: int | None = None,
    max_failures_in_a_row: int,
    total: int | None = None,
    deadline: float | None = None,
    evaluator: Evaluator | None = None,
) -> list[int]:
    """One process of ``optimize(n_workers=K)``: the numbers of the trials it finished.
    ``deadline``: the pool's time budget's end (time.time()), the same for every worker."""
    if deadline is not None and deadline <= time.time():
        return []  # the budget was spent before this worker started
    study = open_study(name, storage=storage, data=data, evaluator=evaluator)
    # The pool's parent logs each finished trial; a worker logging it too would say it twice.
    logging.getLogger(progress.__name__).setLevel(logging.WARNING)
    owed = pool.start_worker(
        study.trials,
        study._replay,
        study._worker_attrs,
        seed=study.definition.seed,
        worker=str(worker),
        run=run,
        share=n_trials,
        trials_before=trials_before,
    )
    options: dict[str, Any] = {"max_failures_in_a_row": max_failures_in_a_row, "total": total}
    if deadline is not None:
        options["timeout"] = max(deadline - time.time(), 1e-9)
    return [r.trial for r in study.optimize(owed or 0, show_progress_bar=False, **options)]
