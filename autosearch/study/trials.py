"""A study's stored trials, read: every trial as records (records.py is the codec), one
trial or record by number, learning curves, counts. What the search loop, the rebuild
of a trial, the reports and the facade all read, from the storage alone."""

from __future__ import annotations

import logging

from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

from autosearch.errors import StudyError
from autosearch.study import records
from autosearch.study.overlays import measured_overlays, overlay
from autosearch.study.records import Record, State, UnreadableTrial

__all__ = ["StoredTrials"]

logger = logging.getLogger(__name__)


class StoredTrials:
    """The trials of study ``name`` (id ``study_id`` in ``storage``), read as records
    that hold the study's ``objectives``."""

    def __init__(
        self, storage: BaseStorage, study_id: int, *, name: str, objectives: tuple[str, ...]
    ) -> None:
        self.storage, self.study_id, self.name = storage, study_id, name
        self.objectives = objectives
        self._decoded: dict[int, list[Record]] = {}  # finished trials never change
        self.unreadable: dict[int, str] = {}  # stored trials left out: number -> why

    def all(self) -> list[FrozenTrial]:
        """Every stored trial, in number order (Optuna's, not copied)."""
        return self.storage.get_all_trials(self.study_id, deepcopy=False)

    def get(self, number: int) -> FrozenTrial:
        """The stored trial number ``number``."""
        return self.storage.get_trial(
            self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        )

    def decode(self, trial: FrozenTrial) -> list[Record]:
        """A stored trial's records (see records.decode); an unreadable trial is logged
        once and left out."""
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
        """Every trial as records, in trial order: the base record, then one per variant
        (``variants=False``: base records only), with figures measured since laid over
        their estimates (study/measure.py)."""
        measured = measured_overlays(self.storage, self.study_id)
        return [
            overlay(r, measured.get((r.trial, r.variant)))
            for t in self.all()
            for r in self.decode(t)
            if variants or r.is_base
        ]

    def record(self, trial: int, variant: str = "base") -> Record:
        """The record of trial number ``trial`` and ``variant``."""
        try:
            found = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, trial)
        except KeyError:
            found = None
        for r in self.decode(self.storage.get_trial(found)) if found is not None else []:
            if r.variant == variant:
                measured = measured_overlays(self.storage, self.study_id)
                return overlay(r, measured.get((r.trial, r.variant)))
        raise StudyError(
            f"study {self.name!r} has no trial number {trial} with variant {variant!r}"
        )

    def curves(self) -> dict[int, dict[int, float]]:
        """Each trial's validation accuracy after every epoch it trained."""
        return {
            t.number: dict(sorted(t.intermediate_values.items()))
            for t in self.all()
            if t.intermediate_values and not records.superseded(t)
        }

    def count(self, *states: State) -> int:
        """Search trials (not variants, not confirmations) in any of ``states`` (every
        state when none is given): what a study's trial budget counts."""
        return sum(
            (not states or r.state in states) and r.kind is None
            for r in self.records(variants=False)
        )
