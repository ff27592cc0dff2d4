"""Random search: the baseline every other controller must beat."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from autosearch.architecture import Architecture
from autosearch.controller import Controller, Outcome, unseen_architecture
from autosearch.registry import register_controller
from autosearch.space import SearchSpace

__all__ = ["RandomSearch"]


@register_controller("random")
class RandomSearch(Controller):
    """Uniform samples of the space, never proposing an architecture twice.

    Args:
        space: The search space.
        seed: Seed of the controller's own RNG; the same seed gives the same sequence.
        max_tries: Draws per ask before falling back to :func:`unseen_architecture`
            (the space is then nearly exhausted; only an exhausted one ends a study).
    """

    seen_state = frozenset({"seen"})

    def __init__(
        self, space: SearchSpace, *, seed: int | None = None, max_tries: int = 1000
    ) -> None:
        super().__init__(space)
        self.seed = seed
        self.max_tries = max_tries
        self._rng = np.random.default_rng(seed)
        self._seen: set[str] = set()

    def ask(self) -> Architecture:
        for _ in range(self.max_tries):
            arch = self.space.sample(self._rng)
            if arch.arch_id not in self._seen:
                self._seen.add(arch.arch_id)
                return arch
        arch = unseen_architecture(
            self.space,
            self._seen,
            self._rng,
            why=f"random search drew only seen architectures in {self.max_tries} tries",
        )
        self._seen.add(arch.arch_id)
        return arch

    def tell(self, arch: Architecture, outcome: Outcome) -> None:
        self._seen.add(arch.arch_id)

    def mark_seen(self, arch_ids: Iterable[str]) -> None:
        self._seen.update(arch_ids)

    def reseed(self, stream: int) -> None:
        self._rng = np.random.default_rng([stream, self.seed or 0])

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.bit_generator.state, "seen": sorted(self._seen)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._rng.bit_generator.state = dict(state["rng"])
        self._seen = set(state.get("seen", ()))  # absent: the study calls mark_seen

    def config(self) -> dict[str, Any]:
        return {"seed": self.seed, "max_tries": self.max_tries}
