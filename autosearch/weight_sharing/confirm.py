"""Confirming a supernet's choice by training it: the ``k`` most accurate subnets of a
supernet study's front, each trained from scratch with the study's training config, as
trials of the study.

A confirmation trial is an ordinary trial (claimed, checkpointed every epoch, resumed
after a kill or Ctrl-C, its variants measured, its weights stored) with one more user
attribute, ``confirms``: the number of the supernet trial whose subnet it trains. Its
claim holds ``confirm:ID`` (records.claim_key), so a subnet is scored on the supernet
once and trained once, however many workers confirm at the same time; the controller
never hears of it (its accuracy is a training's, not the supernet's).

A worker confirms the subnets no trial holds yet; then it waits for those other workers
hold, and takes up any whose worker dies (its silent heartbeat gives it away), so that
``confirm(k)`` returns when all ``k`` are trained.

Ranked confirmation (``confirm(k, ranker=...)``) spends the ``k`` trainings where the
top is uncertain instead (autosearch.evaluation.ranker): every scored subnet's
estimates (its accuracy on the supernet, the study's zero-cost proxies, FLOPs,
parameters) and its architecture's encoding are the features of a ranker fitted on the
subnets confirmed so far; the next subnet to train is, among the ranked top, the one
its members disagree on most, and the ranker is fitted again when it is trained. What
the ranker is fitted on is the study's own confirmation trials, and a fit is a pure
function of them, so a resumed study or a second worker chooses the same next subnet;
each confirmation trial also stores the estimate it was chosen with and the trials
that estimate was fitted on (``ranked``).

A confirmation may train its subnet as a population (``confirm(k, population=...)``,
autosearch.population): the members train one after another in the trial's
folder, its winner is the trial's network, and the population's definition is stored
with the trial (``population``); a trial cut short resumes the population from the
folder (its record and every member's checkpoint), to the same winner.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.trial import FrozenTrial, TrialState

from autosearch.architecture import Architecture
from autosearch.controller import Outcome
from autosearch.errors import ConfigError, StudyError
from autosearch.evaluation.proxies import PROXIES
from autosearch.evaluation.ranker import Ranker, RankerConfig
from autosearch.evaluation.trial import Interrupted, TrialPlan
from autosearch.population.full import population_trainer
from autosearch.population.rules import PopulationBasedTraining
from autosearch.space import SearchSpace
from autosearch.study import records, results
from autosearch.study.claims import Claim
from autosearch.study.loop import AllClaimed, RecordCallback, SearchLoop, SearchParts
from autosearch.study.records import CONFIRMS, POPULATION, Record
from autosearch.training.train import EpochResult

__all__ = [
    "ESTIMATES",
    "Confirmation",
    "Confirmer",
    "Estimate",
    "candidates",
    "confirmations",
    "ranker_config",
]

#: What a ranked confirmation combines, each where every scored subnet has it (higher is
#: better for each): the accuracy inherited from the supernet, the study's zero-cost
#: proxies (ProxyConfig), FLOPs and parameters.
ESTIMATES = ("accuracy", *PROXIES, "flops", "params")
RANKED = "ranked"  # on a ranked confirmation trial: the estimate it was chosen with

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Confirmation:
    """A subnet's accuracy inherited from the supernet against its accuracy trained
    from scratch (validation; None while its training is not complete)."""

    trial: int  # the supernet trial
    confirmed_by: int | None  # the confirmation trial, once one holds it
    description: str
    flops: float
    inherited: float
    confirmed: float | None
    confirmed_test: float | None
    state: str  # the confirmation's: complete, running, failed, ... or "not started"

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def candidates(points: list[Record], objectives: tuple[str, ...]) -> list[Record]:
    """The supernet's front (complete base records scored on it), most accurate first."""
    scored = [r for r in points if r.is_base and r.kind is None]
    front = results.front(scored, objectives)
    return sorted(front, key=lambda r: (-r.metrics["accuracy"], r.metrics["flops"], r.trial))


def scored(points: list[Record]) -> list[Record]:
    """Every subnet scored on the supernet (complete search trials), in trial order."""
    return sorted(
        (
            r
            for r in points
            if r.is_base and r.kind is None and r.state == "complete" and r.accuracy is not None
        ),
        key=lambda r: r.trial,
    )


