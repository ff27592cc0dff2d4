"""A study's supernet: its training, a job that exactly one worker does, and the
evaluator its trials are scored with (autosearch.weight_sharing.supernet trains and evaluates; this
file keeps the job in the study's storage and artifacts).

Whoever starts it (``autosearch run`` on several machines at once, ``autosearch
supernet``, ``study.supernet.train()``), the training is claimed through the storage
(autosearch.study.jobs): one worker trains, the others wait for its result, and a
worker that dies is taken over after the heartbeat grace, from its last checkpoint.
Each claim's per-epoch checkpoint lives in ``ARTIFACTS/supernet/JOB/N/`` (JOB: a hash
of the study's id, its supernet, the training settings and the round; N: the claim;
mirrored to the bucket), so a killed run resumes on this machine or another, and a
stalled worker that wakes up never overwrites its successor's checkpoint.

The stored state (autosearch.weight_sharing.state) names the weights and their content
hash; every trial records the hash of the weights that scored it. Weights found missing
or changed are never used: every message names the command that trains them again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn as nn
from optuna.storages import BaseStorage

from autosearch.data import Dataset
from autosearch.errors import AutosearchError, ExportError, PlatformError, StudyError
from autosearch.evaluation.trial import TRAIN_STATE, Interrupted, TakenOver
from autosearch.space import SearchSpace
from autosearch.storage.artifacts import Artifacts
from autosearch.study.definition import StudyDefinition
from autosearch.study.jobs import Done, Held, JobClaim, Jobs
from autosearch.training.runtime import any_rank, broadcast_object, resolve, world
from autosearch.training.train import EpochResult
from autosearch.weight_sharing import file as supernet_file
from autosearch.weight_sharing import progress as supernet_progress
from autosearch.weight_sharing.state import SupernetState
from autosearch.weight_sharing.supernet import (
    SubnetEvaluator,
    fingerprint,
    train_supernet,
    weights_digest,
)
from autosearch.workers._heartbeat import beating
from autosearch.workers.interrupts import Interrupts

__all__ = ["REPAIR", "SupernetJob"]

logger = logging.getLogger(__name__)

_ATTR = "autosearch:supernet"
REPAIR = (
    "train it again: `autosearch supernet STUDY_FILE --retrain` (Python: "
    "study.supernet.train(retrain=True))"
)
_MAX_TAKEOVERS = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Attempt:
    """What every rank trains: the job, its round, and the claim rank 0 holds."""

    job: str
    round: int
    claim: JobClaim

    @property
    def number(self) -> int:
        return self.claim.number


class SupernetJob:
    """The supernet of one study (``study``: its name), from what it reads: the
    storage and the study's id and creation ``uid``, its definition (the supernet and
    training configs, the seed), the elastic space, the artifacts, and the heartbeat
    (interval, grace)."""

    def __init__(
        self,
        *,
        study: str,
        storage: BaseStorage,
        study_id: int,
        uid: str,
        definition: StudyDefinition,
        space: SearchSpace,
        artifacts: Artifacts,
        heartbeat: tuple[float, float],
    ) -> None:
        self.study, self.storage, self.study_id, self.uid = study, storage, study_id, uid
        config = definition.supernet
        if config is None:
            raise StudyError(f"study {study!r} has no supernet (create it with supernet=...)")
        self.config, self.settings = config, config.train or definition.train
        self.seed = definition.seed
        self.space, self.artifacts = space, artifacts
        self.interval, grace = heartbeat
        self.jobs = Jobs(storage, study, grace=grace)
        self.interrupts = Interrupts()
        self._loaded: tuple[str, nn.Module, str] | None = None  # (weights, net, digest)
        # Called with each epoch this process trains (rank 0): the study's live tracking.
        self.on_epoch: Callable[[EpochResult], None] | None = None
        self._waited = False  # said once that another worker trains it

    # The stored state -------------------------------------------------------------------
    def stored(self) -> SupernetState | None:
        """The stored state of the study's supernet (None: never trained).

        Raises:
            StudyError: the stored state is damaged (says how to train it again).
        """
        found = self.storage.get_study_system_attrs(self.study_id).get(_ATTR)
        if found is None:
            return None
        try:
            return SupernetState.read(found)
        except ValueError as exc:
            raise StudyError(
                f"study {self.study!r}: its stored supernet state is damaged ({exc}); {REPAIR}"
            ) from None

    def fingerprint(self, data: Dataset) -> str:
        return fingerprint(self.space, data.input_shape, data.num_classes)  # type: ignore[arg-type]

    def trained(self, data: Dataset) -> SupernetState | None:
        """The stored state, if it is of this study's supernet."""
        state = self.stored()
        return state if state is not None and state.fingerprint == self.fingerprint(data) else None

    # Training ------------------------------------------------------------------------------
    def train(
        self, data: Dataset, *, retrain: bool = False, show_progress_bar: bool | None = None
    ) -> SupernetState | None:
        """Train the supernet (or import the weights its config names) unless it is
        trained; its stored state (None on the other ranks under torchrun). A worker
        that finds another training it waits for that one's result.

        ``retrain``: train it again when its stored weights are missing or damaged
        (without it, that is refused with a PlatformError naming the command).

        Raises:
            Interrupted: SIGTERM stopped it after an epoch's checkpoint (KeyboardInterrupt
                for Ctrl-C); the next run resumes from it.
        """
        with self.interrupts.handled():
            for _ in range(_MAX_TAKEOVERS):
                decided = self._agree(lambda: self._decide(data, retrain))
                if not isinstance(decided, _Attempt):
                    return decided
                try:
                    return self._attempt(data, decided, show_progress_bar)
                except TakenOver as exc:
                    logger.warning("study %s: supernet training taken over (%s)", self.study, exc)
        raise StudyError(
            f"study {self.study!r}: this worker's supernet training was taken over "
            f"{_MAX_TAKEOVERS} times (it stalls past AUTOSEARCH_HEARTBEAT_GRACE); raise the grace"
        )

    def _agree(self, decide: Callable[[], SupernetState | _Attempt]) -> Any:
        """Rank 0 decides; every rank gets its decision (or its error)."""
        rank, size = world()
        if size == 1:
            return decide()
        decided: Any = None
        if rank == 0:
            try:
                decided = decide()
            except AutosearchError as exc:
                broadcast_object(("error", str(exc)))
                raise
        found = broadcast_object(("ok", decided if rank == 0 else None))
        if found[0] == "error":
            raise StudyError(found[1])
        return found[1] if rank != 0 else decided

    def _decide(self, data: Dataset, retrain: bool) -> SupernetState | _Attempt:
        """The trained state, or a claim on training it (after waiting for any worker
        that holds one)."""
        fp = self.fingerprint(data)
        try:
            state = self.trained(data)
        except StudyError:  # its stored state is damaged
            if not retrain:
                raise
            state = None
        round_ = self._next_round(fp) if retrain else 0
        if state is not None:
            problem = self._problem(state, data)
            if problem is None:
                return state
            if not retrain:
                raise PlatformError(f"{problem}; {REPAIR}")
            logger.warning("%s; training it again", problem)
        job = self._job(fp, round_)
        found = self.jobs.acquire(job, wait=self._wait)
        if isinstance(found, Done):
            return self._adopt(found, data)
        return _Attempt(job=job, round=round_, claim=found)

    def _next_round(self, fp: str) -> int:
        """The round after the last one that finished: training again never adopts a
        finished round's result (whose weights were lost), and resumes a round that was
        cut short."""
        key = self._job(fp, 0).rsplit("-r", 1)[0]
        rounds = [
            int(job.rsplit("-r", 1)[1])
            for job in self.jobs.names(finished=True)
            if job.startswith(f"{key}-r") and job.rsplit("-r", 1)[1].isdigit()
        ]
        return max(rounds, default=-1) + 1

    def _adopt(self, done: Done, data: Dataset) -> SupernetState:
        """The state another worker's claim finished with, stored as the study's once
        checked (this study's supernet, its weights there and fitting); else StudyError,
        saying how to train it again."""
        try:
            state = SupernetState.read(done.result)
            problem = self._problem(state, data)
        except ValueError as exc:
            problem = f"damaged ({exc})"
        if problem is not None:
            raise StudyError(
                f"study {self.study!r}: the supernet job's result (claim {done.number}) "
                f"cannot be used: {problem}; {REPAIR}"
            )
        self._publish(state)
        return state

    def _wait(self, held: Held) -> None:
        """Between reads while another worker trains: sleep a heartbeat interval, in
        slices, so that Ctrl-C or SIGTERM stops the wait at once."""
        logger.log(
            logging.DEBUG if self._waited else logging.WARNING,
            "study %s: worker %s trains the supernet (claim %d); waiting for it",
            self.study,
            held.worker,
            held.number,
        )
        self._waited = True
        deadline = time.monotonic() + self.interval
        while time.monotonic() < deadline:
            if self.interrupts.requested:
                raise _interrupted(self.interrupts.signal)
            time.sleep(min(0.2, self.interval))

    def _attempt(self, data: Dataset, attempt: _Attempt, show: bool | None) -> SupernetState | None:
        """Train (or import) on every rank under rank 0's claim; rank 0 stores."""
        rank = world()[0]
        claim = attempt.claim if rank == 0 else None
        beat = beating(self.storage, claim.trial_id, self.interval, stamped=True) if claim else None
        with beat or nullcontext():
            net = self._build(data)
            try:
                info = self._run(net, data, attempt, claim, show)
                return self._store(net, data, info, attempt, claim) if claim else None
            except TakenOver:
                if claim is not None:
                    self.artifacts.drop_job(attempt.job, attempt.number)
                raise
            except (Interrupted, KeyboardInterrupt) as exc:
                self._give_up(claim, f"interrupted ({exc}); it resumes from its checkpoint")
                raise
            except BaseException as exc:
                self._give_up(claim, f"{type(exc).__name__}: {exc}")
                raise

    def _give_up(self, claim: JobClaim | None, reason: str) -> None:
        if claim is not None:
            try:
                self.jobs.give_up(claim, reason)
            except Exception:  # the storage itself failed: the silent heartbeat frees it
                logger.warning("the supernet's claim stays until its heartbeat is stale")

    def _run(
        self,
        net: nn.Module,
        data: Dataset,
        attempt: _Attempt,
        claim: JobClaim | None,
        show: bool | None,
    ) -> dict[str, Any]:
        """Import the configured weights, or train from the claim's folder."""
        if self.config.weights:
            return supernet_file.load(net, self.config.weights, self.fingerprint(data))
        work = self.artifacts.start_job(attempt.job, attempt.number) if claim else None
        work = broadcast_object(work)
        rank, _ = world()
        start = time.perf_counter()
        with supernet_progress.shown(self.settings.epochs, False if rank else show) as shown:

            def epoch_done(epoch: EpochResult) -> None:
                shown(epoch)
                if self.on_epoch is not None and rank == 0:
                    self.on_epoch(epoch)
                asked = any_rank(self.interrupts.requested)  # a signal to any rank
                stop = self._should_stop(claim, attempt, asked) if claim else None
                stop = broadcast_object(stop)
                if stop is not None:
                    raise stop

            result = train_supernet(
                net,
                self.space,
                data,
                self.settings,
                self.config,
                seed=self.seed,
                checkpoint=work / TRAIN_STATE,
                on_epoch=epoch_done,
            )
        return {
            "epochs": len(result.history),
            "seconds": result.seconds,
            "wall_seconds": time.perf_counter() - start,
            "precision": result.precision,
            "world_size": result.world_size,
            "history": [vars(e) for e in result.history],
        }

    def _should_stop(self, claim: JobClaim, attempt: _Attempt, asked: bool) -> BaseException | None:
        """After an epoch (its checkpoint written): stop when the claim was taken over
        or the user asked; else send the checkpoint to the bucket."""
        lost = self.jobs.taken_over(claim)
        if lost is not None:
            return TakenOver(lost)
        if asked:
            return _interrupted(self.interrupts.signal)
        self.artifacts.push_job(attempt.job, attempt.number)
        return None

    def _store(
        self,
        net: nn.Module,
        data: Dataset,
        info: dict[str, Any],
        attempt: _Attempt,
        claim: JobClaim,
    ) -> SupernetState:
        """Store the weights as an artifact of the claim, then finish the claim with
        the state: only a claim still held finishes, so one worker's weights count."""
        lost = self.jobs.taken_over(claim)
        if lost is not None:
            raise TakenOver(lost)
        weights, digest = self.artifacts.save_weights(self.storage, claim.trial_id, net)
        state = SupernetState(
            fingerprint=self.fingerprint(data),
            weights=weights,
            digest=digest,
            round=attempt.round,
            **info,
        )
        if not self.jobs.finish(claim, state.to_json(), value=state.seconds):
            self.artifacts.drop_weights(weights)  # the job is another worker's
            raise TakenOver("another worker finished the job first")
        self._publish(state)
        self.artifacts.finish_job(attempt.job)
        self._loaded = (weights, net, state.digest)
        logger.info("study %s: supernet trained (%s)", self.study, state.digest)
        return state

    def _publish(self, state: SupernetState) -> None:
        self.storage.set_study_system_attr(self.study_id, _ATTR, state.to_json())

    def _job(self, fp: str, round_: int) -> str:
        """The job's name (and its work folder's): this study's supernet of this
        fingerprint, trained with these settings, in this round."""
        config = self.config
        what = {
            "study": self.study,
            "uid": self.uid,
            "fingerprint": fp,
            "seed": self.seed,
            "train": dataclasses.asdict(self.settings),
            "rule": [config.sandwich, config.distill, config.schedule]
            + ([config.paths] if config.schedule == "uniform" else []),
            "weights": config.weights,
        }
        key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
        return f"{key}-r{round_}"

    def _build(self, data: Dataset) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)  # the same initial weights on every rank and run
            return self.space.build_supernet(  # type: ignore[attr-defined,no-any-return]
                input_shape=data.input_shape, num_classes=data.num_classes
            )

    # The trained weights -------------------------------------------------------------------
    def load(self, state: SupernetState, data: Dataset) -> tuple[nn.Module, str]:
        """The supernet with its stored weights, and their digest.

        Raises:
            PlatformError: the weights are missing, damaged, changed (their digest is not
                the stored one), or not this supernet's; the message says how to train
                it again.
        """
        if self._loaded is not None and self._loaded[0] == state.weights:
            return self._loaded[1], self._loaded[2]
        try:
            weights = self.artifacts.load_weights(
                state.weights,
                owner=f"the supernet of study {self.study!r}",
                repair=REPAIR,
                expected=state.digest or None,
            )
        except ExportError as exc:
            raise PlatformError(str(exc)) from None
        digest = state.digest or weights_digest(weights)
        net = self._build(data)
        problem = supernet_file.fit(net, weights)
        if problem:
            raise PlatformError(
                f"the stored supernet weights do not fit study {self.study!r}'s supernet "
                f"({problem}); {REPAIR}"
            )
        self._loaded = (state.weights, net, digest)
        return net, digest

    def _problem(self, state: SupernetState, data: Dataset) -> str | None:
        """Why the stored weights cannot be used (None: they can)."""
        if state.fingerprint != self.fingerprint(data):
            return f"it is another supernet's (fingerprint {state.fingerprint})"
        try:
            self.load(state, data)
        except PlatformError as exc:
            return str(exc).removesuffix(f"; {REPAIR}")
        return None

    def evaluator(self, data: Dataset) -> SubnetEvaluator:
        """The evaluator of the trained supernet.

        Raises:
            StudyError: the supernet is not trained yet.
            PlatformError: its weights cannot be used (says how to train it again).
        """
        state = self.trained(data)
        if state is None:
            raise StudyError(self.untrained())
        net, digest = self.load(state, data)
        device = resolve(device=self.settings.device, precision=self.settings.precision).device
        return SubnetEvaluator(
            net,
            self.space,
            data,
            self.config,
            seed=self.seed,
            digest=digest,
            device=device if device.type == "cuda" else "cpu",  # subnets run where it trained
        )

    def export_weights(self, data: Dataset, path: Any) -> Any:
        """Write the trained supernet's weights to ``path`` (see supernet_file.save)."""
        state = self.trained(data)
        if state is None:
            raise StudyError(self.untrained())
        net, digest = self.load(state, data)
        return supernet_file.save(net, path, fingerprint=state.fingerprint, digest=digest)

    def untrained(self) -> str:
        return (
            f"study {self.study!r} evaluates candidates on its supernet, which is not trained "
            "yet: train it first (study.supernet.train(), or `autosearch supernet` with the "
            "study file; `autosearch run` does it before the trials)"
        )


def _interrupted(signal_name: str | None) -> BaseException:
    return KeyboardInterrupt() if signal_name == "SIGINT" else Interrupted(signal_name or "SIGTERM")
