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
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from autosearch._heartbeat import WORKER, last_beat
from autosearch.architecture import Architecture
from autosearch.errors import ConfigError, StudyError
from autosearch.space import SearchSpace
from autosearch.study import records
from autosearch.study.records import ARCH_ID, FAIL_REASON, RESUME, RESUMES, SUPERSEDED

__all__ = ["Claim", "Claims", "heartbeat_settings"]

logger = logging.getLogger(__name__)

_MAX_CLAIMS = 100


def heartbeat_settings() -> tuple[float, float]:
    """(interval, grace) in seconds: ``$AUTOSEARCH_HEARTBEAT_INTERVAL`` (default 10) and
    ``$AUTOSEARCH_HEARTBEAT_GRACE`` (default 60: a trial silent that long is dead)."""
    values = []
    for name, default in (("INTERVAL", 10.0), ("GRACE", 60.0)):
        raw = os.environ.get(f"AUTOSEARCH_HEARTBEAT_{name}", "")
        try:
            values.append(float(raw) if raw else default)
        except ValueError:
            raise ConfigError(
                f"AUTOSEARCH_HEARTBEAT_{name}={raw!r} must be a number of seconds"
            ) from None
    interval, grace = values
    if not 0 < interval < grace:
        raise ConfigError(
            f"heartbeat interval {interval} s must be positive and below the grace {grace} s"
        )
    return interval, grace


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A running trial this worker holds: its architecture, and the superseded trial
    it resumes (None for a new architecture)."""

    arch: Architecture
    trial_id: int
    number: int
    resumes: int | None = None


Propose = Callable[[list[FrozenTrial]], Architecture]


class Claims:
    """Claims on one study's trials, for one worker."""

    def __init__(
        self, storage: BaseStorage, study_id: int, space: SearchSpace, *, grace: float
    ) -> None:
        self.storage, self.study_id, self.space, self.grace = storage, study_id, space, grace

    def claim(self, propose: Propose, attrs: Callable[[Architecture], dict[str, Any]]) -> Claim:
        """A new running trial for the next architecture: the first whose run was cut
        short (a dead worker, Ctrl-C), else ``propose(trials)``'s. ``attrs`` gives the
        new trial's user attributes."""
        for _ in range(_MAX_CLAIMS):
            trials = self._trials()
            if self.reap_dead(trials):  # read again: the reaped trials now wait to resume
                trials = self._trials()
            pending = self.pending(trials)
            arch = pending[0] if pending else propose(trials)
            extra = {RESUMES: pending[1]} if pending else {}
            trial_id = self.start(arch, {**attrs(arch), **extra})
            if self.holds(trial_id, arch, trials):
                if pending:
                    self._copy_curve(pending[1], trial_id)
                number = self.storage.get_trial_number_from_id(trial_id)
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
        """Create a running trial for ``arch`` (a claim not yet checked); its id."""
        template = records.new_trial(self.space, arch, **attrs)
        return self.storage.create_new_trial(self.study_id, template_trial=template)

    def holds(
        self, trial_id: int, arch: Architecture, seen: list[FrozenTrial] | None = None
    ) -> bool:
        """Whether our new trial is the architecture's live trial with the lowest number;
        if not, it is superseded as a duplicate. ``seen``: the trials read just before
        claiming; only those created since are read again."""
        mine = self.storage.get_trial_number_from_id(trial_id)
        if seen is None:
            earlier = self._trials()
        else:
            known = max((t.number for t in seen), default=-1)
            earlier = [*seen, *(self._trial(n) for n in range(known + 1, mine))]
        for t in earlier:
            attrs = t.user_attrs
            if t.number < mine and attrs.get(ARCH_ID) == arch.arch_id and SUPERSEDED not in attrs:
                self.supersede(
                    trial_id, f"duplicate: trial {t.number} holds this architecture", resume=False
                )
                return False
        return True

    def reap_dead(self, trials: list[FrozenTrial]) -> bool:
        """Give up running trials whose worker stopped beating (they resume elsewhere);
        whether there were any."""
        now = time.time()
        reaped = False
        for t in trials:
            if t.state != TrialState.RUNNING or SUPERSEDED in t.user_attrs:
                continue
            silent = now - last_beat(t)
            if silent > self.grace:
                worker = t.system_attrs.get(WORKER, "unknown")
                logger.warning(
                    "trial %d: worker %s silent for %.0f s; it resumes from its checkpoint",
                    t.number,
                    worker,
                    silent,
                )
                self.supersede(
                    t._trial_id,
                    f"its worker {worker} died (no heartbeat for {silent:.0f} s); "
                    "it resumes from its checkpoint",
                )
                reaped = True
        return reaped

    def pending(self, trials: list[FrozenTrial]) -> tuple[Architecture, int] | None:
        """The oldest superseded-for-resume trial whose architecture no live trial holds:
        its architecture and number."""
        live = {
            t.user_attrs.get(ARCH_ID)
            for t in trials
            if SUPERSEDED not in t.user_attrs and t.state != TrialState.WAITING
        }
        for t in sorted(trials, key=lambda t: t.number):
            attrs = t.user_attrs
            if attrs.get(RESUME) and attrs.get(ARCH_ID) not in live:
                return records.architecture(t), t.number
        return None

    def supersede(self, trial_id: int, reason: str, *, resume: bool = True) -> None:
        """Mark a running trial replaced, and whether its architecture still needs
        training (``resume``)."""
        try:
            self.storage.set_trial_user_attr(trial_id, RESUME, resume)
            self.storage.set_trial_user_attr(trial_id, FAIL_REASON, reason)
            self.storage.set_trial_user_attr(trial_id, SUPERSEDED, reason)
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker got there first
            logger.debug("trial %d was already finished", trial_id)

    def taken_over(self, trial_id: int) -> str | None:
        """Why our running trial is no longer ours (another worker superseded or ended
        it), or None while it is."""
        trial = self.storage.get_trial(trial_id)
        if SUPERSEDED in trial.user_attrs:
            return str(trial.user_attrs[SUPERSEDED])
        if trial.state != TrialState.RUNNING:
            return f"it is {trial.state.name.lower()} already"
        return None

    def fail(self, trial_id: int, reason: str) -> None:
        """End a trial as failed with its reason."""
        self.storage.set_trial_user_attr(trial_id, FAIL_REASON, reason)
        self.storage.set_trial_state_values(trial_id, TrialState.FAIL)

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
