"""The controller's memory: its state kept in storage, and results replayed into it.

After every result it is told, the controller's state is saved as a study system
attribute, with the trial numbers it has been told; what the study's trials rebuild (the
architectures it has seen: :attr:`Controller.seen_state`) is left out, so that the
saved state does not grow with the study. Opening the study restores that
state (when the stored controller is the same) and then tells the controller every
finished trial it has not been told: trials run by other workers, or finished after
the state was saved. Superseded trials are not results and are never told.

Parallel workers each move their controller to a random stream of its own when they
start (:meth:`ControllerReplay.reseed`), so that they rarely propose the same
architecture at the same moment.

A controller that ranks untrained candidates (the zero-cost warm-up) is given the
study's scorer (:class:`PoolScores`): each candidate's proxies, computed as its trial
computes them, kept in the study's storage as they are computed, and shared by every
worker, so a pool is scored once whoever asks and whenever one dies.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

from autosearch.architecture import Architecture
from autosearch.controller import Controller, Outcome
from autosearch.data import Dataset
from autosearch.evaluation.runner import initial_proxies
from autosearch.space import SearchSpace
from autosearch.study import records
from autosearch.study.definition import Component, StudyDefinition, trial_seed
from autosearch.study.records import ARCH_ID, FINISHED

__all__ = ["ControllerReplay", "PoolScores", "worker_stream"]

logger = logging.getLogger(__name__)

_STATE = "autosearch:controller"
_POOL = "autosearch:pool-proxies"


def worker_stream(seed: int, worker: str, started: int) -> int:
    """The random stream of a worker's controller: from the study seed, the worker's
    label (its index in a pool, or host:pid) and the number of trials in the study when
    it started, so that a study's later pools do not repeat an earlier pool's streams."""
    digest = hashlib.sha256(f"{seed}:{worker}:{started}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class ControllerReplay:
    """Keeps one controller in step with a study's storage."""

    def __init__(
        self,
        controller: Controller,
        storage: BaseStorage,
        study_id: int,
        objectives: tuple[str, ...],
    ) -> None:
        self.controller = controller
        self.storage, self.study_id, self.objectives = storage, study_id, objectives
        self.told: set[int] = set()
        self._told_runs: list[list[int]] | None = []  # _runs(self.told), kept as it grows
        self._synced = 0  # how many trials, from trial 0 on, were finished when seen
        # What restore() found: "saved" (loaded), "none" (nothing saved, or another
        # controller's), or why the saved state was left out.
        self.restored = "none"

    def restore(self) -> None:
        """Load the stored state (if it is this controller's), mark every architecture
        in the study seen, then replay."""
        saved = self.storage.get_study_system_attrs(self.study_id).get(_STATE)
        trials = self.storage.get_all_trials(self.study_id, deepcopy=False)
        if isinstance(saved, dict) and saved.get("controller") == self._spec():
            self._load(saved, len(trials))
        self.controller.mark_seen(
            {t.user_attrs[ARCH_ID] for t in trials if isinstance(t.user_attrs.get(ARCH_ID), str)}
        )
        self.sync(trials)

    def _load(self, saved: dict[str, Any], n_trials: int) -> None:
        """The saved state; one that cannot be loaded (damaged) is logged and left out:
        the controller then learns again from every finished trial."""
        fresh = self.controller.state_dict()
        try:
            written = saved.get(DIGEST)
            if written is not None and written != _digest(saved):
                raise ValueError("it is not what was saved (its digest differs)")
            self.controller.load_state_dict(saved["state"])
            self.told = _numbers(saved["told"], below=n_trials)
        except Exception as exc:  # stored data of any shape: never a reason to fail
            logger.warning(
                "the stored state of controller %s cannot be read (%s: %s); it learns again "
                "from the study's trials",
                self.controller.name,
                type(exc).__name__,
                exc,
            )
            self.controller.load_state_dict(fresh)
            self.told = set()
            self.restored = f"{type(exc).__name__}: {exc}"[:300]
            return
        self._told_runs = None
        self.restored = "saved"

    def sync(self, trials: list[FrozenTrial] | None = None) -> None:
        """Tell the controller every finished trial it has not been told, in trial
        order. ``trials``: all trials, if just read."""
        if trials is None:
            trials = self.storage.get_all_trials(self.study_id, deepcopy=False)
        done = self._synced  # trials 0 .. done - 1 are finished and seen: skip them
        if done and (len(trials) < done or trials[done - 1].number != done - 1):
            done = self._synced = 0
        for t in trials[done:]:
            if t.state in FINISHED and t.number == self._synced:
                self._synced += 1
            if t.state not in FINISHED or t.number in self.told or records.superseded(t):
                continue
            if records.trial_kind(t.user_attrs) is not None:  # a confirmation, a population:
                # trained another way than the search's trials, not a search result
                continue
            try:
                arch = records.architecture(t)
            except (KeyError, ValueError):
                continue  # not an autosearch trial, or unreadable: not a result to learn from
            self.controller.tell(arch, records.outcome(t, self.objectives))
            self._add_told(t.number)

    def tell(self, number: int, arch: Architecture, outcome: Outcome) -> None:
        """Tell the controller a result this worker produced, and save its state."""
        self.controller.tell(arch, outcome)
        self._add_told(number)
        self.save()

    def _add_told(self, number: int) -> None:
        """Add a told trial; its runs are extended in place when it comes after the
        last (the usual case), else worked out again at the next save."""
        if number in self.told:
            return
        self.told.add(number)
        runs = self._told_runs
        if runs is None:
            return
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        elif not runs or number > runs[-1][1] + 1:
            runs.append([number, number])
        else:
            self._told_runs = None  # out of order

    def save(self) -> None:
        own = self.controller.state_dict()
        for key in self.controller.seen_state:  # rebuilt by mark_seen when the study opens
            own.pop(key, None)
        state: dict[str, Any] = {
            "controller": self._spec(),
            "state": own,
            "told": [list(run) for run in self._runs()],
        }
        # With its digest: a state edited or cut short is not loaded.
        state[DIGEST] = _digest(state)
        self.storage.set_study_system_attr(self.study_id, _STATE, state)

    def _runs(self) -> list[list[int]]:
        if self._told_runs is None:
            self._told_runs = _runs(self.told)
        return self._told_runs

    def use_scorer(
        self, definition: StudyDefinition, *, space: SearchSpace, data: Callable[[], Dataset]
    ) -> None:
        """Give the controller the study's scorer of untrained candidates, where the
        study has proxies (``data``: the study's dataset, loaded when first scored)."""
        config = definition.proxies
        if config is None:
            return

        def score(arch: Architecture) -> dict[str, float]:
            seed = trial_seed(definition.seed, arch)  # the initialization its trial trains from
            return initial_proxies(config, space, arch, seed, data())

        scores = PoolScores(self.storage, self.study_id, config.names, score)
        self.controller.use_scorer(scores, seed=definition.seed)

    def reseed(self, stream: int) -> None:
        """Move the controller to random stream ``stream`` (a parallel worker's own)."""
        self.controller.reseed(stream)
        logger.info("controller %s on random stream %d", self.controller.name, stream)

    def _spec(self) -> dict[str, Any]:
        return Component.of(self.controller).to_json()


