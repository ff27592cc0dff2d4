"""Claims: which worker trains which architecture, without locks, and what resumes.

A worker claims an architecture by creating a running trial for it. Trial numbers
follow creation order, so of two workers that claim the same architecture at once the
one with the higher number sees the other's trial and gives its own up (superseded as
a duplicate). A running trial is stamped by a heartbeat; one silent past the grace
period belongs to a dead worker: it is superseded *for resume*, and the next claim
takes its architecture up again, from its last checkpoint. Superseded trials stay in
storage, out of records, counts and the controller's history.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from autosearch.architecture import Architecture
from autosearch.errors import StudyError
from autosearch.space import SearchSpace
from autosearch.storage._rdb import TAKEOVER_LOCK_WAIT, TrialLocked
from autosearch.storage._urls import end_trial, trial_number
from autosearch.study import records
from autosearch.study.records import (
    FAIL_REASON,
    RESULT,
    RESUME,
    RESUMES,
    SUPERSEDED,
    VALUES_FROM,
    claim_key,
    trial_kind,
)
from autosearch.workers._heartbeat import WORKER, Watch, beating, first_stamp

__all__ = ["BudgetReached", "Claim", "Claims"]

logger = logging.getLogger(__name__)

_MAX_CLAIMS = 100


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A running trial this worker holds: its architecture, and the superseded trial
    it resumes (None for a new architecture)."""

    arch: Architecture
    trial_id: int
    number: int
    resumes: int | None = None


Propose = Callable[[list[FrozenTrial]], Architecture]


class BudgetReached(StudyError):
    """The study holds the trials it was to be run to (counting other workers')."""