def confirmed(points: list[Record]) -> dict[int, float]:
    """Supernet trial number -> the validation accuracy its complete confirmation reached."""
    return {
        r.confirms: r.metrics["accuracy"]
        for r in points
        if r.is_base and r.confirms is not None and r.state == "complete" and r.accuracy is not None
    }


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """A scored subnet as the ranker sees it: its estimated accuracy (trained from
    scratch), how much the ranker's members disagree on it, the accuracy inherited from
    the supernet, and the accuracy trained (None while it is not confirmed)."""

    trial: int  # the supernet trial
    description: str
    estimate: float
    spread: float
    inherited: float
    confirmed: float | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Ranking:
    """The ranker over a supernet study's scored subnets (``pool``), fitted on what its
    confirmations reached. ``columns``: the ESTIMATES every subnet of the pool has."""

    def __init__(self, pool: list[Record], space: SearchSpace, config: RankerConfig) -> None:
        self.pool = pool
        self.columns = [
            m
            for m in ESTIMATES
            if pool and all(math.isfinite(r.metrics.get(m, math.nan)) for r in pool)
        ]
        estimates = np.array([[r.metrics[m] for m in self.columns] for r in pool], float)
        encoding = np.array([space.one_hot(r.arch) for r in pool], float)
        self.features = np.hstack([estimates.reshape(len(pool), -1), encoding])
        self.ranker = Ranker(config, estimates=len(self.columns))
        self.row = {r.trial: i for i, r in enumerate(pool)}
        self.fitted_on: list[int] = []
        self._fit: tuple | None = None

    def fit(self, accuracies: dict[int, float]) -> Ranker:
        """Fitted on the confirmed subnets of the pool (supernet trial -> accuracy), in
        trial order; fitted again only when they change."""
        on = sorted(t for t in accuracies if t in self.row)
        key = tuple((t, accuracies[t]) for t in on)
        if key != self._fit:
            rows = [self.row[t] for t in on]
            self.ranker.fit(self.features[rows], np.array([accuracies[t] for t in on]))
            self._fit, self.fitted_on = key, on
        return self.ranker

    def estimates(self, accuracies: dict[int, float]) -> list[Estimate]:
        """Every subnet of the pool, best estimate first."""
        mean, spread = self.fit(accuracies).predict(self.features)
        rows = [
            Estimate(
                trial=r.trial,
                description=r.description,
                estimate=float(mean[i]),
                spread=float(spread[i]),
                inherited=float(r.metrics["accuracy"]),
                confirmed=accuracies.get(r.trial),
            )
            for i, r in enumerate(self.pool)
        ]
        return sorted(rows, key=lambda e: (-e.estimate, e.trial))


def _confirming(trials: list[FrozenTrial]) -> dict[int, FrozenTrial]:
    """Supernet trial number -> the live confirmation trial that holds it."""
    held: dict[int, FrozenTrial] = {}
    for t in trials:
        if CONFIRMS in t.user_attrs and not records.superseded(t):
            held.setdefault(int(t.user_attrs[CONFIRMS]), t)
    return held


def confirmations(points: list[Record], trials: list[FrozenTrial]) -> list[Confirmation]:
    """Every confirmed (or being confirmed) subnet, in supernet trial order."""
    base = {r.trial: r for r in points if r.is_base}
    rows = []
    for number, trial in sorted(_confirming(trials).items()):
        scored, done = base.get(number), base.get(trial.number)
        if scored is None or "accuracy" not in scored.metrics:
            continue
        complete = done is not None and done.state == "complete"
        rows.append(
            Confirmation(
                trial=number,
                confirmed_by=trial.number,
                description=scored.description,
                flops=scored.metrics["flops"],
                inherited=scored.metrics["accuracy"],
                confirmed=done.metrics.get("accuracy") if complete and done else None,
                confirmed_test=done.metrics.get("test_accuracy") if complete and done else None,
                state=done.state if done is not None else "running",
            )
        )
    return rows


