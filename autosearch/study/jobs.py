"""Jobs: work a study needs done exactly once, whoever starts it (the supernet's
training), claimed through the storage the way trials are, without locks.

Each claim on a job is a running trial of the study's companion Optuna study
(``NAME.autosearch-jobs``, made on first use, so the study's own trials, numbers and
Optuna views stay those of its architectures). Trial numbers follow creation order, so
of two workers that claim a job at once the one with the higher number sees the other's
claim and gives its own up; it then waits for the holder. A claim is stamped by a
heartbeat; one silent past the grace period belongs to a dead worker, and a waiting
worker takes the job over (resuming from the dead one's checkpoint).

A job ends when its holder moves its claim from RUNNING to COMPLETE, with the job's
result as a user attribute. A claim that another worker gave up for dead is FAIL
already, and the storage refuses to finish a trial twice: of a stalled holder that
wakes up and the worker that took over, exactly one finishes the job.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optuna.exceptions import DuplicatedStudyError, UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial

from autosearch.errors import StudyError
from autosearch.storage._rdb import TAKEOVER_LOCK_WAIT, TrialLocked
from autosearch.storage._urls import end_trial, trial_number
from autosearch.workers._heartbeat import WORKER, Watch, first_stamp, worker_id

__all__ = ["COMPANION", "Done", "Held", "JobClaim", "Jobs", "companion_name", "is_companion"]

logger = logging.getLogger(__name__)

COMPANION = ".autosearch-jobs"
_JOB = "job"
_RESULT = "job_result"
_GAVE_UP = "gave_up"  # why a claim was given up (lost to another, dead, interrupted)
_MAX_CLAIMS = 100


def companion_name(study: str) -> str:
    """The name of the Optuna study that holds ``study``'s job claims."""
    return f"{study}{COMPANION}"


@dataclass(frozen=True, kw_only=True)
class JobClaim:
    """A job this worker holds: its claim's trial id and number."""

    job: str
    trial_id: int
    number: int


@dataclass(frozen=True, kw_only=True)
class Done:
    """The job is done: the result its finishing claim stored (as stored: check it)."""

    number: int
    result: Any


@dataclass(frozen=True, kw_only=True)
class Held:
    """The job is held by another live worker's claim."""

    number: int
    worker: str


