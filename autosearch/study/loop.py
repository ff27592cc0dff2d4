"""The search loop of one worker: claim → run → store → tell, trial after trial.

The runner evaluates a whole trial (autosearch.evaluation.runner); this loop only claims an
architecture, hands the runner a plan and a context that answers from storage, writes
the result (one write) and tells the controller. A trial that fails is stored with
its reason and the search goes on; ``max_failures_in_a_row`` failures in a row stop
it, since that points at the setup rather than at the architectures.

Ask and tell are the same steps for a loop of the user's own: ``study.ask()`` claims the
next trial exactly as the loop does (a trial cut short first, else the controller's next
architecture; held by a heartbeat while the user's loop runs it) and hands back an
:class:`AskedTrial`; ``study.tell(trial, figures)`` stores its figures (or its failure),
counts its costs, scores it and tells the controller. A trial asked and never told (the
user's process died) is taken up by the next claim, ``ask`` or ``optimize``, once its
heartbeat is stale.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sqlalchemy.exc
import torch
import torch.nn as nn
from optuna.exceptions import StorageInternalError, UpdateFinishedTrialError
from optuna.trial import FrozenTrial

from autosearch.architecture import Architecture
from autosearch.compress import Derived
from autosearch.controller import Outcome, unseen_architecture
from autosearch.data import Dataset
from autosearch.errors import (
    AutosearchError,
    ConfigError,
    PlatformError,
    SpaceExhausted,
    StudyError,
    TrialFailed,
)
from autosearch.evaluation.runner import (
    Interrupted,
    TakenOver,
    TrialContext,
    TrialResult,
    candidate_builder,
    profile,
    run_trial,
)
from autosearch.evaluation.trial import TrialPlan, VariantResult
from autosearch.evaluation.user import checked_figures, next_epoch
from autosearch.storage._urls import connection_lost, database, root_cause
from autosearch.storage.artifacts import Artifacts
from autosearch.study import records
from autosearch.study.claims import BudgetReached, Claim, Claims
from autosearch.study.dataset import StudyData
from autosearch.study.definition import trial_seed
from autosearch.study.overlays import check_latency_model
from autosearch.study.plans import Planner
from autosearch.study.records import FINISHED, Record, provenance
from autosearch.study.replay import ControllerReplay
from autosearch.study.results import on_front
from autosearch.study.trials import StoredTrials
from autosearch.tracking.tracker import Tracker
from autosearch.training.runtime import broadcast_object, world
from autosearch.training.train import EpochResult, TrainConfig
from autosearch.workers._failpoints import failpoint
from autosearch.workers._heartbeat import worker_id
from autosearch.workers.interrupts import Interrupts

__all__ = [
    "DROPPED",
    "PLATFORM_FAILURES",
    "UNBOUNDED",
    "AllClaimed",
    "AskedTrial",
    "Asker",
    "EpochCallback",
    "RecordCallback",
    "SearchLoop",
    "SearchParts",
    "check_run",
    "check_timeout",
    "deadline",
    "platform_error",
]

logger = logging.getLogger(__name__)

_MAX_DUPLICATE_ASKS = 100
UNBOUNDED = 2**62  # the trials of a run that only a time budget ends
_MAX_DROPPED = 10
DROPPED = "dropped"  # run_one's answer for a trial another worker took over

# The platform's failures, not the candidate's: the storage, or a disk read-only, full or gone.
PLATFORM_FAILURES = (PlatformError, OSError, StorageInternalError, sqlalchemy.exc.SQLAlchemyError)


def platform_error(exc: BaseException, storage: str) -> PlatformError:
    """A platform failure as one line that names what failed."""
    if isinstance(exc, PlatformError):
        return exc
    if isinstance(exc, OSError) and exc.filename:
        return PlatformError(f"cannot use {exc.filename}: {exc.strerror or exc}")
    lost = connection_lost(exc)
    if lost is not None:  # Optuna's wrapper blames "invalid data in the commit" for all
        return PlatformError(
            f"storage {storage}: the connection to the database was lost ({lost}); run the "
            "same command again to go on (a trial it held resumes from its checkpoint)"[:500]
        )
    cause = root_cause(exc) if isinstance(exc, StorageInternalError) else exc  # as above
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return PlatformError(f"storage {storage} failed: {type(cause).__name__}: {first}"[:500])


class AllClaimed(SpaceExhausted):
    """Every architecture this loop was given to run is held by a trial (a loop over a
    fixed list: autosearch.weight_sharing.confirm)."""


RecordCallback = Callable[[Record], None]
EpochCallback = Callable[[int, EpochResult], None]
Teacher = Callable[[Mapping[str, float]], nn.Module | None]


@dataclass(frozen=True, kw_only=True)
class SearchParts:
    """What a search loop works with, each part narrow (the facade composes them): the
    study's name and storage URL (for messages), its objectives and seed, its stored
    trials, the claims and the controller's replay, where attempts keep their work, how
    an architecture is evaluated, the data, the distillation teacher, the heartbeat
    interval, the attributes this worker adds to each trial, and what shows its trials
    live (MLflow, TensorBoard: autosearch.tracking)."""

    name: str
    where: str
    objectives: tuple[str, ...]
    seed: int
    trials: StoredTrials
    claims: Claims
    replay: ControllerReplay
    artifacts: Artifacts
    planner: Planner
    data: StudyData
    teacher: Teacher
    heartbeat_interval: float
    worker_attrs: Mapping[str, Any] = field(default_factory=dict)
    tracker: Tracker | None = None
    uid: str = ""  # the study's creation id (autosearch.study.stored.study_uid)


class SearchLoop:
    """Runs trials of a study in this process until told how many, or interrupted."""

    def __init__(
        self,
        parts: SearchParts,
        *,
        callbacks: list[RecordCallback],
        epoch_callbacks: list[EpochCallback],
        max_failures_in_a_row: int,
        total: int | None = None,
        deadline: float | None = None,
    ) -> None:
        self.parts = parts
        self.callbacks, self.epoch_callbacks = callbacks, epoch_callbacks
        self.max_failures = max_failures_in_a_row
        self.total = total  # the study's trials to run to, across workers (None: no cap)
        # The time budget's end (time.time()): no trial is claimed after it; one that
        # runs then finishes.
        self.deadline = deadline
        self.interrupts = Interrupts()

    def run(self, n_trials: int) -> list[Record]:
        if n_trials:
            trials, definition = self.parts.trials, self.parts.planner.definition
            check_latency_model(trials.storage, trials.study_id, self.parts.name, definition)
        try:
            return self._run(n_trials, [])
        finally:
            if self.parts.tracker is not None:
                self.parts.tracker.close()

    def _run(self, n_trials: int, done: list[Record]) -> list[Record]:
        failures = dropped = 0
        while len(done) < n_trials and not self.interrupted:
            if self.deadline is not None and time.time() >= self.deadline:
                logger.info("study %r: the time budget is spent; no new trial", self.parts.name)
                break
            try:
                record = self.run_one()
            except (AllClaimed, BudgetReached):
                break
            except SpaceExhausted as exc:
                logger.warning("%s; study %r ends here", exc, self.parts.name)
                break
            if record is None:  # interrupted: the trial resumes next time
                break
            if record == DROPPED:  # another worker took it over while this one stalled
                dropped += 1
                if dropped >= _MAX_DROPPED:
                    raise StudyError(
                        f"{dropped} trials in a row were taken over by other workers while "
                        "this one ran them: is this worker stalling (swapping, paused)? Raise "
                        "AUTOSEARCH_HEARTBEAT_GRACE if its pauses are expected"
                    )
                continue
            assert isinstance(record, Record)
            done.append(record)
            dropped = 0
            failures = failures + 1 if record.state == "failed" else 0
            for callback in self.callbacks:
                callback(record)
            if failures >= self.max_failures:
                raise StudyError(
                    f"{failures} trials failed in a row in study {self.parts.name!r}; the last "
                    f"said: {record.reason}. Fix the setup (data, training config) before resuming"
                )
        return done

    def run_one(self) -> Record | str | None:
        """Claim and run one trial: its record; None when interrupted; DROPPED when
        another worker took it over.

        Raises:
            PlatformError: storage, artifact or checkpoint I/O failed; the trial stays
                resumable and nothing was told to the controller.
            StudyError: the study was deleted from its storage meanwhile.
        """
        try:
            return self._run_one()
        except KeyError:  # Optuna's "Record does not exist.": is the study still there?
            deleted = self.deleted()
            if deleted is None:
                raise
            raise deleted from None

    def deleted(self) -> StudyError | None:
        """The error to stop with when the database (not Optuna's cache) no longer holds
        the study (deleted while this worker ran, its trials with it); else None."""
        trials = self.parts.trials
        try:
            database(trials.storage).get_study_name_from_id(trials.study_id)
            return None
        except KeyError:
            return StudyError(
                f"study {self.parts.name!r} was deleted from {self.parts.where} while this "
                "worker ran (its trials with it); the worker stops and stores nothing more"
            )

    def _run_one(self) -> Record | str | None:
        parts = self.parts
        claim = self.claim()
        with parts.claims.beating(claim.trial_id, parts.heartbeat_interval):
            return self._run_claimed(claim)

    def _run_claimed(self, claim: Claim) -> Record | str | None:
        parts = self.parts
        plan = self._plan(claim)
        logger.debug("trial %d: %s", claim.number, parts.planner.space.describe(claim.arch))
        track = _Tracked(parts, claim, plan)
        history: tuple[EpochResult, ...] = ()
        try:
            if plan.work is not None:
                parts.artifacts.start_attempt(claim.arch, claim.number)
            if world()[1] > 1:  # the other ranks train it too
                broadcast_object({"arch": claim.arch.to_json(), "number": claim.number})
            track.started()
            result = run_trial(plan, parts.data.training, StudyContext(self, claim, track))
            history = result.history
            outcome = self._store(claim, result)
        except (TakenOver, UpdateFinishedTrialError) as exc:
            logger.warning(
                "trial %d was taken over by another worker (%s); dropping it", claim.number, exc
            )
            parts.artifacts.drop_attempt(claim.arch, claim.number)
            return DROPPED
        except (Interrupted, KeyboardInterrupt) as exc:
            parts.claims.supersede(
                claim.trial_id, f"interrupted by the user ({exc}); it resumes from its checkpoint"
            )
            track.ended(reason=f"interrupted ({exc or 'Ctrl-C'})")
            if isinstance(exc, KeyboardInterrupt):
                raise
            return None
        except PLATFORM_FAILURES as exc:
            raise self._release(claim, platform_error(exc, parts.where)) from None
        except Exception as exc:  # the candidate's own failure ends this trial only
            if isinstance(exc, KeyError) and self.deleted() is not None:
                raise
            logger.warning(
                "trial %d failed", claim.number, exc_info=not isinstance(exc, AutosearchError)
            )
            failed = self._fail(claim, f"{type(exc).__name__}: {exc}")
            if failed is None:
                return DROPPED
            outcome = failed
        try:
            failpoint("tell.before")
            self._tell(claim, outcome)
            record = parts.trials.record(claim.number)
        except PLATFORM_FAILURES as exc:  # stored already: it is told on the next replay
            raise platform_error(exc, parts.where) from None
        track.ended(history=history)
        logger.debug("trial %d %s: %s", claim.number, record.state, _summary(record))
        return record

    # A trial run by the user's own loop (ask and tell, below): claimed, then ended.
    def claim(self) -> Claim:
        """Claim the next trial as :meth:`run_one` does (a cut one first, else the
        controller's next architecture), for a loop of the user's own.

        Raises:
            PlatformError: the storage failed; StudyError: the study was deleted.
        """
        parts = self.parts
        try:
            return parts.claims.claim(self._propose, self._attrs, limit=self.total)
        except sqlalchemy.exc.IntegrityError as exc:
            raise self.deleted() or platform_error(exc, parts.where) from None
        except PLATFORM_FAILURES as exc:
            raise platform_error(exc, parts.where) from None

    def end(self, claim: Claim, result: TrialResult | None, reason: str = "") -> Record | None:
        """Store a claimed trial's ``result`` (or its failure, ``reason``), tell the
        controller; its record, or None where another worker took it over meanwhile."""
        parts = self.parts
        try:
            if result is None:
                outcome = self._fail(claim, reason)
                if outcome is None:
                    return None
            else:
                outcome = self._store(claim, result)
            self._tell(claim, outcome)
            return parts.trials.record(claim.number)
        except (TakenOver, UpdateFinishedTrialError):
            parts.artifacts.drop_attempt(claim.arch, claim.number)
            return None
        except PLATFORM_FAILURES as exc:
            raise self._release(claim, platform_error(exc, parts.where)) from None

    def _plan(self, claim: Claim) -> TrialPlan:
        """How the claimed trial is evaluated."""
        return self.parts.planner.plan(claim.arch, number=claim.number)

    def _tell(self, claim: Claim, outcome: Outcome) -> None:
        """Tell the controller the trial's outcome (and save its state)."""
        self.parts.replay.tell(claim.number, claim.arch, outcome)

    def _store(self, claim: Claim, result: TrialResult) -> Outcome:
        """Write the trial's result (one attribute), its state and objective values
        (at once where the storage is a database); only then is the work of its attempts
        no longer needed. A trial no longer ours raises UpdateFinishedTrialError there
        (TakenOver before its weights are uploaded)."""
        parts = self.parts
        weights = digest = None
        if result.model is not None:
            lost = parts.claims.taken_over(claim.trial_id)
            if lost is not None:
                raise TakenOver(lost)
            weights, digest = parts.artifacts.save_weights(
                parts.claims.storage, claim.trial_id, result.model
            )
            failpoint("store.weights")
        stopped = result.status == "stopped"
        parts.claims.store(
            claim.trial_id,
            records.encode(result, weights=weights, weights_digest=digest),
            best=None if stopped else result.best.name,
            values=None if stopped else records.objective_values(result, parts.objectives),
        )
        parts.artifacts.finish(claim.arch)
        return result.outcome(parts.objectives)

    def _fail(self, claim: Claim, reason: str) -> Outcome | None:
        """Store the candidate's failure; None when the trial is no longer ours."""
        try:
            self.parts.claims.fail(claim.trial_id, reason)
        except UpdateFinishedTrialError:
            return None
        self.parts.artifacts.finish(claim.arch)
        return Outcome.failed(reason)

    def _release(self, claim: Claim, error: PlatformError) -> PlatformError:
        """After a platform failure: mark the trial resumable, if the storage still
        takes writes (else its silent heartbeat gives it to the next worker)."""
        try:
            self.parts.claims.supersede(
                claim.trial_id, f"platform failure ({error}); it resumes from its checkpoint"
            )
        except Exception:
            logger.warning(
                "trial %d stays running; it resumes once its heartbeat is stale", claim.number
            )
        return error

    def _propose(self, trials: list[FrozenTrial]) -> Architecture:
        """The controller's next architecture that no trial holds or has evaluated."""
        parts = self.parts
        parts.replay.sync(trials)
        held = parts.claims.index.read(trials)
        controller, space = parts.replay.controller, parts.planner.space
        for _ in range(_MAX_DUPLICATE_ASKS):
            arch = space.canonicalize(controller.ask())
            known = held.last(arch.arch_id)
            if known is None:
                return arch
            # Already evaluated: hand the controller the stored result instead of retraining.
            if known.state in FINISHED:
                controller.tell(arch, records.outcome(known, parts.objectives))
        return unseen_architecture(
            space,
            held,
            np.random.default_rng(len(trials)),
            why=f"the controller proposed only evaluated architectures {_MAX_DUPLICATE_ASKS} "
            "times in a row",
        )

    def _attrs(self, arch: Architecture) -> dict[str, Any]:
        parts = self.parts
        return {
            "seed": trial_seed(parts.seed, arch),
            "data_hash": parts.data.hash,
            "provenance": provenance(),
            "worker": worker_id(),
            **parts.worker_attrs,
        }

    @property
    def interrupted(self) -> bool:
        return self.interrupts.requested

    @property
    def signal(self) -> str | None:
        """The signal that interrupted the run, if one did."""
        return self.interrupts.signal

    def graceful_interrupts(self) -> AbstractContextManager[Interrupts]:
        """While the loop runs (in the main thread): the first Ctrl-C or SIGTERM asks the
        running trial to stop after its epoch's checkpoint; a second Ctrl-C stops at once.
        :attr:`signal` names the signal that stopped the run."""
        return self.interrupts.handled()


class _Tracked:
    """A claimed trial told to the study's tracker (where tracking is on): its run
    started (continued where it resumes one), its epochs, its stored records."""

    def __init__(self, parts: SearchParts, claim: Claim, plan: TrialPlan) -> None:
        self.parts, self.claim, self.plan = parts, claim, plan
        self.tracker = parts.tracker if parts.tracker is not None and parts.tracker.on else None
        self.key = parts.claims.key(claim.arch)

    def started(self) -> None:
        if self.tracker is None:
            return
        resumes, resumed_at = self.claim.resumes, 0
        if resumes is not None:  # the epochs its earlier attempt checkpointed
            resumed_at = max(self.parts.trials.get(resumes).intermediate_values, default=0)
        worker = str(self.parts.worker_attrs.get("worker") or worker_id())
        self.tracker.trial_started(self.key, self.claim.number, self.plan, first=resumes is None,
                                   resumed_at=resumed_at, worker=worker,
                                   first_number=self._first_attempt())  # fmt: skip

    def _first_attempt(self) -> int:
        """The number of the trial's first attempt (a resumed trial's curve goes on in
        that attempt's folder), following what each attempt resumed."""
        number, resumes = self.claim.number, self.claim.resumes
        for _ in range(1000):  # a chain of attempts: bounded against a damaged store
            if resumes is None:
                break
            number = resumes
            resumes = self.parts.trials.get(number).user_attrs.get(records.RESUMES)
            resumes = resumes if isinstance(resumes, int) and resumes < number else None
        return number

    def epoch(self, epoch: EpochResult) -> None:
        if self.tracker is not None:
            self.tracker.epoch(self.key, epoch)

    def ended(self, *, reason: str = "", history: Sequence[EpochResult] = ()) -> None:
        """The trial's end: its stored records, and its whole ``history`` (where the
        trial resumed, the epochs an earlier attempt may not have sent)."""
        if self.tracker is None:
            return
        stored = None if reason else self.parts.trials.get(self.claim.number)
        found = self.parts.trials.decode(stored) if stored else []
        facts = records.result_facts(stored) if stored else {}
        self.tracker.trial_ended(
            self.key, self.plan, found, reason=reason, facts=facts, history=history
        )


class StudyContext(TrialContext):
    """What a running trial may ask of its study, answered from storage."""

    def __init__(self, loop: SearchLoop, claim: Claim, track: _Tracked | None = None) -> None:
        self.loop, self.claim, self.track = loop, claim, track

    def epoch_done(self, epoch: EpochResult) -> None:
        parts = self.loop.parts
        # The curve first: the epoch's checkpoint is on this disk already, so a bucket
        # failure in the push below must not leave the epoch out of the resumed curve.
        parts.claims.report(self.claim.trial_id, epoch.epoch, epoch.val_accuracy)
        self.work_saved()  # the epoch's checkpoint, to the bucket (where there is one)
        failpoint("epoch.saved")
        if self.track is not None:
            self.track.epoch(epoch)
        for callback in self.loop.epoch_callbacks:
            callback(self.claim.number, epoch)

    def work_saved(self) -> None:
        artifacts = self.loop.parts.artifacts
        if artifacts.remote is not None and self.taken_over() is None:  # else: not ours
            artifacts.push(self.claim.arch, self.claim.number)

    def interrupted(self) -> bool:
        return self.loop.interrupted

    def taken_over(self) -> str | None:
        return self.loop.parts.claims.taken_over(self.claim.trial_id)

    def peers(self) -> Mapping[int, Mapping[int, float]]:
        return {
            number: curve
            for number, curve in self.loop.parts.trials.curves().items()
            if number != self.claim.number
        }

    def on_front(self, metrics: Mapping[str, float]) -> bool:
        return on_front(self.loop.parts.trials.records(variants=False), metrics)

    def teacher(self, metrics: Mapping[str, float]) -> nn.Module | None:
        return self.loop.parts.teacher(metrics)


def _summary(record: Record) -> str:
    if record.state == "failed":
        return record.reason
    accuracy = record.metrics.get("accuracy")
    return f"{record.description}, val {accuracy:.4f}" if accuracy is not None else ""


def check_timeout(timeout: float | None) -> None:
    """A time budget is None or a positive, finite number of seconds."""
    if timeout is None:
        return
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ConfigError(f"timeout must be None or a number of seconds > 0, got {timeout!r}")


def deadline(timeout: float | None) -> float | None:
    """The end of a time budget of ``timeout`` seconds from now (time.time()), or None."""
    return None if timeout is None else time.time() + float(timeout)


def check_run(
    n_trials: int,
    n_workers: int,
    max_failures_in_a_row: int,
    epoch_callbacks: list[EpochCallback],
    *,
    ranks: int,
    total: int | None = None,
    here: bool | None = None,
    timeout: float | None = None,
) -> None:
    """Refuse ``optimize`` settings that cannot run, before anything runs (``here``:
    whether the trials run in this process; by default, with one worker)."""
    check_timeout(timeout)
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise ConfigError(f"total must be None or an integer >= 0, got {total!r}")
    for name, value, least in (
        ("n_trials", n_trials, 0),
        ("n_workers", n_workers, 1),
        ("max_failures_in_a_row", max_failures_in_a_row, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}")
    if not (n_workers == 1 if here is None else here) and (ranks > 1 or epoch_callbacks):
        raise ConfigError(
            "n_workers > 1 (or a Ray or Slurm executor) runs trials in other processes: "
            "it cannot be combined with torchrun, and epoch_callbacks (called in the "
            "process that trains) need n_workers=1 on this machine; use callbacks=, "
            "called here as each trial finishes"
        )


# Ask and tell: the same claims and ends, for a loop of the user's own ------------------
@dataclass(eq=False)
class AskedTrial:
    """A candidate the study handed to the user's loop; tell it back with
    :meth:`autosearch.Study.tell`.

    Attributes:
        number: The trial's number in the study.
        arch: Its architecture; ``description`` says it in a line.
        hyperparameters: Its searched training settings (the space's training genes).
        config: The study's training settings with those applied.
        seed: The trial's seed.
    """

    number: int
    arch: Architecture
    description: str
    hyperparameters: Mapping[str, Any]
    config: TrainConfig
    seed: int
    _claim: Claim = field(repr=False)
    _plan: TrialPlan = field(repr=False)
    _data: Dataset | None = field(repr=False)
    _held: contextlib.ExitStack = field(repr=False)
    _asker: Asker = field(repr=False)
    _epochs: list[int] = field(default_factory=list, repr=False)
    told: bool = False

    def build(self) -> nn.Module:
        """The network, built for the study's data and initialised with the trial's seed
        (the same network an evaluator or the study's trainer starts from)."""
        if self._data is None:
            raise StudyError("a table study trains nothing: there is no network to build")
        with torch.random.fork_rng(devices=[]):
            return candidate_builder(self._plan, self._data)()

    def report(self, epoch: int, accuracy: float) -> bool:
        """After epoch ``epoch`` (1, 2, ... in order): its validation ``accuracy``,
        stored as the trial's learning curve. Whether early stopping would stop the
        trial here (as Optuna's ``should_prune``): tell it then with its figures so far.

        Raises:
            ConfigError: an epoch out of order, an accuracy not in [0, 1], or a trial
                already told.
        """
        self._asker.check_open(self)
        value = next_epoch(self._epochs, epoch, accuracy, error=ConfigError)
        return self._asker.record_epoch(self, epoch, value)


class Asker:
    """The ask-and-tell side of one study: its search loop's claims and ends, for trials
    the user's loop runs."""

    def __init__(self, loop: SearchLoop, data: Dataset | None, heartbeat_interval: float):
        self.loop, self.data, self.heartbeat_interval = loop, data, heartbeat_interval

    def ask(self) -> AskedTrial:
        """Claim the next trial and hold it (its heartbeat) until it is told."""
        parts = self.loop.parts
        claim = self.loop.claim()
        held = contextlib.ExitStack()
        held.enter_context(parts.claims.beating(claim.trial_id, self.heartbeat_interval))
        plan = parts.planner.plan(claim.arch, number=claim.number)
        if plan.work is not None:
            parts.artifacts.start_attempt(claim.arch, claim.number)
        return AskedTrial(
            number=claim.number,
            arch=claim.arch,
            description=plan.space.describe(claim.arch),
            hyperparameters=dict(plan.space.train_overrides(claim.arch)),
            config=plan.config,
            seed=plan.seed,
            _claim=claim,
            _plan=plan,
            _data=self.data,
            _held=held,
            _asker=self,
        )

    def check_open(self, trial: AskedTrial) -> None:
        if not isinstance(trial, AskedTrial) or trial._asker is not self:
            raise ConfigError(
                f"tell() takes a trial this study's ask() returned, got {type(trial).__name__}"
            )
        if trial.told:
            raise ConfigError(f"trial {trial.number} was told already")

    def record_epoch(self, trial: AskedTrial, epoch: int, value: float) -> bool:
        parts = self.loop.parts
        parts.claims.report(trial._claim.trial_id, epoch, value)
        rule = trial._plan.early_stopping
        if rule is None:
            return False
        peers = {n: curve for n, curve in parts.trials.curves().items() if n != trial.number}
        return rule.should_stop(
            trial=trial.number,
            epoch=epoch,
            epochs=trial.config.epochs,
            value=value,
            others=peers,
        )

    def tell(
        self,
        trial: AskedTrial,
        figures: Mapping[str, float] | None = None,
        *,
        model: nn.Module | None = None,
        failed: str | None = None,
        stopped: bool = False,
    ) -> Record | None:
        """Store ``trial``'s ``figures`` (at least ``"accuracy"``) and tell the
        controller; or its failure (``failed``: the reason). ``model``: the trained
        network, stored as the trial's weights (export and rerun use them) and measured
        (FLOPs, parameters, bytes, latency); without it the costs are counted from the
        architecture. ``stopped``: the loop stopped it early (its figures so far), as
        early stopping does. Its record; None where another worker took the trial over."""
        self.check_open(trial)
        if (figures is None) == (failed is None):
            raise ConfigError("tell() takes the trial's figures, or failed='the reason'")
        try:
            if failed is not None:
                return self.loop.end(trial._claim, None, reason=f"told failed: {failed}"[:2000])
            try:
                result = self._result(trial, figures, model, stopped=stopped)
            except TrialFailed as exc:  # what was told cannot be stored: the trial fails
                return self.loop.end(trial._claim, None, reason=str(exc))
            return self.loop.end(trial._claim, result)
        finally:
            trial.told = True
            trial._held.close()

    def _result(
        self,
        trial: AskedTrial,
        figures: Mapping[str, float] | None,
        model: nn.Module | None,
        *,
        stopped: bool,
    ) -> TrialResult:
        plan, data = trial._plan, self.data
        told = checked_figures(figures, name="tell()", needed=plan.needs)
        if model is not None and data is not None:
            derived = Derived(model=model, float_model=model)
            costs = profile(derived, data, latency=plan.compression.latency)
        else:
            shape = data.input_shape if data is not None else plan.space.budget_input
            classes = data.num_classes if data is not None else plan.space.budget_classes
            cost = plan.space.cost(plan.arch, input_shape=shape, num_classes=classes)
            costs = {
                "flops": float(cost.flops),
                "macs": float(cost.macs),
                "params": float(cost.params),
            }
        metrics = {**costs, **told}
        if stopped and trial._epochs:
            metrics["stopped_at_epoch"] = float(trial._epochs[-1])
        metrics["reward"] = plan.reward(metrics)
        return TrialResult(
            status="stopped" if stopped else "complete",
            points=(VariantResult(name="base", metrics=metrics),),
            model=None if stopped else model,
            evaluated_by="evaluator",
        )