class _ConfirmLoop(SearchLoop):
    """A search loop whose architectures are the subnets to confirm, in order."""

    def __init__(
        self,
        parts: SearchParts,
        targets: list[Record],
        population: PopulationBasedTraining | None = None,
        **options: Any,
    ) -> None:
        super().__init__(parts, **options)
        self.targets = {r.arch.arch_id: r for r in targets}
        self.population = population
        self._claim: Claim | None = None  # the trial being trained
        # Every scored subnet (one trial per architecture): what a resumed confirmation
        # of an earlier call, not among ``targets``, confirms.
        self.scored = {
            r.arch.arch_id: r.trial for r in parts.trials.records(variants=False) if r.kind is None
        }

    def _propose(self, trials: list[FrozenTrial]) -> Architecture:
        held = self.parts.claims.index.read(trials)
        for record in self.targets.values():
            if self.parts.claims.key(record.arch) not in held:
                return record.arch
        raise AllClaimed("every subnet to confirm is held by a confirmation trial")

    def _attrs(self, arch: Architecture) -> dict[str, Any]:
        attrs = {**super()._attrs(arch), CONFIRMS: self.scored[arch.arch_id]}
        if self.population is not None:
            attrs[POPULATION] = self.population.definition()
        return attrs

    def _plan(self, claim: Claim) -> TrialPlan:
        plan = self.parts.planner.plan(claim.arch, number=claim.number, confirm=True)
        if self.population is None:
            return plan
        # One worker holds the trial, and with it the population's folder: a member its
        # dead predecessor claimed is taken at once (grace 0).
        self._claim = claim
        trainer = population_trainer(self.population, self._member_epoch, grace=0.0)
        return dataclasses.replace(plan, trainer=trainer)

    def _member_epoch(self, member: int, epoch: EpochResult) -> None:
        """After each member's epoch (its checkpoint written): the trial's folder to the
        bucket, where there is one (a confirmation resumed on another machine goes on
        from it); then stop there when asked (the trial resumes the population)."""
        artifacts = self.parts.artifacts
        if artifacts.remote is not None and self._claim is not None:
            artifacts.push(self._claim.arch, self._claim.number)
        if self.interrupted:
            raise Interrupted(f"population member {member} after epoch {epoch.epoch}")

    def _tell(self, claim: Claim, outcome: Outcome) -> None:
        pass  # a training's accuracy is not the supernet's: the controller never hears it


def ranker_config(ranker: RankerConfig | bool | None, *, seed: int) -> RankerConfig | None:
    """``ranker=`` of a confirmation as a config: True is the default one with the
    study's ``seed``; None or False, no ranker."""
    if ranker is None or ranker is False:
        return None
    if ranker is True:
        return RankerConfig(seed=seed)
    if not isinstance(ranker, RankerConfig):
        raise ConfigError(
            f"ranker={ranker!r}: expected True or a RankerConfig "
            "(autosearch.RankerConfig(members=..., top=...))"
        )
    return ranker


class _RankedLoop(_ConfirmLoop):
    """A confirmation loop that asks the ranker for each next subnet, until ``k``
    subnets of the pool are held by confirmation trials."""

    def __init__(self, parts: SearchParts, ranking: Ranking, k: int, **options: Any) -> None:
        super().__init__(parts, [], **options)
        self.ranking, self.k = ranking, k

    def _accuracies(self) -> dict[int, float]:
        return confirmed(self.parts.trials.records(variants=False))

    def _propose(self, trials: list[FrozenTrial]) -> Architecture:
        held = self.parts.claims.index.read(trials)
        pool = self.ranking.pool
        taken = {i for i, r in enumerate(pool) if self.parts.claims.key(r.arch) in held}
        if len(taken) >= self.k:
            raise AllClaimed(f"{self.k} subnets are held by confirmation trials")
        ranker = self.ranking.fit(self._accuracies())
        (chosen,) = ranker.choose(self.ranking.features, 1, taken=taken)
        return pool[chosen].arch

    def _attrs(self, arch: Architecture) -> dict[str, Any]:
        ranking = self.ranking
        mean, spread = ranking.fit(self._accuracies()).predict(ranking.features)
        row = ranking.row[self.scored[arch.arch_id]]
        chosen_with = {
            "estimate": float(mean[row]),
            "spread": float(spread[row]),
            "fitted_on": ranking.fitted_on,
            "estimates": ranking.columns,
        }
        return {**super()._attrs(arch), RANKED: chosen_with}