class Claims:
    """Claims on one study's trials, for one worker: of its search trials, or of the
    trials of another ``kind`` (records.trial_kind: ``confirm``, the confirmation trials
    of autosearch.weight_sharing.confirm; ``population:KEY``, an architecture trained as
    a population), which hold ``KIND:ID`` rather than the architecture's id, and resume
    only their kind."""

    def __init__(
        self,
        storage: BaseStorage,
        study_id: int,
        space: SearchSpace,
        *,
        grace: float,
        kind: str | None = None,
    ) -> None:
        self.storage, self.study_id, self.space, self.grace = storage, study_id, space, grace
        self.kind = kind
        self.index = ArchIndex()
        self.watch = Watch()

    def of_confirmations(self) -> Claims:
        """Claims on the same study's confirmation trials."""
        return self.of_kind("confirm")

    def of_kind(self, kind: str) -> Claims:
        """Claims on the same study's trials of ``kind`` (records.trial_kind)."""
        return Claims(self.storage, self.study_id, self.space, grace=self.grace, kind=kind)

    def key(self, arch: Architecture) -> str:
        """What a claim of this kind on ``arch`` holds (records.claim_key)."""
        return arch.arch_id if self.kind is None else f"{self.kind}:{arch.arch_id}"

    def claim(
        self,
        propose: Propose,
        attrs: Callable[[Architecture], dict[str, Any]],
        *,
        limit: int | None = None,
    ) -> Claim:
        """A new running trial for the next architecture: the first whose run was cut
        short (a dead worker, Ctrl-C), else ``propose(trials)``'s. ``attrs`` gives the
        new trial's user attributes.

        Raises:
            BudgetReached: ``limit`` search trials (finished or held by a live worker)
                came before this claim: the study is run to its total.
        """
        for _ in range(_MAX_CLAIMS):
            trials = self._trials()
            if self.reap_dead(self.index.unfinished(trials)):  # read again: they now wait
                trials = self._trials()
            pending = self.pending(trials)
            arch = pending[0] if pending else propose(trials)
            extra = {RESUMES: pending[1]} if pending else {}
            trial_id = self.start(arch, {**attrs(arch), **extra})
            number = trial_number(self.storage, trial_id)
            if self.holds(trial_id, arch, trials, number=number):
                self._within(limit, trial_id, number)
                if pending:
                    self._copy_curve(pending[1], trial_id)
                return Claim(
                    arch=arch,
                    trial_id=trial_id,
                    number=number,
                    resumes=pending[1] if pending else None,
                )
        raise StudyError(
            f"{_MAX_CLAIMS} claims in a row were taken by other workers; too many workers "
            "for the architectures left?"
        )

    def start(self, arch: Architecture, attrs: dict[str, Any]) -> int:
        """Create a running trial for ``arch`` (a claim not yet checked), stamped with
        its first heartbeat; its id."""
        template = records.new_trial(self.space, arch, system_attrs=first_stamp(), **attrs)
        try:
            return self.storage.create_new_trial(self.study_id, template_trial=template)
        except ValueError as exc:  # Optuna: a gene's domain differs from earlier trials'
            raise StudyError(
                f"the study's earlier trials searched other gene domains than its space "
                f"({self.space.name}) has now ({exc}); its stored definition was changed "
                "after they ran: restore it, or search the new space in a new study"
            ) from None

    def holds(
        self,
        trial_id: int,
        arch: Architecture,
        seen: list[FrozenTrial] | None = None,
        *,
        number: int | None = None,
    ) -> bool:
        """Whether our new trial is the architecture's live trial with the lowest number;
        if not, it is superseded as a duplicate. ``seen``: the trials read just before
        claiming; only those created since are read again. ``number``: the trial's, if
        read already."""
        mine = self.storage.get_trial_number_from_id(trial_id) if number is None else number
        if seen is None:
            earlier = self._trials()
        else:
            known = seen[-1].number if seen else -1  # read in number order
            earlier = [*seen, *(self._trial(n) for n in range(known + 1, mine))]
        holder = self.index.read(earlier).first(self.key(arch))
        if holder is not None and holder.number < mine:
            self.supersede(
                trial_id, f"duplicate: trial {holder.number} holds this architecture", resume=False
            )
            return False
        return True

    def _within(self, limit: int | None, trial_id: int, number: int) -> None:
        """Give our new trial up if ``limit`` search trials came before it. Trial numbers
        follow creation order, so of workers that claim at once exactly those within
        the limit keep their trials."""
        if limit is None or self.kind is not None:
            return
        before = sum(
            t.number < number and trial_kind(t.user_attrs) is None and not records.superseded(t)
            for t in self._trials()
            if claim_key(t.user_attrs) is not None
        )
        if before >= limit:
            reason = f"the study holds its {limit} trials"
            self.supersede(trial_id, reason, resume=False)
            raise BudgetReached(reason)

    def reap_dead(self, trials: list[FrozenTrial]) -> bool:
        """Give up running trials whose worker stopped beating (they resume elsewhere);
        whether there were any."""
        reaped = False
        for t in trials:
            if t.state != TrialState.RUNNING:
                continue
            if SUPERSEDED in t.user_attrs:  # given up, then cut between two writes (a journal)
                resume = bool(t.user_attrs.get(RESUME))
                self.supersede(t._trial_id, str(t.user_attrs[SUPERSEDED]), resume=resume)
                reaped = True
                continue
            why = self.watch.dead(t, self.grace)
            if why is None:
                continue
            worker = t.system_attrs.get(WORKER) or t.user_attrs.get("worker", "unknown")
            try:
                self.supersede(
                    t._trial_id,
                    f"its worker {worker} died ({why}); it resumes from its checkpoint",
                    lock_wait=TAKEOVER_LOCK_WAIT,
                )
            except TrialLocked:  # its worker is inside its end: alive, or paused there
                logger.warning(
                    "trial %d: worker %s is silent (%s) but holds the trial's row; taken "
                    "over once the database ends its session",
                    t.number,
                    worker,
                    why,
                )
                continue
            logger.warning(
                "trial %d: worker %s died (%s); it resumes from its checkpoint",
                t.number,
                worker,
                why,
            )
            reaped = True
        return reaped

    def tidy(self) -> None:
        """Give up the running trials of dead workers now, claim or not: a study run to
        its total is claimed no more, and a worker that died holding a trial past the
        total (between creating it and giving it up) would leave it running for ever."""
        self.reap_dead(self.index.unfinished(self._trials()))

    def pending(self, trials: list[FrozenTrial]) -> tuple[Architecture, int] | None:
        """The oldest superseded-for-resume trial of this kind (search or confirmation)
        whose architecture no live trial holds: its architecture and number."""
        held = self.index.read(trials)
        recent = (t for t in self.index.unfinished(trials) if t.user_attrs.get(RESUME))
        for t in [*self.index.resumable, *recent]:  # in number order
            if trial_kind(t.user_attrs) != self.kind:
                continue
            holder = held.first(claim_key(t.user_attrs) or "")
            if holder is None or holder.state == TrialState.WAITING:
                return records.architecture(t), t.number
        return None

    def supersede(
        self, trial_id: int, reason: str, *, resume: bool = True, lock_wait: float | None = None
    ) -> None:
        """Mark a running trial replaced, and whether its architecture still needs
        training (``resume``). ``lock_wait``: another worker's trial, waited for no
        longer (:class:`TrialLocked`)."""
        try:
            attrs = {RESUME: resume, FAIL_REASON: reason, SUPERSEDED: reason}
            end_trial(self.storage, trial_id, attrs, TrialState.FAIL, lock_wait=lock_wait)
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker got there first
            logger.debug("trial id %d was already finished", trial_id)

    def taken_over(self, trial_id: int) -> str | None:
        """Why our running trial is no longer ours (another worker superseded or ended
        it), or None while it is."""
        trial = self.storage.get_trial(trial_id)
        if SUPERSEDED in trial.user_attrs:
            return str(trial.user_attrs[SUPERSEDED])
        if trial.state != TrialState.RUNNING:
            return f"it is {trial.state.name.lower()} already"
        return None

    def beating(self, trial_id: int, interval: float) -> AbstractContextManager[None]:
        """Stamp our claim's heartbeat every ``interval`` seconds while the block runs
        (it was created with its first stamp)."""
        return beating(self.storage, trial_id, interval, stamped=True)

    def report(self, trial_id: int, epoch: int, value: float) -> None:
        """Our trial's validation accuracy after ``epoch`` (its learning curve)."""
        self.storage.set_trial_intermediate_value(trial_id, epoch, value)

    def store(
        self,
        trial_id: int,
        result: dict[str, Any],
        *,
        best: str | None,
        values: list[float] | None,
    ) -> None:
        """End our trial with its ``result`` (one attribute): complete with the
        objective ``values`` of its ``best`` point, or stopped early (``best`` None)."""
        if best is None:
            end_trial(self.storage, trial_id, {RESULT: result}, TrialState.PRUNED)
            return
        # The trial's values are its best point's: say which, where Optuna's tools look.
        attrs = {RESULT: result, VALUES_FROM: best}
        end_trial(self.storage, trial_id, attrs, TrialState.COMPLETE, values)

    def fail(self, trial_id: int, reason: str) -> None:
        """End a trial as failed with its reason."""
        end_trial(self.storage, trial_id, {FAIL_REASON: reason}, TrialState.FAIL)

    def _trials(self) -> list[FrozenTrial]:
        return self.storage.get_all_trials(self.study_id, deepcopy=False)

    def _trial(self, number: int) -> FrozenTrial:
        return self.storage.get_trial(
            self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        )

    def _copy_curve(self, old: int, trial_id: int) -> None:
        """A resumed trial's learning curve starts with the epochs its predecessor ran."""
        for epoch, value in self._trial(old).intermediate_values.items():
            self.storage.set_trial_intermediate_value(trial_id, epoch, value)


