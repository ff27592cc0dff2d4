"""Regularized (aging) evolution, Real et al. 2019, asynchronous and multi-objective."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from autosearch.architecture import Architecture
from autosearch.controller import Controller, Outcome, unseen_architecture
from autosearch.errors import AutosearchError, ConfigError
from autosearch.registry import register_controller
from autosearch.scoring.pareto import Direction, crowding_distance, nondominated_ranks
from autosearch.space import SearchSpace
from controllers._walk import Walker

__all__ = ["RegularizedEvolution"]


@register_controller("evolution")
class RegularizedEvolution(Controller):
    """Tournament selection over an aging population, with a predictor-guided
    neighbourhood walk.

    Until ``population`` architectures are told (or pending), asks are random.
    After that each ask samples ``sample`` members of the population, mutates the
    best, and the oldest member dies when a result joins; or (``walk``) takes the
    unseen one-gene neighbour of the best results that a predictor ranks highest (ridge
    regression on one-hot genes, fitted on the elite and the population, as NPENAS
    guides evolution with a predictor). Multi-objective, the walk starts from the
    Pareto front of all results and takes the neighbour whose predicted objectives
    would add the most hypervolume to it. It is steady-state: any
    number of workers may ask before anyone tells, and results of architectures it
    never asked for (other workers, a resumed study) join the population too.

    Args:
        space: The search space.
        population: Population size P.
        sample: Tournament size S.
        seed: Seed of the controller's RNG.
        objectives: ``{name: "maximize" | "minimize"}`` for multi-objective selection
            (non-dominated rank, then crowding distance, NSGA-II style); None selects
            on the scalar reward.
        max_tries: Draws per ask to find an architecture not seen before.
        walk: The share of asks after the warm-up that walk instead of mutating a
            tournament's winner. Single objective, the walk steps to the predicted best
            unseen one-gene neighbour of the best result, or once that is a local
            optimum, of any of the best ``population`` ever; multi-objective, to
            the neighbour of a front member with the largest predicted hypervolume
            gain. On NB201-like landscapes, whose optimum is a few one-gene steps from
            the best results, this finds the best cell and the front far sooner
            (benchmarks/RESULTS.md). None (the default): 0.9 single objective (found
            the best cell by 150 evaluations in 96 % of seeds on three synthetic
            tables, 0.8 in 93 %), 0.8 multi-objective (fronts a little larger than
            with 0.9). 0 is Real et al.'s algorithm.
        front_size: Multi-objective: the most non-dominated results kept as the
            walks' starting points (the most crowded are dropped beyond it).
    """

    seen_state = frozenset({"seen"})

    def __init__(
        self,
        space: SearchSpace,
        *,
        population: int = 20,
        sample: int = 5,
        seed: int | None = None,
        objectives: Mapping[str, Direction] | None = None,
        max_tries: int = 100,
        walk: float | None = None,
        front_size: int = 100,
    ) -> None:
        super().__init__(space)
        if population < 2 or not 1 <= sample <= population:
            raise ConfigError(
                f"need population >= 2 and 1 <= sample <= population, got "
                f"population={population}, sample={sample}"
            )
        self.population_size = population
        self.sample_size = sample
        self.seed = seed
        self.objectives = dict(objectives) if objectives else None
        self.max_tries = max_tries
        if walk is None:
            walk = 0.8 if self.objectives else 0.9
        if not 0 <= walk <= 1:
            raise ConfigError(f"walk is a probability in [0, 1], got {walk}")
        if front_size < 1:
            raise ConfigError(f"front_size must be >= 1, got {front_size}")
        self.walk, self.front_size = walk, front_size
        self._rng = np.random.default_rng(seed)
        # Each member: (architecture JSON, reward, objective values in `objectives` order).
        self._population: deque[tuple[str, float, list[float]]] = deque()
        self._seen: set[str] = set()
        self._pending: set[str] = set()
        # The best results ever (or the front), which walks start from.
        self._walker = Walker(
            space,
            population,
            list(self.objectives.values()) if self.objectives else None,
            front_size,
        )

    def ask(self) -> Architecture:
        warming_up = len(self._population) + len(self._pending) < self.population_size
        if not warming_up and self._population and self._walks():
            step = self._walk()
            if step is not None:
                return self._propose(step)
        parent = None if warming_up or not self._population else self._tournament()
        draw = (
            (lambda: self.space.sample(self._rng))
            if parent is None
            else (lambda: self.space.mutate(parent, self._rng))
        )
        for _ in range(self.max_tries):
            arch = draw()
            if arch.arch_id not in self._seen:
                break
        else:
            arch = unseen_architecture(
                self.space,
                self._seen,
                self._rng,
                near=parent,
                why=f"regularized evolution drew only seen architectures in {self.max_tries} "
                "tries (the population has converged)",
            )
        return self._propose(arch)

    def _propose(self, arch: Architecture) -> Architecture:
        self._seen.add(arch.arch_id)
        self._pending.add(arch.arch_id)
        return arch

    def _walks(self) -> bool:
        """Whether this ask walks (with probability ``walk``)."""
        return self.walk > 0 and self._rng.random() < self.walk

    def _walk(self) -> Architecture | None:
        """The predicted best unseen neighbour (see the class); None when none is left."""
        return self._walker.step(self._seen)

    def _tournament(self) -> Architecture:
        size = min(self.sample_size, len(self._population))
        picks = self._rng.choice(len(self._population), size=size, replace=False)
        members = [self._population[i] for i in picks]
        if self.objectives is None:
            best = max(members, key=lambda m: m[1])
        else:
            values = np.array([m[2] for m in members])
            ranks = nondominated_ranks(values, list(self.objectives.values()))
            crowd = np.zeros(len(members))
            for rank in set(ranks.tolist()):
                on_front = ranks == rank
                crowd[on_front] = crowding_distance(values[on_front])
            best = members[min(range(len(members)), key=lambda i: (ranks[i], -crowd[i]))]
        return Architecture.from_json(best[0])

    def tell(self, arch: Architecture, outcome: Outcome) -> None:
        arch = self.space.canonicalize(arch)
        self._pending.discard(arch.arch_id)
        self._seen.add(arch.arch_id)
        if not outcome.ok:
            return  # failed candidates never join the population
        values = []
        if self.objectives is not None:
            missing = set(self.objectives) - set(outcome.objectives)
            if missing:
                raise AutosearchError(
                    f"multi-objective evolution needs objectives {sorted(self.objectives)} in "
                    f"every outcome; this one lacks {sorted(missing)}: make the controller's "
                    "objectives a subset of the study's"
                )
            values = [float(outcome.objectives[name]) for name in self.objectives]
        assert outcome.reward is not None  # ok outcomes carry a reward
        self._population.append((arch.to_json(), float(outcome.reward), values))
        self._walker.add(arch, outcome.reward, values)
        if len(self._population) > self.population_size:
            self._population.popleft()  # aging: the oldest dies, however good

    def mark_seen(self, arch_ids: Iterable[str]) -> None:
        self._seen.update(arch_ids)

    def reseed(self, stream: int) -> None:
        self._rng = np.random.default_rng([stream, self.seed or 0])

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self._rng.bit_generator.state,
            "population": [list(m) for m in self._population],
            "seen": sorted(self._seen),
            "pending": sorted(self._pending),
            "walker": self._walker.state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._rng.bit_generator.state = dict(state["rng"])
        self._population = deque((m[0], float(m[1]), list(m[2])) for m in state["population"])
        self._seen = set(state.get("seen", ()))  # absent: the study calls mark_seen
        self._pending = set(state["pending"])
        self._walker.load(state.get("walker", {"elite": state.get("elite", [])}))

    def config(self) -> dict[str, Any]:
        return {
            "population": self.population_size,
            "sample": self.sample_size,
            "seed": self.seed,
            "objectives": self.objectives,
            "max_tries": self.max_tries,
            "walk": self.walk,
            "front_size": self.front_size,
        }
