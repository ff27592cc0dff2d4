"""Predictor-guided local search: walk the best results' one-gene neighbourhoods, most
promising neighbour first.

Local search is a strong baseline on NAS-Bench-201 (White, Nolen, Savani: "Local Search
is State of the Art for NAS Benchmarks", 2020): its landscape has few local optima, so
from the best architecture seen the optimum is a few one-gene changes away. Which of
the best's neighbours to evaluate first is decided by a predictor, as in BANANAS and
NPENAS: a ridge regression on the genes' one-hot encoding, refitted at every ask on the
best and the latest few results (a local model: on NB201 it ranked neighbours better
than one fitted on every result), which learns which value of each gene pays near the
top (:mod:`controllers._walk`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from autosearch.architecture import Architecture
from autosearch.controller import Controller, Outcome, unseen_architecture
from autosearch.errors import ConfigError
from autosearch.registry import register_controller
from autosearch.space import SearchSpace
from controllers._walk import Walker

__all__ = ["LocalSearch"]


@register_controller("local")
class LocalSearch(Controller):
    """Random warm-up, then a best-first walk over one-gene neighbourhoods.

    The first ``warmup`` asks are uniform samples. After that each ask proposes the
    unseen neighbour (one gene changed) of the best result that the predictor ranks
    highest; when every neighbour of the best is seen (a local optimum), the predicted
    best of all the unseen neighbours of the best ``size`` results (two steps from the
    optimum: on NB201-like tables this escaped to the optimum's basin far more often
    than walking the next best result's neighbourhood alone); when all are seen, an
    unseen architecture near the best
    (:func:`autosearch.controller.unseen_architecture`). Pending asks count as seen, so
    parallel workers walk different neighbours, and results of architectures it never
    asked for (other workers, a resumed study) are learnt from alike.

    Args:
        space: The search space.
        warmup: Uniform samples before the walk starts.
        size: How many of the best and of the latest results the predictor is fitted
            on; the best of them are where walks start. With the escape from local
            optima, 20 found the best cell of three synthetic NB201 tables by 150
            evaluations in 97 % of seeds against 90 % for 10 (benchmarks/RESULTS.md).
        ridge: L2 penalty of the predictor (ridge regression on one-hot genes).
        seed: Seed of the controller's RNG.
    """

    seen_state = frozenset({"seen"})

    def __init__(
        self,
        space: SearchSpace,
        *,
        warmup: int = 10,
        size: int = 20,
        ridge: float = 1.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(space)
        if warmup < 1 or size < 1 or not ridge > 0:
            raise ConfigError(
                f"LocalSearch needs warmup >= 1, size >= 1 and ridge > 0, got "
                f"warmup={warmup}, size={size}, ridge={ridge}"
            )
        self.warmup, self.size, self.ridge, self.seed = warmup, size, ridge, seed
        self._rng = np.random.default_rng(seed)
        self._walker = Walker(space, size, ridge=ridge)
        self._results = 0  # ok results told
        self._seen: set[str] = set()
        self._pending: set[str] = set()  # asked, not told yet

    def ask(self) -> Architecture:
        if self._results + len(self._pending) < self.warmup or not self._results:
            arch = self._sample()
        else:
            arch = self._walker.step(self._seen) or unseen_architecture(
                self.space,
                self._seen,
                self._rng,
                near=Architecture.from_json(self._walker.elite.members[0][0]),
                why="local search has walked every neighbourhood of its best results",
            )
        self._seen.add(arch.arch_id)
        self._pending.add(arch.arch_id)
        return arch

    def _sample(self) -> Architecture:
        for _ in range(100):
            arch = self.space.sample(self._rng)
            if arch.arch_id not in self._seen:
                return arch
        return unseen_architecture(self.space, self._seen, self._rng)

    def tell(self, arch: Architecture, outcome: Outcome) -> None:
        arch = self.space.canonicalize(arch)
        self._pending.discard(arch.arch_id)
        self._seen.add(arch.arch_id)
        if outcome.ok and outcome.reward is not None:
            self._walker.add(arch, float(outcome.reward))
            self._results += 1

    def mark_seen(self, arch_ids: Iterable[str]) -> None:
        self._seen.update(arch_ids)

    def reseed(self, stream: int) -> None:
        self._rng = np.random.default_rng([stream, self.seed or 0])

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self._rng.bit_generator.state,
            "walker": self._walker.state(),
            "results": self._results,
            "seen": sorted(self._seen),
            "pending": sorted(self._pending),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._rng.bit_generator.state = dict(state["rng"])
        self._walker = Walker(self.space, self.size, ridge=self.ridge)
        results = state["results"]
        if isinstance(results, list):  # saved before the walker: every result, as told
            for arch_json, reward in results:
                self._walker.add(Architecture.from_json(arch_json), float(reward))
            results = len(results)
        else:
            self._walker.load(state["walker"])
        self._results = int(results)
        self._seen = set(state.get("seen", ()))  # absent: the study calls mark_seen
        self._pending = set(state["pending"])

    def config(self) -> dict[str, Any]:
        return {"warmup": self.warmup, "size": self.size, "ridge": self.ridge, "seed": self.seed}
