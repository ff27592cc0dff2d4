"""Studies: an architecture search kept in Optuna storage.

The storage is the single source of truth. Each evaluated architecture is one Optuna
trial: its genes are the trial's params, its architecture JSON, metrics and failure
reason are user attributes, and its objective values are the trial's values, so the
``optuna`` CLI and optuna-dashboard read an autosearch study like any other. The
study's definition (space, controller, data, objectives, training) is a study user
attribute, which is how :func:`load_study` rebuilds it; the controller's state is a
study system attribute, and finished trials it has not seen are replayed into it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import optuna
import torch
import torch.distributed as dist
from optuna.artifacts import FileSystemArtifactStore, download_artifact, upload_artifact
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState, create_trial
from safetensors.torch import load_file, save_file

from autosearch import scoring
from autosearch._heartbeat import beating, last_beat, worker_id
from autosearch._provenance import provenance
from autosearch._storage import local_path, open_storage
from autosearch._version import __version__
from autosearch.architecture import Architecture
from autosearch.compress import Compression, VariantSpec, parse_variants
from autosearch.controller import Controller, Outcome
from autosearch.data import Dataset, load_data, spec_of
from autosearch.early_stopping import SuccessiveHalving, from_dict
from autosearch.errors import AutosearchError, ExportError, StorageError, StudyError, suggest
from autosearch.export import write_export
from autosearch.registry import controllers, spaces
from autosearch.runner import VariantResult, run_trial, run_variants
from autosearch.runtime import world
from autosearch.scoring import Reward, objective, pareto_mask, resolve_reward
from autosearch.space import Categorical, IntRange, SearchSpace
from autosearch.tabular import Table
from autosearch.train import TrainConfig

__all__ = ["Record", "Study", "StudySpec", "Table", "create_study", "load_study"]

logger = logging.getLogger(__name__)

_DEFINITION = "autosearch"
_CONTROLLER_STATE = "autosearch:controller"
_MAX_DUPLICATE_ASKS = 1000
_METRICS = (
    "accuracy",
    "test_accuracy",
    "flops",
    "macs",
    "params",
    "train_seconds",
    "reward",
    "world_size",
    "stopped_at_epoch",
    "sparse_macs",
    "bops",
    "bytes",
    "latency",
    "latency_batched",
)
_FLOAT_BUDGET = {"flops": "max_flops", "params": "max_params"}
_TARGET_SAMPLES = 64
_STATES = {
    TrialState.COMPLETE: "complete",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.PRUNED: "stopped",
    TrialState.WAITING: "waiting",
}
_FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
# A trial given up for another that replaces it: a duplicate claim, or a run whose worker
# died or was interrupted (resumed from its checkpoint by a new trial). Kept in storage
# for the record, left out of records, counts and the controller's history.
_SUPERSEDED = "superseded"
_RESUME = "resume"  # superseded trials whose architecture still needs training
_MAX_CLAIMS = 100


def _heartbeat_settings() -> tuple[float, float]:
    """(interval, grace) in seconds: ``$AUTOSEARCH_HEARTBEAT_INTERVAL`` (default 10) and
    ``$AUTOSEARCH_HEARTBEAT_GRACE`` (default 60: a trial silent that long is dead)."""
    values = []
    for name, default in (("INTERVAL", 10.0), ("GRACE", 60.0)):
        raw = os.environ.get(f"AUTOSEARCH_HEARTBEAT_{name}", "")
        try:
            values.append(float(raw) if raw else default)
        except ValueError:
            raise StudyError(
                f"AUTOSEARCH_HEARTBEAT_{name}={raw!r} must be a number of seconds"
            ) from None
    interval, grace = values
    if not 0 < interval < grace:
        raise StudyError(
            f"heartbeat interval {interval} s must be positive and below the grace {grace} s"
        )
    return interval, grace


State = Literal["complete", "failed", "running", "stopped", "waiting"]


@dataclass(frozen=True, kw_only=True)
class Record:
    """One evaluated (architecture, variant) point of a study.

    A trial gives one record per variant, all with the trial's number: ``variant`` is
    ``"base"`` for the trained network, else the compressed variant's name. ``metrics``
    holds ``accuracy`` (validation), ``test_accuracy`` (held out), ``flops`` (2 × MACs,
    one image), ``macs``, ``sparse_macs``, ``params``, ``bops``, ``bytes``, ``latency``
    and ``latency_batched`` (ms per image), ``train_seconds`` and ``reward`` for
    complete records (conventions: autosearch.cost).
    """

    trial: int
    arch: Architecture
    description: str
    state: State
    variant: str = "base"
    metrics: Mapping[str, float] = field(default_factory=dict)
    reason: str = ""

    def __hash__(self) -> int:
        return hash((self.trial, self.variant))

    @property
    def accuracy(self) -> float | None:
        return self.metrics.get("accuracy")

    @property
    def test_accuracy(self) -> float | None:
        return self.metrics.get("test_accuracy")

    @property
    def flops(self) -> float | None:
        return self.metrics.get("flops")

    @property
    def params(self) -> float | None:
        return self.metrics.get("params")

    @property
    def is_base(self) -> bool:
        return self.variant == "base"


@dataclass(frozen=True, kw_only=True)
class StudySpec:
    """A study's whole definition, as a study file declares it.

    ``autosearch run FILE`` finds the one StudySpec in FILE, creates (or resumes) the
    study and runs it until ``n_trials`` trials have finished. The fields are the
    arguments of :func:`create_study`.
    """

    name: str
    controller: Controller | str
    space: SearchSpace | None = None
    data: str = "digits"
    objectives: tuple[str, ...] = ("accuracy", "flops")
    reward: str = "mnas"
    variants: tuple[str, ...] = ("base",)
    compression: Compression = field(default_factory=Compression)
    train: TrainConfig = field(default_factory=TrainConfig)
    storage: str | None = None
    artifacts: str | None = None
    seed: int = 0
    table: Table | None = None
    early_stopping: SuccessiveHalving | None = None
    n_trials: int = 10

    def create(self, *, storage: str | None = None, load_if_exists: bool = True) -> Study:
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del options["name"], options["n_trials"]
        options["storage"] = storage or self.storage
        return create_study(self.name, **options, load_if_exists=load_if_exists)


def default_storage(name: str) -> str:
    return f"sqlite:///runs/{name}/study.db"


def create_study(
    name: str,
    *,
    controller: Controller | str,
    space: SearchSpace | str | None = None,
    data: str | tuple[Any, Any] = "digits",
    objectives: Sequence[str] = ("accuracy", "flops"),
    reward: str = "mnas",
    variants: Sequence[str] = ("base",),
    compression: Compression | None = None,
    train: TrainConfig | None = None,
    storage: str | None = None,
    artifacts: str | None = None,
    seed: int = 0,
    table: Table | None = None,
    early_stopping: SuccessiveHalving | None = None,
    load_if_exists: bool = False,
) -> Study:
    """Create a study (or, with ``load_if_exists``, continue the stored one).

    Args:
        name: Study name, unique in its storage.
        controller: A controller instance (which carries its space), or a registered
            controller name together with ``space``.
        space: The search space (or a registered space's name, for its default
            configuration); optional when ``controller`` is an instance.
        data: A dataset spec (``"digits"``, ``"fashion-mnist"``, ``"cifar10:PATH"``,
            ``"folder:PATH"``...) or ``(images, labels)`` arrays; see autosearch.data.
        objectives: Objective names, the first usually ``"accuracy"``.
        reward: The scalar reward single-objective controllers maximise, computed for
            each variant; a candidate's reward is its best variant's. ``"mnas"``
            (default: MnasNet's ``accuracy × (flops / target) ** -0.07``, the target
            being the space's ``max_flops``, else the median FLOPs of the space),
            ``"mnas@latency=2.5,w=-0.07"``, ``"hard@macs=2e6"`` (accuracy within the
            budget, 0 outside), ``"accuracy-per-gflop"`` or ``"accuracy"``.
        variants: Variants measured for each candidate: ``"base"``,
            ``"prune-l1@0.5"``, ``"prune-channels@0.5"``, ``"int8"``, ``"qat-int8"``,
            ``"distill"`` (see autosearch.compress).
        compression: How variants are derived (fine-tuning epochs, distillation,
            calibration, ``only_front``).
        train: How every candidate is trained.
        storage: Storage URL; default ``sqlite:///runs/NAME/study.db``.
        artifacts: Folder for trained weights; default ``artifacts/`` beside a file storage.
        seed: Seed of the data split and of every trial's training.
        early_stopping: Stop unpromising trials early (SuccessiveHalving, Hyperband),
            judged on validation accuracy after each epoch against the other trials.
        table: Evaluate architectures by looking them up in this benchmark table
            instead of training them (``data`` and ``train`` are then unused).
        load_if_exists: Continue a stored study of the same name and definition.

    Raises:
        UnknownNameError: an unknown space, controller, objective, reward or dataset name.
        StorageError: an unusable storage URL.
        StudyError: the study exists (without ``load_if_exists``) or was stored with a
            different space, objectives or data.
    """
    space, controller = _resolve(space, controller, seed)
    train = train or TrainConfig()
    objectives = tuple(objectives)
    # Check every name before touching storage, so bad input changes nothing stored.
    directions = [objective(o).direction for o in objectives]
    if len(set(objectives)) != len(objectives) or not objectives:
        raise StudyError(f"objectives must be distinct and non-empty, got {objectives}")
    variant_specs = parse_variants(variants)
    compression = compression or Compression()
    if table is not None and len(variant_specs) > 1:
        raise StudyError(
            "a table study looks results up instead of training, so it has no models to "
            "compress; use variants=('base',)"
        )
    scoring.check_reward(reward)
    wanted = getattr(controller, "objectives", None) or {}
    if set(wanted) - set(objectives):
        raise StudyError(
            f"controller {controller.name!r} optimises {sorted(wanted)} but the study measures "
            f"{list(objectives)}; add them to objectives= or give the controller a subset"
        )
    if table is not None:
        table.check_space(space)
        table.rows()  # a missing or malformed table fails here, before storage is touched
    definition = {
        "format": 1,
        "space": {"name": space.name, "config": space.config()},
        "controller": {"name": controller.name, "config": controller.config()},
        "data": spec_of(data),
        "objectives": list(objectives),
        "reward": reward,
        "variants": ["base"],
        "compression": None,
        "train": dataclasses.asdict(train),
        "seed": seed,
        "artifacts": artifacts,
        "table": json.loads(json.dumps(dataclasses.asdict(table))) if table else None,
        "early_stopping": early_stopping.to_dict() if early_stopping else None,
        "created_by": f"autosearch {__version__}",
    }
    dataset = load_data(data, seed=seed) if table is None else None
    shape = dataset.input_shape if dataset else space.budget_input
    classes = dataset.num_classes if dataset else space.budget_classes
    definition["reward"] = str(
        resolve_reward(reward, lambda metric: _default_target(space, metric, shape, classes))
    )
    definition["variants"] = [v.name for v in variant_specs]
    definition["compression"] = dataclasses.asdict(compression)
    if dataset is not None:
        definition["data_report"] = dataset.report.to_dict()
    url = storage or default_storage(name)
    backend = open_storage(url)
    try:
        backend.get_study_id_from_name(name)
        exists = True
    except KeyError:
        exists = False
    if exists:
        if not load_if_exists:
            raise StudyError(
                f"study {name!r} already exists in {url}; pass load_if_exists=True to continue "
                "it, load it with autosearch.load_study, or choose another name"
            )
        stored = _stored_definition(backend, name, url)
        _check_same(name, stored, definition)
        if stored["controller"] != definition["controller"]:
            # Continuing with another controller is allowed; record it, so that
            # load_study rebuilds the controller that ran last.
            logger.info("study %s continues with controller %s", name, controller.name)
            stored["controller"] = definition["controller"]
            backend.set_study_user_attr(backend.get_study_id_from_name(name), _DEFINITION, stored)
        definition = stored
    else:
        optuna.create_study(storage=backend, study_name=name, directions=directions)
        backend.set_study_user_attr(backend.get_study_id_from_name(name), _DEFINITION, definition)
    study = Study(
        name=name,
        url=url,
        storage=backend,
        definition=definition,
        space=space,
        controller=controller,
        data=dataset,
    )
    if not isinstance(data, str):
        study._data_source = data  # worker processes need the arrays again
    return study


def load_study(name: str, *, storage: str, data: tuple[Any, Any] | None = None) -> Study:
    """Open a stored study, rebuilding its space and controller from storage.

    The controller gets its stored state back, then every finished trial it has not
    seen is replayed into it, so ``optimize`` continues where the study stopped.
    A study created from ``(images, labels)`` arrays needs the same arrays again.
    """
    backend = open_storage(storage)
    definition = _stored_definition(backend, name, storage)
    dataset = None
    if data is not None:
        if spec_of(data) != definition["data"]:
            raise StudyError(
                f"study {name!r} was created from other data ({definition['data']}, "
                f"given {spec_of(data)}); pass the arrays it was created from"
            )
        dataset = load_data(data, seed=definition["seed"])
    space = spaces.get(definition["space"]["name"])(**definition["space"]["config"])
    controller_cls = controllers.get(definition["controller"]["name"])
    controller = controller_cls(space, **definition["controller"]["config"])
    study = Study(
        name=name,
        url=storage,
        storage=backend,
        definition=definition,
        space=space,
        controller=controller,
        data=dataset,
    )
    study._data_source = data
    return study


class Study:
    """A running or stored architecture search. Make one with create_study / load_study."""

    def __init__(
        self,
        *,
        name: str,
        url: str,
        storage: BaseStorage,
        definition: Mapping[str, Any],
        space: SearchSpace,
        controller: Controller,
        data: Dataset | None,
    ) -> None:
        self.name = name
        self.storage_url = url
        self.space = space
        self.controller = controller
        self.objectives: tuple[str, ...] = tuple(definition["objectives"])
        self.reward_name: str = definition["reward"]
        self.reward: Reward = scoring.parse_reward(self.reward_name)
        self.variants: tuple[VariantSpec, ...] = parse_variants(
            definition.get("variants") or ["base"]
        )
        self.compression = Compression(**(definition.get("compression") or {}))
        self.train_config = TrainConfig(**definition["train"])
        self.seed: int = definition["seed"]
        self._definition = dict(definition)
        self._storage = storage
        self._study_id = storage.get_study_id_from_name(name)
        self._dataset = data
        self._epoch_callbacks: list[Callable[[int, Any], None]] = []
        self._interrupted = False
        self._data_source: Any = None  # (images, labels) a study from arrays was given
        self.heartbeat_interval, self.heartbeat_grace = _heartbeat_settings()
        self.table = Table(**definition["table"]) if definition.get("table") else None
        self.early_stopping = from_dict(definition.get("early_stopping"))
        self._told: set[int] = set()
        self._restore_controller()

    # Reading -------------------------------------------------------------------------
    @property
    def optuna_study(self) -> optuna.Study:
        """The underlying Optuna study (same storage), for Optuna's own tools."""
        return optuna.load_study(study_name=self.name, storage=self._storage)

    @property
    def data(self) -> Dataset:
        if self._dataset is None:
            spec = self._definition["data"]
            if spec.startswith("arrays:"):
                raise StudyError(
                    f"study {self.name!r} was created from arrays; pass them again: "
                    "autosearch.load_study(name, storage=..., data=(images, labels))"
                )
            self._dataset = load_data(spec, seed=self.seed)
        return self._dataset

    @cached_property
    def _data_hash(self) -> str | None:
        """Content hash of the data every trial trains on (None for table studies)."""
        return None if self.table is not None else self.data.content_hash()

    @property
    def data_report(self) -> dict[str, Any] | None:
        """The cleaning report stored when the study was created (None for tables)."""
        return self._definition.get("data_report")

    @cached_property
    def artifacts_dir(self) -> Path:
        if self._definition.get("artifacts"):
            return Path(self._definition["artifacts"])
        path = local_path(self.storage_url)
        return (path.parent if path else Path("runs") / self.name) / "artifacts"

    def records(self, *, variants: bool = True) -> list[Record]:
        """Every trial of the study as Records, in trial order: the base record, then
        one per variant (``variants=False``: base records only)."""
        trials = self._storage.get_all_trials(self._study_id, deepcopy=False)
        return [r for t in trials for r in self._records(t) if variants or r.is_base]

    def curves(self) -> dict[int, dict[int, float]]:
        """Each trial's validation accuracy after every epoch it trained (learning
        curves; also what early stopping compares)."""
        return {
            t.number: dict(sorted(t.intermediate_values.items()))
            for t in self._storage.get_all_trials(self._study_id, deepcopy=False)
            if t.intermediate_values
        }

    def pareto(self) -> list[Record]:
        """The complete (architecture, variant) records that no other complete record
        dominates on the study's objectives, ordered by the second objective."""
        done = [r for r in self.records() if r.state == "complete"]
        if not done:
            return []
        values = np.array([[r.metrics[o] for o in self.objectives] for r in done])
        mask = pareto_mask(values, [objective(o).direction for o in self.objectives])
        front = [r for r, keep in zip(done, mask, strict=True) if keep]
        key = self.objectives[1] if len(self.objectives) > 1 else self.objectives[0]
        return sorted(front, key=lambda r: (r.metrics[key], r.trial))

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
        fits = [
            r
            for r in done
            if (max_flops is None or r.metrics["flops"] <= max_flops)
            and (max_params is None or r.metrics["params"] <= max_params)
        ]
        if not fits:
            if not done:
                raise StudyError(f"study {self.name!r} has no complete trial yet; run optimize()")
            smallest = min(done, key=lambda r: r.metrics["flops"])
            raise StudyError(
                f"no complete trial of {self.name!r} fits max_flops={max_flops}, "
                f"max_params={max_params}; the smallest has {smallest.metrics['flops']:.3g} "
                f"FLOPs and {smallest.metrics['params']:.3g} params (trial {smallest.trial})"
            )
        return max(fits, key=lambda r: (r.metrics["accuracy"], -r.metrics["flops"]))

    def record(self, trial: int, variant: str = "base") -> Record:
        for r in self.records():
            if r.trial == trial and r.variant == variant:
                return r
        raise StudyError(
            f"study {self.name!r} has no trial number {trial} with variant {variant!r}"
        )

    def count(self, *states: State) -> int:
        """Trials (not variants) in any of ``states``."""
        return sum(r.state in states for r in self.records(variants=False))

    # Searching -----------------------------------------------------------------------
    def optimize(
        self,
        n_trials: int,
        *,
        callbacks: Iterable[Callable[[Study, Record], None]] = (),
        max_failures_in_a_row: int = 10,
        epoch_callbacks: Iterable[Callable[[int, Any], None]] = (),
        n_workers: int = 1,
    ) -> list[Record]:
        """Evaluate ``n_trials`` new architectures; return their records.

        ``callbacks`` are called with each finished trial's record; ``epoch_callbacks``
        with ``(trial number, EpochResult)`` after every training epoch (progress bars).
        A failing trial is stored as failed with its reason and the search goes on;
        ``max_failures_in_a_row`` failures in a row stop it with a StudyError, since
        that points at the setup rather than at the architectures.

        With ``n_workers=K``, K worker processes share the trials (and the CPU threads,
        and the GPUs, one each in turn); callbacks then run in the workers only.

        Crash safety: each running trial beats a heartbeat in the storage; a trial
        whose worker died (no beat for the grace period) is resumed by the next worker
        that asks, from its last epoch's checkpoint. Ctrl-C (or SIGTERM) lets the
        current epoch's checkpoint finish, then returns; the trial resumes next time.
        """
        if n_trials < 0:
            raise StudyError(f"n_trials must be >= 0, got {n_trials}")
        if n_workers < 1:
            raise StudyError(f"n_workers must be >= 1, got {n_workers}")
        callbacks = list(callbacks)
        self._epoch_callbacks = list(epoch_callbacks)
        if self.table is None:
            _ = self.data  # data that cannot be loaded stops the study here, not in a trial
        rank, size = world()
        if n_workers > 1:
            if size > 1:
                raise StudyError("n_workers > 1 cannot be combined with torchrun; use one")
            return self._optimize_in_workers(n_trials, n_workers, max_failures_in_a_row)
        if size > 1 and rank != 0:
            return self._follow()  # under torchrun, rank 0 alone drives the search
        try:
            with self._graceful_interrupts():
                return self._optimize(n_trials, callbacks, max_failures_in_a_row)
        finally:
            if size > 1:
                _broadcast(None)  # release the other ranks

    def _optimize_in_workers(
        self, n_trials: int, n_workers: int, max_failures_in_a_row: int
    ) -> list[Record]:
        """Run ``n_trials`` in ``n_workers`` spawned processes, each a study of its own
        on the same storage."""
        if self.storage_url.startswith("sqlite") and ":memory:" in self.storage_url:
            raise StudyError("worker processes cannot share an in-memory storage; use a file")
        shares = [n_trials // n_workers + (i < n_trials % n_workers) for i in range(n_workers)]
        threads = max(1, (os.cpu_count() or 1) // n_workers)
        gpus = torch.cuda.device_count()
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(n_workers, mp_context=context) as pool:
            futures = [
                pool.submit(
                    _worker_main,
                    name=self.name,
                    storage=self.storage_url,
                    n_trials=share,
                    threads=threads,
                    gpu=(i % gpus) if gpus else None,
                    data=self._data_source,
                    max_failures_in_a_row=max_failures_in_a_row,
                )
                for i, share in enumerate(shares)
                if share
            ]
            numbers = sorted(n for f in futures for n in f.result())
        self._sync_controller()
        return [self.record(n) for n in numbers if self._has(n)]

    def _has(self, number: int) -> bool:
        try:
            self.record(number)
        except StudyError:
            return False
        return True

    def _graceful_interrupts(self) -> Any:
        """While optimize runs (in the main thread): the first Ctrl-C or SIGTERM asks the
        running trial to stop after its epoch's checkpoint; a second Ctrl-C stops at once."""
        study = self

        class Handler:
            def __enter__(self) -> None:
                study._interrupted = False
                self.saved = {}
                if threading.current_thread() is not threading.main_thread():
                    return
                for sig in (signal.SIGINT, signal.SIGTERM):
                    self.saved[sig] = signal.signal(sig, self.handle)

            def handle(self, signum: int, frame: Any) -> None:
                if study._interrupted and signum == signal.SIGINT:
                    raise KeyboardInterrupt
                study._interrupted = True
                logger.warning(
                    "%s: finishing this epoch's checkpoint, then stopping (Ctrl-C again to "
                    "stop at once)",
                    signal.Signals(signum).name,
                )

            def __exit__(self, *exc: object) -> None:
                for sig, handler in self.saved.items():
                    signal.signal(sig, handler)

        return Handler()

    def _optimize(
        self,
        n_trials: int,
        callbacks: list[Callable[[Study, Record], None]],
        max_failures_in_a_row: int,
    ) -> list[Record]:
        done: list[Record] = []
        failures = 0
        for _ in range(n_trials):
            if self._interrupted:
                break
            record = self._run_one()
            if record is None:  # interrupted: the trial resumes next time
                break
            done.append(record)
            failures = failures + 1 if record.state == "failed" else 0
            for callback in callbacks:
                callback(self, record)
            if failures >= max_failures_in_a_row:
                raise StudyError(
                    f"{failures} trials failed in a row in study {self.name!r}; the last said: "
                    f"{record.reason}. Fix the setup (data, training config) before resuming"
                )
        return done

    def _run_one(self) -> Record | None:
        arch, trial_id = self._claim()
        with beating(self._storage, trial_id, self.heartbeat_interval):
            return self._run_claimed(arch, trial_id)

    def _run_claimed(self, arch: Architecture, trial_id: int) -> Record | None:
        number = self._storage.get_trial_number_from_id(trial_id)
        seed = trial_seed(self.seed, arch)
        logger.info("trial %d: %s", number, self.space.describe(arch))

        try:
            metrics, model = self._evaluate(arch, trial_id, seed)
        except _Stopped as stop:
            logger.info("trial %d stopped early after epoch %d", number, stop.epoch)
            outcome = self._stop(trial_id, arch, stop)
        except (_Interrupted, KeyboardInterrupt) as exc:
            self._supersede(
                trial_id, f"interrupted by the user ({exc}); it resumes from its checkpoint"
            )
            if isinstance(exc, KeyboardInterrupt):
                raise
            return None
        except Exception as exc:  # any failure ends this trial only; the search goes on
            logger.warning("trial %d failed", number, exc_info=not isinstance(exc, AutosearchError))
            reason = f"{type(exc).__name__}: {exc}"
            self._fail(trial_id, reason)
            outcome = Outcome.failed(reason)
        else:
            metrics["reward"] = self.reward(metrics)
            if model is not None:
                self._save_weights(trial_id, model)
            for key, value in metrics.items():
                self._storage.set_trial_user_attr(trial_id, key, value)
            variants = self._variants(trial_id, model, metrics, seed) if model is not None else []
            best = self._store_variants(trial_id, metrics, variants)
            values = [best[o] for o in self.objectives]
            self._storage.set_trial_state_values(trial_id, TrialState.COMPLETE, values)
            outcome = Outcome(
                reward=best["reward"], objectives={o: best[o] for o in self.objectives}
            )
        self.controller.tell(arch, outcome)
        self._told.add(number)
        self._save_controller_state()
        return self._records(self._storage.get_trial(trial_id))[0]

    def rerun(self, trial: int) -> dict[str, Any]:
        """Train trial ``trial``'s architecture again, from scratch, with its stored seed
        and the study's data and training config (nothing is stored), and compare.

        Returns the stored and the new validation and test accuracy, whether they are
        identical, and what differs in the data hash and provenance (a different code
        version or package may explain a different result).
        """
        record = self.record(trial)
        if record.state != "complete":
            raise StudyError(f"trial {trial} is {record.state}; only complete trials can be rerun")
        if self.table is not None:
            raise StudyError("a table study looks results up; there is no training to rerun")
        stored = self._storage.get_trial(
            self._storage.get_trial_id_from_study_id_trial_number(self._study_id, trial)
        ).user_attrs
        seed = int(stored.get("seed", trial_seed(self.seed, record.arch)))
        result = run_trial(self.space, record.arch, self.data, self.train_config, seed=seed)
        then = stored.get("provenance") or {}
        now = provenance()
        changed = {
            key: {"stored": then.get(key), "now": now.get(key)}
            for key in ("code", "packages", "python")
            if then and then.get(key) != now.get(key)
        }
        return {
            "trial": trial,
            "description": record.description,
            "seed": seed,
            "stored": {k: record.metrics.get(k) for k in ("accuracy", "test_accuracy")},
            "rerun": {k: result.metrics.get(k) for k in ("accuracy", "test_accuracy")},
            "identical": result.metrics["accuracy"] == record.metrics["accuracy"]
            and result.metrics.get("test_accuracy") == record.metrics.get("test_accuracy"),
            "data_hash": {"stored": stored.get("data_hash"), "now": self._data_hash},
            "provenance_changed": changed,
        }

    # Variants ------------------------------------------------------------------------
    def _variants(
        self, trial_id: int, model: Any, metrics: Mapping[str, float], seed: int
    ) -> list[VariantResult]:
        """Derive and measure the study's variants of a freshly trained candidate."""
        wanted = [v for v in self.variants if v.kind != "base"]
        if not wanted:
            return []
        if self.compression.only_front and not self._on_front(trial_id, metrics):
            self._storage.set_trial_user_attr(
                trial_id, "variants_skipped", "not on the accuracy-FLOPs front (only_front)"
            )
            return []
        teacher = self._teacher(metrics) if any(v.kind == "distill" for v in wanted) else None
        return run_variants(
            model,
            wanted,
            self.data,
            self.train_config,
            seed=seed,
            compression=self.compression,
            teacher=teacher,
        )

    def _on_front(self, trial_id: int, metrics: Mapping[str, float]) -> bool:
        others = [
            (r.metrics["accuracy"], r.metrics["flops"])
            for r in self.records(variants=False)
            if r.state == "complete" and "flops" in r.metrics
        ]
        points = np.array([(metrics["accuracy"], metrics["flops"]), *others])
        return bool(pareto_mask(points, ["maximize", "minimize"])[0])

    def _teacher(self, metrics: Mapping[str, float]) -> Any:
        """The study's most accurate trained model so far, if it beats this candidate
        (None: the candidate teaches itself)."""
        done = [r for r in self.records(variants=False) if r.state == "complete" and r.accuracy]
        best = max(done, key=lambda r: r.metrics["accuracy"], default=None)
        if best is None or best.metrics["accuracy"] <= metrics["accuracy"]:
            return None
        try:
            return self.load_model(best)
        except ExportError as exc:
            logger.info("no teacher for distillation (%s); the candidate teaches itself", exc)
            return None

    def _store_variants(
        self, trial_id: int, base: Mapping[str, float], variants: list[VariantResult]
    ) -> dict[str, float]:
        """Store each variant under the trial; return the best variant's metrics (the
        candidate is ranked by its best variant)."""
        stored: dict[str, dict[str, Any]] = {}
        best_name, best = "base", dict(base)
        for v in variants:
            if v.failed:
                stored[v.name] = {"fail_reason": v.reason}
                continue
            metrics = {**v.metrics, "reward": self.reward(v.metrics)}
            stored[v.name] = metrics
            if metrics["reward"] > best["reward"]:
                best_name, best = v.name, metrics
        if stored:
            self._storage.set_trial_user_attr(trial_id, "variants", stored)
        self._storage.set_trial_user_attr(trial_id, "best_variant", best_name)
        self._storage.set_trial_user_attr(trial_id, "candidate_reward", best["reward"])
        return best

    def _evaluate(
        self, arch: Architecture, trial_id: int, seed: int
    ) -> tuple[dict[str, float], Any]:
        """Train ``arch`` (or look it up in the study's table): its metrics and model."""
        if self.table is not None:
            return self.table.evaluate(self.space, arch), None

        number = self._storage.get_trial_number_from_id(trial_id)

        reported = 0

        def report(epoch: Any) -> None:
            nonlocal reported
            reported += 1
            self._storage.set_trial_intermediate_value(trial_id, epoch.epoch, epoch.val_accuracy)
            for callback in self._epoch_callbacks:
                callback(number, epoch)
            if self._interrupted:  # the epoch's checkpoint is written: stop here
                raise _Interrupted(f"after epoch {epoch.epoch}")
            if self.early_stopping is None:
                return
            stop = self.early_stopping.should_stop(
                trial=number,
                epoch=epoch.epoch,
                epochs=self.train_config.epochs,
                value=epoch.val_accuracy,
                others=self._curves(trial_id),
            )
            if world()[1] > 1:
                _broadcast({"stop": stop})  # every rank stops at the same epoch
            if stop:
                raise _Stopped(epoch.epoch, epoch.val_accuracy)

        # Keyed by architecture: a trial interrupted mid-training resumes from its last epoch.
        checkpoint = self._checkpoint(arch)
        if world()[1] > 1:
            _broadcast({"arch": arch.to_json(), "seed": seed})  # the other ranks train it too
        result = run_trial(
            self.space,
            arch,
            self.data,
            self.train_config,
            seed=seed,
            on_epoch=report,
            checkpoint=checkpoint,
        )
        checkpoint.unlink(missing_ok=True)  # the finished weights are stored as an artifact
        self._storage.set_trial_user_attr(trial_id, "precision", result.precision)
        if len(result.history) > reported:  # epochs restored from a checkpoint
            self._storage.set_trial_user_attr(
                trial_id, "resumed_from_epoch", len(result.history) - reported
            )
        return result.metrics, result.model

    def _curves(self, trial_id: int) -> dict[int, dict[int, float]]:
        """Every other trial's validation accuracy by epoch (the early-stopping peers)."""
        return {
            t.number: dict(t.intermediate_values)
            for t in self._storage.get_all_trials(self._study_id, deepcopy=False)
            if t._trial_id != trial_id and t.intermediate_values
        }

    def _stop(self, trial_id: int, arch: Architecture, stop: _Stopped) -> Outcome:
        """Store a trial stopped early: its accuracy so far and its cost (not trained on)."""
        self._checkpoint(arch).unlink(missing_ok=True)
        cost = self.space.cost(
            arch, input_shape=self.data.input_shape, num_classes=self.data.num_classes
        )
        metrics = {
            "accuracy": stop.value,
            "flops": float(cost.flops),
            "macs": float(cost.macs),
            "params": float(cost.params),
        }
        metrics["reward"] = self.reward(metrics)
        for key, value in {**metrics, "stopped_at_epoch": stop.epoch}.items():
            self._storage.set_trial_user_attr(trial_id, key, value)
        self._storage.set_trial_state_values(trial_id, TrialState.PRUNED)
        return Outcome(
            reward=metrics["reward"],
            status="stopped",
            objectives={o: metrics[o] for o in self.objectives if o in metrics},
        )

    def _checkpoint(self, arch: Architecture) -> Path:
        return self.artifacts_dir / "checkpoints" / f"{arch.arch_id}.pt"

    def _follow(self) -> list[Record]:
        """A non-zero rank under torchrun: train what rank 0 broadcasts, until told to stop.
        Rank 0 records every result (and every failure)."""

        def follow_stop(epoch: Any) -> None:
            decision = _broadcast(None)
            if decision and decision["stop"]:
                raise _Stopped(epoch.epoch, epoch.val_accuracy)

        on_epoch = follow_stop if self.early_stopping is not None else None
        while (message := _broadcast(None)) is not None:
            arch = Architecture.from_json(message["arch"])
            try:
                run_trial(
                    self.space,
                    arch,
                    self.data,
                    self.train_config,
                    seed=message["seed"],
                    checkpoint=self._checkpoint(arch),
                    on_epoch=on_epoch,
                )
            except Exception:  # rank 0 saw the same failure and stores it
                logger.debug("trial failed on this rank too", exc_info=True)
        return []

    def _claim(self) -> tuple[Architecture, int]:
        """The next architecture and a new running trial that holds it: first one whose
        run was cut short (a dead worker, Ctrl-C), else the controller's next proposal.

        Workers claim without locks: each creates its trial, then looks for another
        live trial of the same architecture with a lower number; if there is one, it
        gives its own up (superseded as a duplicate) and asks again. Trial numbers
        follow creation order, so of two racing claims exactly the later one yields.
        """
        for _ in range(_MAX_CLAIMS):
            trials = self._storage.get_all_trials(self._study_id, deepcopy=False)
            if self._reap_dead(trials):  # read again: the reaped trials now wait to resume
                trials = self._storage.get_all_trials(self._study_id, deepcopy=False)
            pending = self._pending(trials)
            arch = pending[0] if pending else self._ask_new(trials)
            trial_id = self._start_trial(arch, resumes=pending[1] if pending else None)
            if self._holds(trial_id, arch, trials):
                if pending:
                    self._copy_curve(pending[1], trial_id)
                return arch, trial_id
        raise StudyError(
            f"{_MAX_CLAIMS} claims in a row were taken by other workers; too many workers "
            "for the architectures left?"
        )

    def _reap_dead(self, trials: list[FrozenTrial]) -> bool:
        """Give up running trials whose worker stopped beating (they resume elsewhere);
        whether there were any."""
        now = time.time()
        reaped = False
        for t in trials:
            if t.state != TrialState.RUNNING or _SUPERSEDED in t.user_attrs:
                continue
            silent = now - last_beat(t)
            if silent > self.heartbeat_grace:
                worker = t.system_attrs.get("autosearch:worker", "unknown")
                logger.warning(
                    "trial %d: worker %s silent for %.0f s; it resumes from its checkpoint",
                    t.number,
                    worker,
                    silent,
                )
                self._supersede(
                    t._trial_id,
                    f"its worker {worker} died (no heartbeat for {silent:.0f} s); "
                    "it resumes from its checkpoint",
                )
                reaped = True
        return reaped

    def _pending(self, trials: list[FrozenTrial]) -> tuple[Architecture, int] | None:
        """The oldest superseded-for-resume trial whose architecture no live trial holds."""
        live = {
            t.user_attrs.get("arch_id")
            for t in trials
            if _SUPERSEDED not in t.user_attrs and t.state != TrialState.WAITING
        }
        for t in sorted(trials, key=lambda t: t.number):
            attrs = t.user_attrs
            if attrs.get(_RESUME) and attrs.get("arch_id") not in live:
                return Architecture.from_json(attrs["arch"]), t.number
        return None

    def _holds(
        self, trial_id: int, arch: Architecture, seen: list[FrozenTrial] | None = None
    ) -> bool:
        """Whether our new trial is the architecture's live trial with the lowest number
        (else it is superseded as a duplicate). ``seen``: the trials read just before
        claiming; only those created since are read again."""
        mine = self._storage.get_trial_number_from_id(trial_id)
        if seen is None:
            earlier = self._storage.get_all_trials(self._study_id, deepcopy=False)
        else:
            known = max((t.number for t in seen), default=-1)
            earlier = list(seen) + [
                self._storage.get_trial(
                    self._storage.get_trial_id_from_study_id_trial_number(self._study_id, n)
                )
                for n in range(known + 1, mine)
            ]
        for t in earlier:
            attrs = t.user_attrs
            if (
                t.number < mine
                and attrs.get("arch_id") == arch.arch_id
                and _SUPERSEDED not in attrs
            ):
                self._supersede(
                    trial_id, f"duplicate: trial {t.number} holds this architecture", resume=False
                )
                return False
        return True

    def _copy_curve(self, old: int, trial_id: int) -> None:
        """A resumed trial's learning curve starts with the epochs its predecessor ran."""
        previous = self._storage.get_trial(
            self._storage.get_trial_id_from_study_id_trial_number(self._study_id, old)
        )
        for epoch, value in previous.intermediate_values.items():
            self._storage.set_trial_intermediate_value(trial_id, epoch, value)

    def _supersede(self, trial_id: int, reason: str, *, resume: bool = True) -> None:
        """Mark a running trial replaced (see _SUPERSEDED), and whether its architecture
        still needs training (``resume``)."""
        try:
            self._storage.set_trial_user_attr(trial_id, _RESUME, resume)
            self._storage.set_trial_user_attr(trial_id, "fail_reason", reason)
            self._storage.set_trial_user_attr(trial_id, _SUPERSEDED, reason)
            self._storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker got there first
            logger.debug("trial %d was already finished", trial_id)

    def _ask_new(self, trials: list[FrozenTrial] | None = None) -> Architecture:
        """The controller's next architecture that no trial has evaluated yet."""
        if trials is None:
            trials = self._storage.get_all_trials(self._study_id, deepcopy=False)
        self._sync_controller(trials)
        by_arch = {
            t.user_attrs["arch_id"]: t
            for t in trials
            if "arch_id" in t.user_attrs and _SUPERSEDED not in t.user_attrs
        }
        for _ in range(_MAX_DUPLICATE_ASKS):
            arch = self.space.canonicalize(self.controller.ask())
            known = by_arch.get(arch.arch_id)
            if known is None:
                return arch
            # Already evaluated: hand the controller the stored result instead of retraining.
            if known.state in _FINISHED:
                self.controller.tell(arch, self._outcome(known))
        raise StudyError(
            f"the controller proposed only already-evaluated architectures "
            f"{_MAX_DUPLICATE_ASKS} times in a row; the search space ({self.space.size()} "
            "gene assignments) may be exhausted"
        )

    def _start_trial(self, arch: Architecture, *, resumes: int | None = None) -> int:
        attrs: dict[str, Any] = {
            "arch": arch.to_json(),
            "arch_id": arch.arch_id,
            "description": self.space.describe(arch),
            "variant": "base",
            "seed": trial_seed(self.seed, arch),
            "data_hash": self._data_hash,
            "provenance": provenance(),
            "worker": worker_id(),
        }
        if resumes is not None:
            attrs["resumes"] = resumes
        template = create_trial(
            state=TrialState.RUNNING,
            params=dict(arch),
            distributions=_distributions(self.space),
            user_attrs=attrs,
        )
        return self._storage.create_new_trial(self._study_id, template_trial=template)

    def _fail(self, trial_id: int, reason: str) -> None:
        self._storage.set_trial_user_attr(trial_id, "fail_reason", reason)
        self._storage.set_trial_state_values(trial_id, TrialState.FAIL)

    # Controller state and replay -----------------------------------------------------
    def _restore_controller(self) -> None:
        saved = self._storage.get_study_system_attrs(self._study_id).get(_CONTROLLER_STATE)
        spec = self._controller_spec()
        if saved and saved["controller"] == spec:
            self.controller.load_state_dict(saved["state"])
            self._told = set(saved["told"])
        self._sync_controller()

    def _sync_controller(self, trials: list[FrozenTrial] | None = None) -> None:
        """Tell the controller every finished trial it has not been told (stored ones on
        resume, other workers' while running). ``trials``: all trials, if just read."""
        if trials is None:
            trials = self._storage.get_all_trials(self._study_id, deepcopy=False)
        finished = [t for t in trials if t.state in _FINISHED]
        for t in sorted(finished, key=lambda t: t.number):
            if _SUPERSEDED in t.user_attrs:
                continue  # not a result: the architecture is (being) trained by another
            if t.number not in self._told and "arch" in t.user_attrs:
                self.controller.tell(Architecture.from_json(t.user_attrs["arch"]), self._outcome(t))
                self._told.add(t.number)

    def _save_controller_state(self) -> None:
        state: dict[str, Any] = {
            "controller": self._controller_spec(),
            "state": self.controller.state_dict(),
            "told": sorted(self._told),
        }
        self._storage.set_study_system_attr(self._study_id, _CONTROLLER_STATE, state)

    def _controller_spec(self) -> dict[str, Any]:
        return {"name": self.controller.name, "config": self.controller.config()}

    def _outcome(self, trial: FrozenTrial) -> Outcome:
        attrs = trial.user_attrs
        if trial.state == TrialState.FAIL or "reward" not in attrs:
            return Outcome.failed(attrs.get("fail_reason", "failed"))
        status: Literal["complete", "stopped"] = (
            "stopped" if trial.state == TrialState.PRUNED else "complete"
        )
        # A candidate is told as its best variant (the base when there is none).
        best = attrs.get("variants", {}).get(attrs.get("best_variant", "base"), attrs)
        return Outcome(
            reward=best["reward"],
            status=status,
            objectives={o: best[o] for o in self.objectives if o in best},
        )

    def _records(self, trial: FrozenTrial) -> list[Record]:
        """The trial's base record, then one record per stored variant."""
        attrs = trial.user_attrs
        if "arch" not in attrs:
            return []  # a trial some other tool added to the Optuna study
        if _SUPERSEDED in attrs:
            return []  # replaced by another trial (see _SUPERSEDED)
        base = Record(
            trial=trial.number,
            arch=Architecture.from_json(attrs["arch"]),
            description=attrs.get("description", ""),
            state=_STATES[trial.state],  # type: ignore[arg-type]
            variant=attrs.get("variant", "base"),
            metrics={k: float(attrs[k]) for k in _METRICS if k in attrs},
            reason=attrs.get("fail_reason", ""),
        )
        records = [base]
        for name, stored in attrs.get("variants", {}).items():
            reason = stored.get("fail_reason", "")
            records.append(
                dataclasses.replace(
                    base,
                    variant=name,
                    state="failed" if reason else base.state,
                    metrics={k: float(v) for k, v in stored.items() if k != "fail_reason"},
                    reason=reason,
                )
            )
        return records

    # Weights and export --------------------------------------------------------------
    @cached_property
    def _artifact_store(self) -> FileSystemArtifactStore:
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        return FileSystemArtifactStore(str(self.artifacts_dir))

    def _save_weights(self, trial_id: int, model: Any) -> None:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            save_file(state, str(path))
            artifact_id = upload_artifact(
                artifact_store=self._artifact_store,
                file_path=str(path),
                study_or_trial=self._storage.get_trial(trial_id),
                storage=self._storage,
            )
        self._storage.set_trial_user_attr(trial_id, "weights", artifact_id)

    def load_model(self, record: Record) -> Any:
        """The trained network of a complete record, in eval mode."""
        if record.state != "complete":
            raise ExportError(
                f"trial {record.trial} is {record.state}; only complete trials have trained weights"
            )
        if not record.is_base:
            raise ExportError(
                f"record {record.trial}/{record.variant} is a measured variant; its weights are "
                f"not stored. Load the base (study.record({record.trial})) and derive it again "
                f"with autosearch.compress.derive({record.variant!r}, model, data, config)"
            )
        trial = self._storage.get_trial(
            self._storage.get_trial_id_from_study_id_trial_number(self._study_id, record.trial)
        )
        artifact_id = trial.user_attrs.get("weights")
        if artifact_id is None:
            how = " (it was looked up in a benchmark table, not trained)" if self.table else ""
            raise ExportError(f"trial {record.trial} stored no weights{how}")
        model = self.space.build(
            record.arch, input_shape=self.data.input_shape, num_classes=self.data.num_classes
        )
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            try:
                download_artifact(
                    artifact_store=self._artifact_store,
                    file_path=str(path),
                    artifact_id=artifact_id,
                )
            except Exception as exc:
                raise ExportError(
                    f"the weights of trial {record.trial} are missing from {self.artifacts_dir} "
                    f"({type(exc).__name__}); was the artifacts folder moved or deleted?"
                ) from None
            model.load_state_dict(load_file(str(path)))
        return model.eval()

    def export(self, record: Record, out_dir: str | Path) -> Path:
        """Write an export folder (``autosearch.export``): ``model.py``, weights, ONNX
        (checked in onnxruntime), ``arch.json`` and a README.

        A variant record is derived again from its trial's stored weights, the same way
        and with the same seed as when it was measured (``distill`` takes the study's
        best model now as its teacher), and its accuracy is measured again; both the
        stored and the new figures are written.
        """
        data = self.data
        base = record if record.is_base else self.record(record.trial)
        model = self.load_model(base)
        metrics: dict[str, Any] = dict(record.metrics)
        derived = None
        if not record.is_base:
            from autosearch.compress import derive
            from autosearch.train import evaluate

            if record.state != "complete":
                raise ExportError(
                    f"variant {record.variant} of trial {record.trial} failed "
                    f"({record.reason}); there is nothing to export"
                )
            teacher = self._teacher(base.metrics) if record.variant == "distill" else None
            derived = derive(
                record.variant,
                model,
                data,
                self.train_config,
                compression=self.compression,
                seed=trial_seed(self.seed, record.arch),
                teacher=teacher,
            )
            metrics["accuracy_exported"] = evaluate(derived.model, data.val, data)[0]
        spec = self.space.network(
            record.arch, input_shape=data.input_shape, num_classes=data.num_classes
        )
        return write_export(
            out_dir,
            arch=record.arch,
            spec=spec,
            model=model,
            description=record.description,
            input_shape=data.input_shape,
            mean=data.mean,
            std=data.std,
            metrics=metrics,
            provenance={"study": self.name, "trial": record.trial, "version": __version__},
            samples=data.normalize(data.val.take(torch.arange(min(64, len(data.val))))),
            variant=record.variant,
            derived=derived,
        )


class _Interrupted(Exception):
    """Raised from the epoch callback after Ctrl-C / SIGTERM, once the checkpoint is written."""


def _worker_main(
    *,
    name: str,
    storage: str,
    n_trials: int,
    threads: int,
    gpu: int | None,
    data: Any,
    max_failures_in_a_row: int,
) -> list[int]:
    """One worker process of ``optimize(n_workers=K)``: the trial numbers it finished."""
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    torch.set_num_threads(threads)
    study = load_study(name, storage=storage, data=data)
    return [r.trial for r in study.optimize(n_trials, max_failures_in_a_row=max_failures_in_a_row)]


class _Stopped(Exception):
    """Raised from the epoch callback to end a trial early (multi-fidelity stopping)."""

    def __init__(self, epoch: int, value: float) -> None:
        super().__init__(f"stopped after epoch {epoch} at validation accuracy {value:.4f}")
        self.epoch, self.value = epoch, value


def _broadcast(message: dict[str, Any] | None) -> dict[str, Any] | None:
    """Rank 0's ``message`` on every rank (None tells the followers to stop)."""
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def trial_seed(study_seed: int, arch: Architecture) -> int:
    """A trial's seed depends only on the study seed and the architecture, so a
    retrained architecture repeats its result whatever order trials ran in."""
    digest = hashlib.sha256(f"{study_seed}:{arch.arch_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _resolve(
    space: SearchSpace | str | None, controller: Controller | str, seed: int
) -> tuple[SearchSpace, Controller]:
    if isinstance(space, str):  # a registered space name, with its default configuration
        space = spaces.get(space)()
    if isinstance(controller, str):
        if space is None:
            raise StudyError(
                f"controller {controller!r} is given by name, so the study needs space=...; "
                "or pass a controller instance, e.g. RandomSearch(ResNetSpace(), seed=0)"
            )
        return space, controllers.get(controller)(space, seed=seed)
    if not isinstance(controller, Controller):
        raise StudyError(
            f"controller must be a Controller or a registered name, got {type(controller).__name__}"
        )
    if space is not None and (space.name, space.config()) != (
        controller.space.name,
        controller.space.config(),
    ):
        raise StudyError("space= differs from the controller's own space; pass one of them")
    return controller.space, controller


def _distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    return {gene: _DISTRIBUTIONS[type(d)](d) for gene, d in space.domains().items()}


_DISTRIBUTIONS: dict[type, Callable[[Any], BaseDistribution]] = {
    Categorical: lambda d: CategoricalDistribution(d.choices),
    IntRange: lambda d: IntDistribution(d.low, d.high, step=d.step),
}


def _stored_definition(storage: BaseStorage, name: str, url: str) -> dict[str, Any]:
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        names = [s.study_name for s in storage.get_all_studies()]
        close = suggest(name, names)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise StorageError(
            f"no study named {name!r} in {url}.{hint} Studies there: {', '.join(names) or '(none)'}"
        ) from None
    definition = storage.get_study_user_attrs(study_id).get(_DEFINITION)
    if not isinstance(definition, dict):
        raise StudyError(f"study {name!r} in {url} was not created by autosearch (no definition)")
    return definition


def _check_same(name: str, stored: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """Refuse to continue a study with a different space, objectives, data or training."""
    keys = ("space", "objectives", "data", "reward", "train", "seed", "table", "variants")
    # Studies stored before variants existed measured the base only.
    defaults: dict[str, Any] = {"variants": ["base"]}
    differs = [
        k
        for k in keys
        if json.dumps(stored.get(k, defaults.get(k)), sort_keys=True)
        != json.dumps(given.get(k, defaults.get(k)), sort_keys=True)
    ]
    if differs:
        lines = "; ".join(f"{k}: stored {stored.get(k)!r}, given {given.get(k)!r}" for k in differs)
        raise StudyError(
            f"study {name!r} is stored with a different definition ({lines}). Its results "
            "would not be comparable: use a new study name, or autosearch.load_study to "
            "continue it as stored"
        )


def _default_target(
    space: SearchSpace, metric: str, shape: tuple[int, int, int], classes: int
) -> float | None:
    """A reward's cost target when none is given: the space's budget for that metric,
    else the median over architectures drawn from the space (seeded: the same study
    definition always gets the same target). None for measured-only costs."""
    budget = getattr(space, _FLOAT_BUDGET.get(metric, ""), None)
    if budget is not None:
        return float(budget)
    if metric not in ("flops", "macs", "params", "sparse_macs"):
        return None  # latency, bytes, bops: measured after training, not known ahead
    rng = np.random.default_rng(0)
    costs = []
    for _ in range(_TARGET_SAMPLES):
        cost = space.cost(space.sample(rng), input_shape=shape, num_classes=classes)
        costs.append(cost.params if metric == "params" else cost.flops)
    value = float(np.median(costs))
    return value / 2 if metric in ("macs", "sparse_macs") else value