class ArchIndex:
    """The study's trials that hold an architecture (not superseded), by ``arch_id``,
    kept across reads. A finished trial never changes, so the finished start of the
    study is indexed once; each read looks only at the trials after it (those running,
    and those new since the last read), and a claim's cost does not grow with the study."""

    def __init__(self) -> None:
        self._first: dict[str, FrozenTrial] = {}
        self._last: dict[str, FrozenTrial] = {}
        self._indexed = 0  # trials 0 .. _indexed - 1 are finished and indexed
        self.resumable: list[FrozenTrial] = []  # indexed trials superseded for resuming

    def unfinished(self, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        """``trials`` after the indexed (finished) ones: all that may still change."""
        done = self._indexed
        if done and len(trials) >= done and trials[done - 1].number == done - 1:
            return trials[done:]
        return trials

    def read(self, trials: list[FrozenTrial]) -> ArchView:
        """The index brought up to ``trials`` (all of the study's, in number order)."""
        done = self._indexed
        if done and (len(trials) < done or trials[done - 1].number != done - 1):
            self.__init__()  # type: ignore[misc]  # another study's list: start again
        first: dict[str, FrozenTrial] = {}
        last: dict[str, FrozenTrial] = {}
        for t in trials[self._indexed :]:
            frozen = t.state.is_finished() and t.number == self._indexed
            into = (self._first, self._last) if frozen else (first, last)
            self._indexed += frozen
            if frozen and t.user_attrs.get(RESUME):
                self.resumable.append(t)
            arch_id = claim_key(t.user_attrs)
            if arch_id is None or SUPERSEDED in t.user_attrs:
                continue
            into[0].setdefault(arch_id, t)
            into[1][arch_id] = t
        return ArchView(self._first, first, self._last, last)


@dataclass(frozen=True)
class ArchView:
    """One read of an :class:`ArchIndex`: the indexed trials and those after them."""

    indexed_first: dict[str, FrozenTrial]
    recent_first: dict[str, FrozenTrial]
    indexed_last: dict[str, FrozenTrial]
    recent_last: dict[str, FrozenTrial]

    def first(self, arch_id: str) -> FrozenTrial | None:
        """The lowest-numbered trial holding ``arch_id``."""
        return self.indexed_first.get(arch_id) or self.recent_first.get(arch_id)

    def last(self, arch_id: str) -> FrozenTrial | None:
        """The highest-numbered trial holding ``arch_id``."""
        return self.recent_last.get(arch_id) or self.indexed_last.get(arch_id)

    # The architectures held, as a collection of arch ids.
    def __contains__(self, arch_id: object) -> bool:
        return arch_id in self.indexed_last or arch_id in self.recent_last

    def __iter__(self) -> Iterator[str]:
        yield from self.indexed_last
        yield from (a for a in self.recent_last if a not in self.indexed_last)

    def __len__(self) -> int:
        return len(self.indexed_last) + sum(a not in self.indexed_last for a in self.recent_last)
