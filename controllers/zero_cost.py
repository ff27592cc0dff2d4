"""The zero-cost warm-up: a controller's first proposals chosen by proxies, untrained.

Abdelfattah et al. (ICLR 2021, "Zero-Cost Proxies for Lightweight NAS", section 5)
score a large uniform draw of the space with a zero-cost proxy and start the search
from the draw's best: the population of an evolution, the first samples of any other
strategy. :class:`ZeroCostWarmup` does that for any controller: ``pool`` architectures
drawn uniformly (seeded) are scored together, the ``first`` best-scored are proposed
first, and every outcome (theirs, and results of other workers) is told to the wrapped
controller, which proposes the rest. Several proxies are combined as the mean of their
ranks over the pool (the ensemble measured in ``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from autosearch.architecture import Architecture
from autosearch.controller import Controller, Outcome
from autosearch.errors import ConfigError
from autosearch.space import SearchSpace

__all__ = ["ZeroCostWarmup"]

#: Scores of a pool: each proxy's value for every architecture, in the pool's order
#: (higher is better; NaN where a proxy could not be computed).
Scorer = Callable[[Sequence[Architecture]], Mapping[str, Sequence[float]]]


class ZeroCostWarmup(Controller):
    """``controller``'s search, started from the best of ``pool`` untrained candidates.

    Args:
        space: The search space (the wrapped controller's).
        controller: The controller that proposes after the warm-up and is told every
            outcome.
        scores: Scores the pool at once: a mapping of proxy name to one value an
            architecture, in the pool's order (for instance each candidate's
            :func:`autosearch.evaluation.proxies.proxy_scores` on one batch of the
            study's training images).
        proxies: The proxies whose mean rank orders the pool (default: every proxy
            ``scores`` returns).
        pool: Architectures drawn uniformly and scored.
        first: The best-scored of them proposed before the wrapped controller's own.
        seed: Seeds the pool's draw.
        candidates: A pool given instead of the draw (architectures drawn or scored
            elsewhere); ``pool`` is then its size.
    """

    def __init__(
        self,
        space: SearchSpace,
        *,
        controller: Controller,
        scores: Scorer,
        proxies: Sequence[str] | None = None,
        pool: int = 256,
        first: int = 16,
        seed: int | None = None,
        candidates: Sequence[Architecture] | None = None,
    ) -> None:
        super().__init__(space)
        if candidates is not None:
            candidates = list({a.arch_id: a for a in candidates}.values())
            pool = len(candidates)
        if not 1 <= first <= pool:
            raise ConfigError(
                f"ZeroCostWarmup needs 1 <= first <= pool, got first={first}, pool={pool}: "
                "propose at most the whole scored pool"
            )
        if controller.space is not space:
            raise ConfigError("ZeroCostWarmup's controller must search the same space object")
        self.controller, self.scores = controller, scores
        self.proxies = tuple(proxies) if proxies is not None else None
        self.pool, self.first, self.seed, self.candidates = pool, first, seed, candidates
        self._queue: list[Architecture] | None = None  # scored at the first ask
        self._seen: set[str] = set()
        self.ranked: list[tuple[str, float]] = []  # the pool, best first: (id, mean rank)

    def _draw(self) -> list[Architecture]:
        if self.candidates is not None:
            return list(self.candidates)
        rng = np.random.default_rng(self.seed)
        drawn: dict[str, Architecture] = {}
        for _ in range(50 * self.pool):  # a small space may hold fewer than `pool`
            arch = self.space.sample(rng)
            drawn.setdefault(arch.arch_id, arch)
            if len(drawn) == self.pool:
                break
        return list(drawn.values())

    def _warm_up(self) -> list[Architecture]:
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
        ranks = [
            stats.rankdata(np.nan_to_num(np.asarray(found[n], float), nan=-np.inf)) for n in names
        ]
        mean = np.mean(ranks, axis=0)
        order = np.argsort(-mean, kind="stable")
        self.ranked = [(archs[i].arch_id, float(mean[i])) for i in order]
        return [archs[i] for i in order[: self.first]]

    def ask(self) -> Architecture:
        if self._queue is None:
            self._queue = self._warm_up()
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
        self.controller.reseed(stream)

    def state_dict(self) -> dict[str, Any]:
        return {
            "queue": None if self._queue is None else [a.to_dict() for a in self._queue],
            "ranked": [list(r) for r in self.ranked],
            "seen": sorted(self._seen),
            "controller": self.controller.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        queue = state.get("queue")
        self._queue = None if queue is None else [Architecture.from_dict(a) for a in queue]
        self.ranked = [(str(i), float(r)) for i, r in state.get("ranked", ())]
        self._seen = set(state.get("seen", ()))
        self.controller.load_state_dict(state["controller"])

    def config(self) -> dict[str, Any]:
        return {
            "controller": self.controller,
            "scores": self.scores,
            "proxies": self.proxies,
            "pool": self.pool,
            "first": self.first,
            "seed": self.seed,
            "candidates": self.candidates,
        }