class Confirmer:
    """Confirms a supernet study's front by training. ``parts``: the study's search
    parts (its claims become claims on confirmation trials)."""

    def __init__(self, parts: SearchParts) -> None:
        self.parts = dataclasses.replace(parts, claims=parts.claims.of_confirmations())
        self.signal: str | None = None  # the signal that cut the last confirm() short

    def targets(self, k: Any) -> list[Record]:
        """The ``k`` most accurate subnets of the supernet's front.

        Raises:
            ConfigError: ``k`` is not an integer from 1 to the front's size.
        """
        front = candidates(self.parts.trials.records(variants=False), self.parts.objectives)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"k must be an integer >= 1 (subnets to confirm), got {k!r}")
        if not front:
            raise StudyError(
                f"study {self.parts.name!r} has no complete supernet trial to confirm; run "
                "trials first (study.optimize(n), or autosearch run FILE --n-trials N)"
            )
        if k > len(front):
            raise ConfigError(
                f"k={k} but the supernet's front of study {self.parts.name!r} has "
                f"{len(front)} subnet(s); confirm at most {len(front)}"
            )
        return front[:k]

    def ranking(self, config: RankerConfig) -> Ranking:
        """The ranker over every scored subnet, fitted on the confirmations so far."""
        points = self.parts.trials.records(variants=False)
        pool = scored(points)
        if not pool:
            raise StudyError(
                f"study {self.parts.name!r} has no complete supernet trial to rank; run "
                "trials first (study.optimize(n), or autosearch run FILE --n-trials N)"
            )
        ranking = Ranking(pool, self.parts.planner.space, config)
        ranking.fit(confirmed(points))
        return ranking

    def estimates(self, config: RankerConfig) -> list[Estimate]:
        """Every scored subnet, best estimate first, the ranker fitted on the
        confirmations so far."""
        return self.ranking(config).estimates(confirmed(self.parts.trials.records(variants=False)))

    def confirm(
        self,
        k: Any,
        *,
        ranker: RankerConfig | None = None,
        population: PopulationBasedTraining | None = None,
        callbacks: Sequence[RecordCallback] = (),
    ) -> list[Record]:
        """Train each of the :meth:`targets` once across all workers (with ``ranker``:
        ``k`` subnets in all, each chosen by the ranker fitted on those trained before
        it; with ``population``: each trained as that population, its winner the
        confirmed network); return the confirmation records, in the targets' order
        (ranked: in the order they were chosen). Interrupted (Ctrl-C, SIGTERM): the
        running training resumes at the next call, :attr:`signal` says which."""
        if population is not None:
            _check_population(population, self.parts)
        if ranker is not None:
            return self._ranked(k, ranker, population, callbacks)
        targets = self.targets(k)
        loop = _ConfirmLoop(
            self.parts,
            targets,
            population,
            callbacks=list(callbacks),
            epoch_callbacks=[],
            max_failures_in_a_row=len(targets) + 1,
        )
        return self._until_trained(loop, lambda held: [r.trial for r in targets])

    def _ranked(
        self,
        k: Any,
        config: RankerConfig,
        population: PopulationBasedTraining | None,
        callbacks: Sequence[RecordCallback],
    ) -> list[Record]:
        ranking = self.ranking(config)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(ranking.pool):
            raise ConfigError(
                f"k must be an integer from 1 to {len(ranking.pool)} (the subnets study "
                f"{self.parts.name!r} scored on its supernet), got {k!r}"
            )
        loop = _RankedLoop(
            self.parts,
            ranking,
            k,
            population=population,
            callbacks=list(callbacks),
            epoch_callbacks=[],
            max_failures_in_a_row=k + 1,
        )

        def chosen(held: dict[int, FrozenTrial]) -> list[int]:  # in the order chosen
            pool = (n for n in held if n in ranking.row)
            return sorted(pool, key=lambda n: held[n].number)

        return self._until_trained(loop, chosen)

    def _until_trained(
        self, loop: _ConfirmLoop, wanted: Callable[[dict[int, FrozenTrial]], list[int]]
    ) -> list[Record]:
        """Run ``loop`` until the confirmations of the supernet trials ``wanted`` reads
        off the held ones are finished, here or in other workers; their records."""
        said = None
        with loop.graceful_interrupts():
            while True:
                loop.run(len(loop.scored))  # what no trial holds, and what a dead worker held
                if loop.signal is not None:
                    break
                held = _confirming(self.parts.trials.all())
                waiting = sorted(
                    held[n].number
                    for n in wanted(held)
                    if n in held and held[n].state in (TrialState.RUNNING, TrialState.WAITING)
                )
                if not waiting:
                    break
                if waiting != said:
                    logger.info(
                        "confirmation trial(s) %s run in other workers; waiting for them",
                        ", ".join(map(str, waiting)),
                    )
                    said = waiting
                time.sleep(self.parts.heartbeat_interval)
        self.signal = loop.signal
        held = _confirming(self.parts.trials.all())
        return [
            self.parts.trials.record(held[n].number)
            for n in wanted(held)
            if n in held and held[n].state.is_finished()
        ]


def _check_population(population: Any, parts: SearchParts) -> None:
    """A confirmation's population, refused in one line before anything is trained."""
    if not isinstance(population, PopulationBasedTraining):
        raise ConfigError(
            f"population={population!r}: expected an autosearch.PopulationBasedTraining"
        )
    population.check(parts.planner.definition.train)