# The key of the saved state that holds the digest of the rest of it.
DIGEST = "sha256"


def _digest(saved: Mapping[str, Any]) -> str:
    """The digest of a saved state (all of it but the digest) as JSON stores it."""
    stored = json.loads(json.dumps({k: v for k, v in saved.items() if k != DIGEST}))
    text = json.dumps(stored, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _runs(numbers: set[int]) -> list[list[int]]:
    """Trial numbers as ``[first, last]`` runs: a study's told trials are nearly one run,
    so the saved state stays small however long the study."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return runs


def _numbers(saved: list[Any], *, below: int) -> set[int]:
    """The trial numbers (those below ``below``, the study's trial count) of
    :func:`_runs`, or of the earlier plain list."""
    told: set[int] = set()
    for item in saved:
        first, last = (item[0], item[1]) if isinstance(item, list) else (item, item)
        told.update(range(max(int(first), 0), min(int(last) + 1, below)))
    return told


def stored_told(storage: BaseStorage, study_id: int) -> set[int]:
    """The trial numbers the study's saved controller state has been told (none saved,
    or unreadable: empty)."""
    saved = storage.get_study_system_attrs(study_id).get(_STATE)
    n_trials = len(storage.get_all_trials(study_id, deepcopy=False))
    try:
        return _numbers(saved["told"], below=n_trials) if saved else set()
    except (KeyError, TypeError, ValueError, IndexError):
        return set()


class PoolScores:
    """The study's scorer of a pool of untrained candidates: ``score(arch)`` gives one
    candidate's proxies (:func:`autosearch.evaluation.runner.initial_proxies`: as its
    trial stores them). Each score is stored as soon as it is computed (the study system
    attribute ``autosearch:pool-proxies``, arch id to scores), so a worker that dies
    loses at most the candidate it was scoring; workers that score the same pool at once
    take its candidates in orders of their own, skip what another stored meanwhile, and
    all read the same values in the end."""

    def __init__(
        self,
        storage: BaseStorage,
        study_id: int,
        names: Sequence[str],
        score: Callable[[Architecture], Mapping[str, float]],
    ) -> None:
        self.storage, self.study_id, self.names, self.score = storage, study_id, tuple(names), score

    def stored(self) -> dict[str, dict[str, float]]:
        saved = self.storage.get_study_system_attrs(self.study_id).get(_POOL)
        if not isinstance(saved, dict):
            return {}
        return {k: v for k, v in saved.items() if isinstance(v, dict)}  # damaged: scored again

    def __call__(self, archs: Sequence[Architecture]) -> dict[str, list[float]]:
        own_order = np.random.default_rng(os.getpid()).permutation(len(archs))
        shuffled = [archs[int(i)] for i in own_order]
        while True:
            stored = self.stored()
            missing = [a for a in shuffled if a.arch_id not in stored]
            if not missing:
                break
            found = self.score(missing[0])
            scores = {n: float(found[n]) for n in self.names if n in found}
            # Read again just before writing: what another worker stored meanwhile is
            # kept (a write lost to a race is scored again on the next pass).
            self.storage.set_study_system_attr(
                self.study_id, _POOL, {**self.stored(), missing[0].arch_id: scores}
            )
        logger.info("the pool's %d candidates are scored (%s)", len(archs), ", ".join(self.names))
        return {n: [float(stored[a.arch_id].get(n, math.nan)) for a in archs] for n in self.names}
