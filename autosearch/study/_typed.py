"""What the facade (study.py) shows of a study, typed: the properties of its stored
:class:`StudyDefinition`, its stored trials read as records, and where it is shown
live (its tracking)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

from autosearch.compress import Compression, VariantSpec
from autosearch.errors import ConfigError
from autosearch.evaluation.supernet import SupernetConfig
from autosearch.evaluation.tabular import Table
from autosearch.scoring import Reward
from autosearch.study import results
from autosearch.study.definition import StudyDefinition
from autosearch.study.records import Record, State
from autosearch.study.supernet.job import SupernetJob
from autosearch.study.tracking import spec as tracking_spec
from autosearch.study.tracking.spec import Tracking
from autosearch.study.tracking.tracker import Tracker
from autosearch.study.trials import StoredTrials
from autosearch.training.early_stopping import SuccessiveHalving
from autosearch.training.train import TrainConfig

if TYPE_CHECKING:
    from autosearch.study.tracking.mlflow_model import LoggedModel

__all__ = ["DefinitionView", "TrackingView", "TrialsView"]


class DefinitionView:
    """A study's definition, typed, property by property."""

    definition: StudyDefinition

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


class TrialsView:
    """A study's stored trials, read (autosearch.study.trials): Optuna's trials, the
    records, the learning curves, the Pareto front."""

    name: str
    storage: BaseStorage
    trials: StoredTrials

    @property
    def optuna_study(self) -> optuna.Study:
        """The underlying Optuna study (same storage), for Optuna's own tools."""
        return optuna.load_study(study_name=self.name, storage=self.storage)

    def optuna_trials(self) -> list[FrozenTrial]:
        return self.trials.all()

    def optuna_trial(self, number: int) -> FrozenTrial:
        """The stored Optuna trial number ``number``."""
        return self.trials.get(number)

    @property
    def unreadable(self) -> dict[int, str]:
        """Stored trials left out as unreadable: number -> why."""
        return self.trials.unreadable

    def decode(self, trial: FrozenTrial) -> list[Record]:
        """A stored trial's records (see records.decode); an unreadable trial is logged
        and left out."""
        return self.trials.decode(trial)

    def records(self, *, variants: bool = True) -> list[Record]:
        """Every trial of the study as Records, in trial order: the base record, then
        one per variant (``variants=False``: base records only)."""
        return self.trials.records(variants=variants)

    def record(self, trial: int, variant: str = "base") -> Record:
        """The record of trial number ``trial`` and ``variant``."""
        return self.trials.record(trial, variant)

    def curves(self) -> dict[int, dict[int, float]]:
        """Each trial's validation accuracy after every epoch it trained (learning
        curves; also what early stopping compares)."""
        return self.trials.curves()

    def count(self, *states: State) -> int:
        """Search trials (not variants or confirmations) in any of ``states`` (any state
        when none is given)."""
        return self.trials.count(*states)

    def pareto(self) -> list[Record]:
        """The complete (architecture, variant) records that no other complete record
        dominates on the study's objectives, ordered by the second objective."""
        return results.front(self.records(), self.trials.objectives)


class TrackingView:
    """Where a study is shown live (MLflow, TensorBoard: autosearch.study.tracking),
    stored with it and read by every process that runs its trials."""

    name: str
    definition: StudyDefinition
    storage: BaseStorage
    storage_url: str
    tracker: Tracker
    supernet_job: SupernetJob | None
    _study_id: int
    _uid: str

    @property
    def tracking(self) -> Tracking:
        """Where the study is shown live (MLflow, TensorBoard), as stored with it."""
        return self.tracker.tracking

    def track(
        self, *, mlflow: str | bool | None = None, tensorboard: str | Path | bool | None = None
    ) -> Tracking:
        """Show the study live in MLflow (a tracking URI; True: MLflow's default) and/or
        TensorBoard (a folder), from every process that runs its trials from now on
        (stored with the study; a process already running keeps what it read). None
        keeps a setting, False switches it off. See autosearch.study.tracking."""
        tracking = self.tracking.changed(mlflow=mlflow, tensorboard=tensorboard)
        tracking.check_apart(self.storage_url)
        if tracking != self.tracking:
            tracking_spec.store(self.storage, self._study_id, tracking)
            self.tracker.close()
            self.tracker = self._tracker(tracking)
            if self.supernet_job is not None:
                self.supernet_job.on_epoch = self.tracker.supernet_epoch if tracking.on else None
        return tracking

    def log_model(
        self, folder: str | Path, *, mlflow: str | bool = True, register: str | None = None
    ) -> LoggedModel:
        """Log an export folder (written by ``export``) as an MLflow model, in the run
        of its trial where the study was tracked when it ran: ``mlflow`` a tracking URI,
        or True for where the study is tracked (else MLflow's default); registered as
        ``register`` in MLflow's model registry if given. See
        autosearch.study.tracking.mlflow_model."""
        from autosearch.study.tracking.mlflow_model import log_export

        uri: str | None
        if mlflow is True and self.tracking.mlflow:
            uri = self.tracking.mlflow
        else:
            uri = Tracking.of(mlflow=mlflow).mlflow
        if uri is None:
            raise ConfigError("log_model(mlflow=False): give a tracking URI, or True")
        Tracking(mlflow=uri).check_apart(self.storage_url)
        return log_export(folder, uri=uri, study=self.name, uid=self._uid, register=register)

    def _tracker(self, tracking: Tracking | None = None) -> Tracker:
        tracking = tracking or tracking_spec.stored(self.storage, self._study_id)
        return Tracker(tracking, study=self.name, uid=self._uid, definition=self.definition)