class Jobs:
    """The job claims of one study (``study``: its name), for one worker. ``grace``:
    seconds of heartbeat silence after which a claim's worker counts as dead."""

    def __init__(self, storage: BaseStorage, study: str, *, grace: float) -> None:
        self.storage, self.name, self.grace = storage, companion_name(study), grace
        self._id: int | None = None
        self.watch = Watch()

    @property
    def study_id(self) -> int:
        """The companion study's id (created on first use)."""
        if self._id is None:
            try:
                self._id = self.storage.create_new_study(
                    directions=[StudyDirection.MINIMIZE], study_name=self.name
                )
            except DuplicatedStudyError:
                self._id = self.storage.get_study_id_from_name(self.name)
        return self._id

    # Reading -------------------------------------------------------------------------------
    def _all(self) -> list[FrozenTrial]:
        """Every claim of every job. The companion study deleted (by hand, while this
        worker waited) is made again: the claims start afresh, and a holder whose claim
        vanished finds it taken over (:meth:`taken_over`)."""
        try:
            return self.storage.get_all_trials(self.study_id, deepcopy=False)
        except KeyError:
            logger.warning("the job claims of %s were deleted; claiming afresh", self.name)
            self._id = None
            return self.storage.get_all_trials(self.study_id, deepcopy=False)

    def all_claims(self) -> list[FrozenTrial]:
        """Every claim of every job, as stored."""
        return self._all()

    def claims(self, job: str) -> list[FrozenTrial]:
        """Every claim ever made on ``job``, in number order."""
        return [t for t in self._all() if t.user_attrs.get(_JOB) == job]

    def names(self, *, finished: bool = False) -> set[str]:
        """The jobs ever claimed (``finished``: those done)."""
        done = (TrialState.COMPLETE,) if finished else tuple(TrialState)
        return {str(t.user_attrs.get(_JOB)) for t in self._all() if t.state in done}

    def holder(self, claims: list[FrozenTrial]) -> FrozenTrial | None:
        """The live claim that holds the job: the lowest-numbered running one."""
        return next((t for t in claims if t.state == TrialState.RUNNING), None)

    # Claiming ------------------------------------------------------------------------------
    def acquire(self, job: str, *, wait: Callable[[Held], None]) -> JobClaim | Done:
        """Hold ``job``, or the result of the worker that finished it. While another
        live worker holds it, ``wait(held)`` is called between reads (it sleeps, and may
        raise to stop waiting); a holder silent past the grace period is given up and
        the job claimed again.

        Raises:
            StudyError: claims kept being taken by others (bounded).
        """
        for _ in range(_MAX_CLAIMS):
            seen = self.look(job)
            while isinstance(seen, Held):
                wait(seen)
                seen = self.look(job)
            if isinstance(seen, Done):
                return seen
            claim = self.start(job)
            if self.check(claim):
                return claim
        raise StudyError(
            f"{_MAX_CLAIMS} claims on {job} in a row were taken by other workers; is a "
            "worker stalling (swapping, paused)? Raise AUTOSEARCH_HEARTBEAT_GRACE"
        )

    def look(self, job: str) -> Done | Held | None:
        """One read of ``job``: done (its result), held by a live worker, or free
        (None). A holder silent past the grace period is given up on the way."""
        while True:  # each pass gives up one dead claim: it ends
            claims = self.claims(job)
            done = _done(claims)
            if done is not None:
                return done
            holder = self.holder(claims)
            if holder is None:
                return None
            if not self._dead(holder):
                return Held(number=holder.number, worker=_worker(holder))

    def tidy(self) -> None:
        """Give up the claims of dead workers on any job now: a job no one asks for
        again (a point that left the front while its measuring worker died) would keep
        its claim running for ever."""
        for claim in self._all():
            if claim.state == TrialState.RUNNING:
                self._dead(claim)

    def start(self, job: str) -> JobClaim:
        """A new claim on ``job`` (a running trial with its first heartbeat), not yet
        checked."""
        template = create_trial(
            state=TrialState.RUNNING,
            user_attrs={_JOB: job},
            system_attrs={**first_stamp(), WORKER: worker_id()},
        )
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=template)
        return JobClaim(job=job, trial_id=trial_id, number=trial_number(self.storage, trial_id))

    def check(self, claim: JobClaim) -> bool:
        """Whether ``claim`` holds its job: it is still running, and no earlier claim is
        running or done. If not, it is given up."""
        claims = self.claims(claim.job)
        earlier = [c for c in claims if c.number < claim.number]
        mine = [c for c in claims if c.number == claim.number]
        running = bool(mine) and mine[0].state == TrialState.RUNNING  # not given up meanwhile
        if running and self.holder(earlier) is None and _done(earlier) is None:
            return True
        self.give_up(claim, "lost the claim to an earlier one")
        return False

    def _dead(self, claim: FrozenTrial) -> bool:
        """Give up ``claim`` if its worker stopped beating; whether it did."""
        why = self.watch.dead(claim, self.grace)
        if why is None:
            return False
        try:
            self._end(
                claim._trial_id,
                f"its worker {_worker(claim)} died ({why})",
                lock_wait=TAKEOVER_LOCK_WAIT,
            )
        except TrialLocked:  # its worker is inside the claim's end: alive, or paused there
            logger.warning(
                "job %s: worker %s is silent (%s) but holds its claim's row; taken over once "
                "the database ends its session",
                claim.user_attrs.get(_JOB),
                _worker(claim),
                why,
            )
            return False
        logger.warning(
            "job %s: worker %s died (%s); taking it over from its checkpoint",
            claim.user_attrs.get(_JOB),
            _worker(claim),
            why,
        )
        return True

    # Holding -------------------------------------------------------------------------------
    def taken_over(self, claim: JobClaim) -> str | None:
        """Why ``claim`` no longer holds its job (another worker gave it up for dead),
        or None while it does."""
        try:
            trial = self.storage.get_trial(claim.trial_id)
        except KeyError:
            return "its claim was deleted from the storage"
        if trial.state == TrialState.RUNNING:
            return None
        return str(trial.user_attrs.get(_GAVE_UP, f"it is {trial.state.name.lower()}"))

    def finish(self, claim: JobClaim, result: dict[str, Any], *, value: float = 0.0) -> bool:
        """End the job with ``result``; False when the claim was taken over first (the
        storage finishes a trial once: then the worker that took over owns the job)."""
        try:
            attrs = {_RESULT: json.loads(json.dumps(result))}
            end_trial(self.storage, claim.trial_id, attrs, TrialState.COMPLETE, [value])
            return self.storage.get_trial(claim.trial_id).state == TrialState.COMPLETE
        except (UpdateFinishedTrialError, KeyError):  # given up, or its claim deleted
            return False

    def give_up(self, claim: JobClaim, reason: str) -> None:
        """End ``claim`` without a result (lost, interrupted, failed): the job is free
        for the next claim, which resumes from the checkpoint."""
        self._end(claim.trial_id, reason)

    def _end(self, trial_id: int, reason: str, *, lock_wait: float | None = None) -> None:
        try:
            end_trial(
                self.storage, trial_id, {_GAVE_UP: reason}, TrialState.FAIL, lock_wait=lock_wait
            )
        except (UpdateFinishedTrialError, KeyError):  # another worker got there first
            logger.debug("job claim id %d was already finished", trial_id)


def _done(claims: list[FrozenTrial]) -> Done | None:
    for t in claims:
        if t.state == TrialState.COMPLETE:
            return Done(number=t.number, result=t.user_attrs.get(_RESULT))
    return None


def _worker(claim: FrozenTrial) -> str:
    return str(claim.system_attrs.get(WORKER, "unknown"))


def is_companion(name: str) -> bool:
    """Whether a study name is a companion's (left out of listings of studies)."""
    return name.endswith(COMPANION)
