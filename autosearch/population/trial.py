"""One architecture of a study trained as a population, as a trial of the study
(``Study.train_population``): a study over that architecture's training settings.

The population's members start from draws of its ``mutations`` ranges over the study's
training config (with the architecture's own searched settings applied) and adapt them
as they train (:mod:`autosearch.population.run`). The study holds it as one trial
of its own kind (``population:KEY``, records.trial_kind; KEY names the population's
definition), so the architecture is trained as a given population once across workers,
and the trial resumes like any other after a kill. The winner is the trial's network:
its accuracy, its variants, its stored weights (``best()``, ``export``); what the
population did (every member's settings by epoch, scores, lineage, the rounds) is
stored in the trial's result (``result["population"]``).

Workers share the population through its folder, ``populations/STUDY/KEY-ARCH/`` in
the study's artifacts folder (STUDY: the study's creation id; on one machine, or a
shared file system whose locks work): the worker that holds the trial trains members,
and every other worker that asks for the same population trains the members no one
holds, then waits for the trial. The controller never hears a population trial: its
settings were not the search's. ``Study.rerun`` replays the winner's schedule.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from typing import Any

import torch
from optuna.trial import FrozenTrial

from autosearch.architecture import Architecture
from autosearch.controller import Outcome
from autosearch.errors import ConfigError
from autosearch.evaluation.runner import candidate_builder
from autosearch.evaluation.trial import Interrupted, TrialPlan, TrialResult
from autosearch.population.full import population_trainer
from autosearch.population.rules import PopulationBasedTraining
from autosearch.population.run import train_population
from autosearch.study.claims import Claim
from autosearch.study.loop import AllClaimed, SearchLoop, SearchParts
from autosearch.study.records import POPULATION, POPULATION_KEY, Record
from autosearch.training.train import EpochResult

__all__ = ["PopulationLoop", "population_key", "train_as_population"]

logger = logging.getLogger(__name__)


def population_key(population: PopulationBasedTraining) -> str:
    """A short name of the population's definition (its kind of trial is
    ``population:KEY``)."""
    text = json.dumps(population.definition(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class PopulationLoop(SearchLoop):
    """A search loop of one trial: ``arch`` trained as ``population``."""

    def __init__(
        self,
        parts: SearchParts,
        arch: Architecture,
        population: PopulationBasedTraining,
        **options: Any,
    ) -> None:
        self.key = population_key(population)
        claims = parts.claims.of_kind(f"population:{self.key}")
        super().__init__(dataclasses.replace(parts, claims=claims), **options)
        self.arch, self.population = arch, population
        self.name = f"{parts.uid or parts.name}/{self.key}-{arch.arch_id}"
        self.folder = parts.artifacts.folder / "populations" / self.name

    def holder(self) -> FrozenTrial | None:
        """The live or finished trial that holds this population, if one does."""
        held = self.parts.claims.index.read(self.parts.trials.all())
        return held.first(self.parts.claims.key(self.arch))

    def _propose(self, trials: list[FrozenTrial]) -> Architecture:
        if self.parts.claims.key(self.arch) in self.parts.claims.index.read(trials):
            raise AllClaimed("the population is held by a trial")
        return self.arch

    def _attrs(self, arch: Architecture) -> dict[str, Any]:
        definition = self.population.definition()
        return {**super()._attrs(arch), POPULATION_KEY: self.key, POPULATION: definition}

    def _plan(self, claim: Claim) -> TrialPlan:
        plan = self.parts.planner.plan(claim.arch, number=claim.number, confirm=True)
        folder = self.parts.artifacts.population(self.name)  # the bucket's, on a new disk
        # With a bucket, the trial's worker alone trains (see help): a member claimed in
        # the record it fetched was its dead predecessor's, taken at once (grace 0).
        grace = 0.0 if self.parts.artifacts.remote is not None else self.parts.claims.grace
        trainer = population_trainer(
            self.population, self._member_epoch, grace=grace, folder=folder
        )
        return dataclasses.replace(plan, trainer=trainer)

    def _member_epoch(self, member: int, epoch: EpochResult) -> None:
        """After each of the trial's member-epochs (its checkpoint written): the folder
        to the bucket, where there is one; then stop there when asked (the population
        resumes from its folder)."""
        if self.parts.artifacts.remote is not None:
            self.parts.artifacts.push_population(self.name)
        self._helper_epoch(member, epoch)

    def _helper_epoch(self, member: int, epoch: EpochResult) -> None:
        if self.interrupted:
            raise Interrupted(f"population member {member} after epoch {epoch.epoch}")

    def _store(self, claim: Claim, result: TrialResult) -> Outcome:
        outcome = super()._store(claim, result)
        self.parts.artifacts.finish_population(self.name)  # its members' checkpoints go
        return outcome

    def _tell(self, claim: Claim, outcome: Outcome) -> None:
        pass  # trained with adapted settings, not the search's: the controller never hears it

    def help(self, holder: FrozenTrial) -> None:
        """Train the members no worker holds, in the population's folder (``holder``'s
        worker trains the others), until every member has trained. Where the study's
        artifacts are in a bucket, each machine's folder is its own: only the trial's
        worker trains (it pushes the folder to the bucket after each member's epoch)."""
        if self.parts.artifacts.remote is not None:
            return
        if not (self.folder / "population.json").exists():
            return  # its worker has not started the population yet: ask again later
        plan = self.parts.planner.plan(self.arch, number=holder.number, confirm=True)
        data = self.parts.data.training
        assert data is not None  # a study that trains (not a table's)
        with torch.random.fork_rng(devices=[]):  # as the trial's worker builds its members
            train_population(
                candidate_builder(plan, data), data, plan.config, self.population, self.folder,
                seed=plan.seed, on_epoch=self._helper_epoch, grace=self.parts.claims.grace,
            )  # fmt: skip


def train_as_population(
    parts: SearchParts, arch: Architecture, population: PopulationBasedTraining
) -> tuple[Record | None, str | None]:
    """Train ``arch`` as ``population`` in one trial of the study (held by this worker,
    or by another that this one helps), until the trial is finished: its record, and
    the signal that cut the run short (the record None then)."""
    if not isinstance(population, PopulationBasedTraining):
        raise ConfigError(
            f"population={population!r}: expected an autosearch.PopulationBasedTraining"
        )
    if parts.data.training is None:
        raise ConfigError("a table study looks results up: it has no training to adapt")
    arch = parts.planner.space.canonicalize(arch)
    loop = PopulationLoop(
        parts, arch, population, callbacks=[], epoch_callbacks=[], max_failures_in_a_row=2
    )
    population.check(parts.planner.plan(arch, confirm=True).config)
    said = False
    with loop.graceful_interrupts():
        while loop.signal is None:
            loop.run(1)  # the trial, unless a live worker holds it (or it is finished)
            holder = loop.holder()
            if loop.signal is not None:
                break
            if holder is not None and holder.state.is_finished():
                return parts.trials.record(holder.number), None
            if holder is not None:  # another worker's live trial: train beside it
                if not said:
                    logger.info("trial %d trains this population; helping it", holder.number)
                    said = True
                try:
                    loop.help(holder)
                except Interrupted:
                    break
            time.sleep(parts.heartbeat_interval)  # then look again (a dead holder is reaped)
    return None, loop.signal
