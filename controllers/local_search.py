"""Predictor-guided local search: walk the best result's one-gene neighbourhood, most
promising neighbour first.

Local search is a strong baseline on NAS-Bench-201 (White, Nolen, Savani: "Local Search
is State of the Art for NAS Benchmarks", 2020): its landscape has few local optima, so
from the best architecture seen the optimum is a few one-gene changes away. Which of
the best's neighbours to evaluate first is decided by a predictor, as in BANANAS and
NPENAS: here a ridge regression on the genes' one-hot encoding, refitted on every
result (milliseconds), which learns which value of each gene pays.
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

__all__ = ["LocalSearch"]


@register_controller("local")
class LocalSearch(Controller):
    """Random warm-up, then a best-first walk over one-gene neighbourhoods.

    The first ``warmup`` asks are uniform samples. After that each ask proposes the
    unseen neighbour (one gene changed) of the best result that the predictor ranks
    highest; when every neighbour of the best is seen (a local optimum), the next best
    result's neighbourhood is walked, and so on; when all are seen, an unseen
    architecture near the best (:func:`autosearch.controller.unseen_architecture`).
    Pending asks count as seen, so parallel workers walk different neighbours, and
    results of architectures it never asked for (other workers, a resumed study) are
    learnt from alike.

    Args:
        space: The search space.
        warmup: Uniform samples before the walk starts.
        ridge: L2 penalty of the predictor (ridge regression on one-hot genes).
        seed: Seed of the controller's RNG.
    """

    seen_state = frozenset({"seen"})

    def __init__(
        self,
        space: SearchSpace,
        *,
        warmup: int = 10,
        ridge: float = 1.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(space)
        if warmup < 1 or not ridge > 0:
            raise ConfigError(
                f"LocalSearch needs warmup >= 1 and ridge > 0, got warmup={warmup}, ridge={ridge}"
            )
        self.warmup, self.ridge, self.seed = warmup, ridge, seed
        self._rng = np.random.default_rng(seed)
        self._results: list[tuple[str, float]] = []  # (architecture JSON, reward), as told
        self._seen: set[str] = set()
        self._pending: set[str] = set()  # asked, not told yet
        self._rows: list[np.ndarray] | None = []  # encoded results: a cache, not state

    def ask(self) -> Architecture:
        if len(self._results) + len(self._pending) < self.warmup or not self._results:
            arch = self._sample()
        else:
            arch = self._walk()
        self._seen.add(arch.arch_id)
        self._pending.add(arch.arch_id)
        return arch

    def _sample(self) -> Architecture:
        for _ in range(100):
            arch = self.space.sample(self._rng)
            if arch.arch_id not in self._seen:
                return arch
        return unseen_architecture(self.space, self._seen, self._rng)

    def _walk(self) -> Architecture:
        weights = self._fit()
        ranked = sorted(self._results, key=lambda r: -r[1])
        for arch_json, _ in ranked:
            parent = Architecture.from_json(arch_json)
            options = [a for a in self.space.neighbours(parent) if a.arch_id not in self._seen]
            if not options:
                continue  # a local optimum, walked already: the next best
            predicted = np.stack([self._encode(a) for a in options]) @ weights
            for index in np.argsort(-predicted, kind="stable"):
                if self.space.within_budget(options[index]):
                    return options[index]
        best = Architecture.from_json(ranked[0][0])
        return unseen_architecture(
            self.space,
            self._seen,
            self._rng,
            near=best,
            why="local search has walked every neighbourhood of its results",
        )

    def _encode(self, arch: Architecture) -> np.ndarray:
        return np.append(self.space.one_hot(arch), 1.0)  # and an intercept

    def _fit(self) -> np.ndarray:
        """Ridge regression of reward on one-hot genes (and an intercept)."""
        if self._rows is None:  # restored: encode the results once
            self._rows = [self._encode(Architecture.from_json(a)) for a, _ in self._results]
        x = np.stack(self._rows)
        y = np.array([r for _, r in self._results])
        penalty = self.ridge * np.eye(x.shape[1])
        penalty[-1, -1] = 0.0  # the intercept is not shrunk
        return np.linalg.solve(x.T @ x + penalty, x.T @ y)

    def tell(self, arch: Architecture, outcome: Outcome) -> None:
        arch = self.space.canonicalize(arch)
        self._pending.discard(arch.arch_id)
        self._seen.add(arch.arch_id)
        if outcome.ok and outcome.reward is not None:
            self._results.append((arch.to_json(), float(outcome.reward)))
            if self._rows is not None:
                self._rows.append(self._encode(arch))

    def mark_seen(self, arch_ids: Iterable[str]) -> None:
        self._seen.update(arch_ids)

    def reseed(self, stream: int) -> None:
        self._rng = np.random.default_rng([stream, self.seed or 0])

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self._rng.bit_generator.state,
            "results": [list(r) for r in self._results],
            "seen": sorted(self._seen),
            "pending": sorted(self._pending),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._rng.bit_generator.state = dict(state["rng"])
        self._results = [(a, float(r)) for a, r in state["results"]]
        self._rows = None
        self._seen = set(state.get("seen", ()))  # absent: the study calls mark_seen
        self._pending = set(state["pending"])

    def config(self) -> dict[str, Any]:
        return {"warmup": self.warmup, "ridge": self.ridge, "seed": self.seed}
