"""Random search: the baseline every other controller must beat."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from autosearch.architecture import Architecture
from autosearch.controller import Controller, Outcome
from autosearch.errors import AutosearchError
from autosearch.registry import register_controller
from autosearch.space import SearchSpace

__all__ = ["RandomSearch"]


@register_controller("random")
class RandomSearch(Controller):
    """Uniform samples of the space, never proposing an architecture twice.

    Args:
        space: The search space.
        seed: Seed of the controller's own RNG; the same seed gives the same sequence.
        max_tries: Draws per ask before giving up on finding an unseen architecture.
    """

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
        raise AutosearchError(
            f"random search drew only already-seen architectures in {self.max_tries} tries "
            f"({len(self._seen)} seen of at most {self.space.size()} in space "
            f"{self.space.name!r}); the space is (nearly) exhausted: widen it or stop the study"
        )

    def tell(self, arch: Architecture, outcome: Outcome) -> None:
        self._seen.add(arch.arch_id)

    def reseed(self, stream: int) -> None:
        self._rng = np.random.default_rng([stream, self.seed or 0])

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.bit_generator.state, "seen": sorted(self._seen)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._rng.bit_generator.state = dict(state["rng"])
        self._seen = set(state["seen"])

    def config(self) -> dict[str, Any]:
        return {"seed": self.seed, "max_tries": self.max_tries}
