"""The best results a controller has seen, where its neighbourhood walks start.

On NB201-like landscapes the optimum is a few one-gene steps from the best results
seen, so a step to an unseen neighbour of the best one finds it far more often than a
fresh draw (benchmarks/RESULTS.md). Evolution and REINFORCE take such steps for a share
of their asks (``walk``); they differ in which neighbour: a uniform one, or the one the
policy finds most probable.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

from autosearch.architecture import Architecture
from autosearch.space import SearchSpace


class Neighbourhoods:
    """A cache of results' unseen one-gene neighbours within the budget, by result JSON.
    Seen architectures only accumulate, so a cached list only shrinks."""

    def __init__(self) -> None:
        self._near: dict[str, list[Architecture]] = {}

    def unseen(
        self, space: SearchSpace, arch_json: str, seen: Collection[str]
    ) -> list[Architecture]:
        """``arch_json``'s neighbours within the budget that are not in ``seen``."""
        near = self._near.get(arch_json)
        if near is None:
            parent = Architecture.from_json(arch_json)
            near = [a for a in space.neighbours(parent) if space.within_budget(a)]
        near = self._near[arch_json] = [a for a in near if a.arch_id not in seen]
        return near

    def last(self, arch_json: str) -> list[Architecture] | None:
        """What :meth:`unseen` last found for ``arch_json`` (None: never asked)."""
        return self._near.get(arch_json)

    def keep(self, kept: Collection[str]) -> None:
        """Forget every result but ``kept``."""
        self._near = {k: v for k, v in self._near.items() if k in kept}

    def clear(self) -> None:
        self._near.clear()


class Elite:
    """The ``size`` best results ever (architecture JSON, reward), best first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.members: list[tuple[str, float]] = []
        self._near = Neighbourhoods()

    def add(self, arch: Architecture, reward: float) -> None:
        self.members.append((arch.to_json(), float(reward)))
        self.members.sort(key=lambda m: -m[1])  # stable: the earlier of equals first
        del self.members[self.size :]
        self._near.keep({m[0] for m in self.members})

    def neighbourhoods(
        self, space: SearchSpace, seen: Collection[str]
    ) -> Iterator[tuple[str, list[Architecture]]]:
        """Each member (its JSON) with its unseen one-gene neighbours within the
        budget, best member first, skipping members whose neighbourhood is all seen."""
        for arch_json, _ in self.members:
            near = self._near.unseen(space, arch_json, seen)
            if near:
                yield arch_json, near

    def unseen_near(self, arch_json: str) -> list[Architecture] | None:
        """A member's unseen neighbours as :meth:`neighbourhoods` last found them (None
        if it has not looked at that member since it joined)."""
        return self._near.last(arch_json)

    def state(self) -> list[list[Any]]:
        return [list(m) for m in self.members]

    def load(self, state: list[list[Any]]) -> None:
        self.members = [(str(a), float(r)) for a, r in state]
        self._near.clear()
