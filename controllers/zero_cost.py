"""The zero-cost warm-up: a controller's first proposals chosen by proxies, untrained.

Abdelfattah et al. (ICLR 2021, "Zero-Cost Proxies for Lightweight NAS", section 5)
score a large uniform draw of the space with a zero-cost proxy and start the search
from the draw's best: the population of an evolution, the first samples of any other
strategy. :class:`ZeroCostWarmup` does that for any controller: ``pool`` architectures
drawn uniformly (seeded) are scored together, the ``first`` best-scored are proposed
first, and every outcome (theirs, and results of other workers) is told to the wrapped
controller, which proposes the rest. Several proxies are combined by their ranks over
the pool: AZ-NAS's sum of log ranks by default, or their mean
(:func:`autosearch.scoring.ranks.combined`; both measured in
``benchmarks/RESULTS.md``).

In a study with ``proxies=`` (:class:`autosearch.ProxyConfig`) the warm-up needs no
scorer: the study scores the pool itself, each candidate as its trial would (its
initialization, the study's batch), keeps the scores in its storage and shares the
scoring between its workers; the warm-up is then stored with the study like any
registered controller (``"zero_cost"``, its wrapped controller given by name and
settings) and resumes with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from autosearch.architecture import Architecture
from autosearch.controller import Controller, Outcome, PoolScorer
from autosearch.errors import ConfigError, UnknownNameError
from autosearch.registry import controllers, register_controller
from autosearch.scoring.ranks import AGGREGATIONS, combined
from autosearch.space import SearchSpace
from controllers.evolution import RegularizedEvolution

__all__ = ["ZeroCostWarmup"]


@register_controller("zero_cost")
class ZeroCostWarmup(Controller):
    """``controller``'s search, started from the best of ``pool`` untrained candidates.

    Args:
        space: The search space (the wrapped controller's).
        controller: The controller that proposes after the warm-up and is told every
            outcome: an instance, or a registered controller's name and settings
            (``{"name": "tpe", "config": {"seed": 0}}``; its space is this one).
            Default: regularized evolution with ``seed``.
        scores: Scores the pool at once: a mapping of proxy name to one value an
            architecture, in the pool's order (for instance each candidate's
            :func:`autosearch.evaluation.proxies.proxy_scores` on one batch of the
            user's training images); ``"cost"``: the pool's FLOPs and parameters at the
            space's budget input (no data, no network built: the papers' baselines).
            Leave it out in a study with ``proxies=``: the study scores the pool
            (:meth:`use_scorer`).
        proxies: The proxies whose combined ranks order the pool (default: every proxy
            ``scores`` returns).
        aggregate: How their ranks combine: ``"log_rank"`` (AZ-NAS's sum of log ranks: a
            candidate must rank high by every proxy) or ``"mean_rank"``.
        pool: Architectures drawn uniformly and scored.
        first: The best-scored of them proposed before the wrapped controller's own.
        seed: Seeds the pool's draw (in a study, None is the study's seed).
        candidates: A pool given instead of the draw (architectures drawn or scored
            elsewhere); ``pool`` is then its size.
    """

    def __init__(
        self,
        space: SearchSpace,
        *,
        controller: Controller | Mapping[str, Any] | None = None,
        scores: PoolScorer | Literal["cost"] | None = None,
        proxies: Sequence[str] | None = None,
        aggregate: str = "log_rank",
        pool: int = 256,
        first: int = 16,
        seed: int | None = None,
        candidates: Sequence[Architecture | Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(space)
        wrapped = _wrapped(space, controller, seed)
        given: list[Architecture] | None = None
        if candidates is not None:
            given = list({a.arch_id: a for a in map(_architecture, candidates)}.values())
            pool = len(given)
        if not 1 <= first <= pool:
            raise ConfigError(
                f"ZeroCostWarmup needs 1 <= first <= pool, got first={first}, pool={pool}: "
                "propose at most the whole scored pool"
            )
        if aggregate not in AGGREGATIONS:
            raise UnknownNameError("aggregation", aggregate, AGGREGATIONS)
        if wrapped.space is not space:
            raise ConfigError("ZeroCostWarmup's controller must search the same space object")
        if isinstance(scores, str) and scores != "cost":
            raise ConfigError(
                f"ZeroCostWarmup's scores={scores!r}: give a function, 'cost' (FLOPs and "
                "parameters), or nothing in a study with proxies="
            )
        self.controller, self._scores_given = wrapped, scores  # a study's scorer is not given
        self.scores = self._cost if scores == "cost" else scores
        self._study_seed: int | None = None  # the pool's seed in a study, where none is given
        self.proxies = tuple(proxies) if proxies is not None else None
        self.aggregate = aggregate
        self.pool, self.first, self.seed, self.candidates = pool, first, seed, given
        self._queue: list[Architecture] | None = None  # scored at the first ask
        self._seen: set[str] = set()
        self._stream: int | None = None  # a parallel worker's own (reseed)
        self.ranked: list[tuple[str, float]] = []  # the pool, best first: (id, estimate)

    @property
    def needs_scorer(self) -> bool:
        return self._scores_given is None

    def use_scorer(self, scorer: PoolScorer, *, seed: int) -> None:
        """A study's scorer (its proxies of each candidate, stored and shared by its
        workers) and seed, where no scorer was given (the study's replaces another
        study's, should this object be handed to a second one)."""
        if self._scores_given is None:
            self.scores, self._study_seed = scorer, seed

    def _cost(self, archs: Sequence[Architecture]) -> dict[str, list[float]]:
        costs = [self.space.cost(a) for a in archs]
        return {
            "flops": [float(c.flops) for c in costs],
            "params": [float(c.params) for c in costs],
        }

    def _draw(self) -> list[Architecture]:
        if self.candidates is not None:
            return list(self.candidates)
        rng = np.random.default_rng(self.seed if self.seed is not None else self._study_seed)
        drawn: dict[str, Architecture] = {}
        for _ in range(50 * self.pool):  # a small space may hold fewer than `pool`
            arch = self.space.sample(rng)
            drawn.setdefault(arch.arch_id, arch)
            if len(drawn) == self.pool:
                break
        return list(drawn.values())

    def _warm_up(self) -> list[Architecture]:
        if self.scores is None:
            raise ConfigError(
                "ZeroCostWarmup has no scorer: give scores=, or run it in a study with "
                "proxies=autosearch.ProxyConfig(...), which scores the pool on its own images"
            )
        archs = self._draw()
        found = self.scores(archs)
        names = self.proxies or tuple(found)
        missing = [n for n in names if len(found.get(n, ())) != len(archs)]
        if missing or not names:
            raise ConfigError(
                f"ZeroCostWarmup's scores returned {sorted(found)}, without one value for "
                f"each of the {len(archs)} candidates for {missing or names}: name proxies "
                "that the scorer computes, one value an architecture in the pool's order"
            )
        estimate = combined({n: found[n] for n in names}, self.aggregate)
        order = np.argsort(-estimate, kind="stable")
        self.ranked = [(archs[i].arch_id, float(estimate[i])) for i in order]
        return [archs[i] for i in order[: self.first]]

    def ask(self) -> Architecture:
        if self._queue is None:
            self._queue = self._warm_up()
            if self._stream is not None:
                self._queue = _in_order_of(self._queue, self._stream)
        while self._queue:
            arch = self._queue.pop(0)
            if arch.arch_id not in self._seen:
                self._seen.add(arch.arch_id)
                # Proposed, not yet told: the wrapped controller must not propose it too
                # (parallel workers ask again before any result comes back).
                self.controller.mark_seen([arch.arch_id])
                return arch
        arch = self.controller.ask()
        self._seen.add(arch.arch_id)
        return arch

    def tell(self, arch: Architecture, outcome: Outcome) -> None:
        self._seen.add(arch.arch_id)
        self.controller.tell(arch, outcome)

    def mark_seen(self, arch_ids: Iterable[str]) -> None:
        ids = list(arch_ids)
        self._seen.update(ids)
        self.controller.mark_seen(ids)

    def reseed(self, stream: int) -> None:
        """The wrapped controller's stream, and the warm-up's remaining proposals in an
        order of the stream's own: parallel workers take different ones first."""
        self.controller.reseed(stream)
        self._stream = stream
        if self._queue:
            self._queue = _in_order_of(self._queue, stream)

    def state_dict(self) -> dict[str, Any]:
        return {
            "queue": None if self._queue is None else [a.to_dict() for a in self._queue],
            "ranked": [list(r) for r in self.ranked],
            "seen": sorted(self._seen),
            "stream": self._stream,
            "controller": self.controller.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        queue = state.get("queue")
        self._queue = None if queue is None else [Architecture.from_dict(a) for a in queue]
        self.ranked = [(str(i), float(r)) for i, r in state.get("ranked", ())]
        self._seen = set(state.get("seen", ()))
        stream = state.get("stream")
        self._stream = None if stream is None else int(stream)
        self.controller.load_state_dict(state["controller"])

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "controller": {"name": self.controller.name, "config": self.controller.config()},
            "proxies": list(self.proxies) if self.proxies is not None else None,
            "aggregate": self.aggregate,
            "pool": self.pool,
            "first": self.first,
            "seed": self.seed,
            "candidates": (
                [a.to_dict() for a in self.candidates] if self.candidates is not None else None
            ),
        }
        if self._scores_given is not None:  # code: a study refuses to store it (not JSON)
            config["scores"] = self._scores_given
        return config


def _wrapped(
    space: SearchSpace, controller: Controller | Mapping[str, Any] | None, seed: int | None
) -> Controller:
    """The wrapped controller: as given, built from its registered name and settings,
    or (none given) regularized evolution seeded like the warm-up."""
    if controller is None:
        return RegularizedEvolution(space, seed=seed)
    if isinstance(controller, Controller):
        return controller
    if not isinstance(controller, Mapping) or not isinstance(controller.get("name"), str):
        raise ConfigError(
            f"ZeroCostWarmup's controller={controller!r}: give a controller, or its "
            'registered name and settings ({"name": "evolution", "config": {"seed": 0}})'
        )
    if controller["name"] == ZeroCostWarmup.name:
        raise ConfigError("ZeroCostWarmup cannot wrap another ZeroCostWarmup")
    return controllers.get(controller["name"])(space, **dict(controller.get("config") or {}))


def _architecture(given: Architecture | Mapping[str, Any]) -> Architecture:
    return given if isinstance(given, Architecture) else Architecture.from_dict(given)


def _in_order_of(queue: list[Architecture], stream: int) -> list[Architecture]:
    return [queue[int(i)] for i in np.random.default_rng(stream).permutation(len(queue))]
