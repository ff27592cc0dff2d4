"""Predictor-guided neighbourhood walks, shared by the controllers that take them.

On NB201-like landscapes the optimum is a few one-gene steps from the best results,
and the Pareto front is made of near neighbours, so a step to an unseen neighbour of
the best result (or of a front member) finds them far sooner than a fresh draw
(benchmarks/RESULTS.md). Which neighbour is decided by a predictor (ridge regression
on one-hot genes, :mod:`controllers._predictor`) fitted on the best and the most
recent results: single objective, the neighbour of the best result predicted best
(once the best is a local optimum, every neighbour seen, the predicted best neighbour
of any of the best results); multi-objective, the neighbour of a front member whose
predicted objectives (anchored on that member's measured ones) would add the most
hypervolume to the front, or when none would, the one predicted nearest to it.

Everything a walker keeps is bounded (the best ``size`` results, the last ``size``,
and at most ``front_size`` front members), so a controller's saved state does not grow
with the study.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

from autosearch.architecture import Architecture
from autosearch.scoring.pareto import Direction, crowding_distance, hypervolume_gains, pareto_mask
from autosearch.space import SearchSpace
from controllers._elite import Elite, Neighbourhoods
from controllers._predictor import OneHotRidge


class Walker:
    """Where the next walk steps, from the results it was given.

    Args:
        space: The search space.
        size: How many of the best (single objective) and of the latest results it keeps.
        directions: The objectives' directions for multi-objective walks; None: the
            reward, maximised.
        front_size: Multi-objective: the most non-dominated results kept (the most
            crowded are dropped beyond it).
        ridge: L2 penalty of the predictor.
    """

    def __init__(
        self,
        space: SearchSpace,
        size: int,
        directions: Sequence[Direction] | None = None,
        front_size: int = 100,
        ridge: float = 1.0,
    ) -> None:
        self.space, self.size, self.front_size = space, size, front_size
        self.directions = list(directions) if directions else None
        self.elite = Elite(size)
        self.recent: deque[tuple[str, float, list[float]]] = deque(maxlen=size)
        self.front: list[tuple[str, list[float]]] = []  # (JSON, objective values)
        self._front_near = Neighbourhoods()
        self._predictor = OneHotRidge(space, ridge)

    def add(self, arch: Architecture, reward: float, values: Sequence[float] = ()) -> None:
        """A result: its reward and (multi-objective) its objective values."""
        arch_json = arch.to_json()
        self.recent.append((arch_json, float(reward), [float(v) for v in values]))
        if self.directions is None:
            self.elite.add(arch, reward)
        else:
            self._add_to_front(arch_json, [float(v) for v in values])

    def step(self, seen: Collection[str]) -> Architecture | None:
        """The unseen neighbour to evaluate next; None when every neighbourhood it
        starts from is seen."""
        if self.directions is not None:
            return self._front_step(seen)
        hoods = self.elite.neighbourhoods(self.space, seen)
        first = next(hoods, None)
        if first is None:
            return None
        starts = [first]
        if not self.elite.unseen_near(self.elite.members[0][0]):
            # The best result is a local optimum, all its neighbours seen: the
            # predicted best of all the elite's unseen neighbours (two steps from the
            # optimum), rather than the next best's alone, escapes to a better basin.
            starts += hoods
        known = dict(self.elite.members)
        known.update((a, r) for a, r, _ in self.recent)
        model = self._predictor.fit(
            [Architecture.from_json(a) for a in known], np.array(list(known.values()))
        )
        candidates, _ = self._pool(starts)
        return candidates[int(np.argmax(model.predict(candidates)[:, 0]))]

    def _front_step(self, seen: Collection[str]) -> Architecture | None:
        starts: list[tuple[str, list[Architecture]]] = []
        for arch_json, _ in self.front:
            near = self._front_near.unseen(self.space, arch_json, seen)
            if near:
                starts.append((arch_json, near))
        if not starts:
            return None
        assert self.directions is not None
        sign = np.array([-1.0 if d == "maximize" else 1.0 for d in self.directions])
        known = {a: v for a, v in self.front}
        known.update((a, v) for a, _, v in self.recent)
        parsed = {a: Architecture.from_json(a) for a in known}
        model = self._predictor.fit(list(parsed.values()), np.array(list(known.values())) * sign)
        candidates, parents = self._pool(starts)
        # Each prediction anchored on the front member it neighbours: plus that member's
        # residual (what the model got wrong about it, measured), so that the
        # neighbours of a member the model underrates are not underrated too (fronts at
        # 300 evaluations: +0.1 to +0.5 points of hypervolume; benchmarks/RESULTS.md).
        members = [a for a, _ in starts]
        residual = model.standardise(np.array([known[a] for a in members]) * sign) - model.predict(
            [parsed[a] for a in members]
        )
        predicted = model.predict(candidates) + residual[parents]
        front = model.standardise(np.array([v for _, v in self.front]) * sign)
        # The reference a standard deviation beyond the worst: the front's ends (the most
        # accurate, the cheapest) count as much as its middle.
        reference = np.maximum(front.max(axis=0), predicted.max(axis=0)) + 1.0
        gains = hypervolume_gains(front, predicted, reference)
        if gains.max() > 0:
            return candidates[int(np.argmax(gains))]  # the first of equals: deterministic
        # Every candidate is predicted dominated: the one nearest to the front (the
        # smallest shift of all its objectives that would make it non-dominated).
        shift = (predicted[:, None, :] - front[None, :, :]).min(axis=2).max(axis=1)
        return candidates[int(np.argmin(shift))]

    @staticmethod
    def _pool(
        starts: Iterable[tuple[str, list[Architecture]]],
    ) -> tuple[list[Architecture], np.ndarray]:
        """The unseen neighbours of ``starts`` (result JSON, its unseen neighbours), each
        once, and the index in ``starts`` of the first result it neighbours."""
        candidates: dict[str, tuple[Architecture, int]] = {}
        for i, (_, near) in enumerate(starts):
            for arch in near:
                candidates.setdefault(arch.arch_id, (arch, i))
        return [a for a, _ in candidates.values()], np.array([i for _, i in candidates.values()])

    def _add_to_front(self, arch_json: str, values: list[float]) -> None:
        assert self.directions is not None
        points = np.array([v for _, v in self.front] + [values])
        keep = pareto_mask(points, self.directions)
        if not keep[-1]:
            return
        self.front = [m for m, k in zip([*self.front, (arch_json, values)], keep, strict=True) if k]
        if len(self.front) > self.front_size:  # drop the most crowded
            crowd = crowding_distance(np.array([v for _, v in self.front]))
            del self.front[int(np.argmin(crowd))]
        self._front_near.keep({m[0] for m in self.front})

    def state(self) -> dict[str, Any]:
        return {
            "elite": self.elite.state(),
            "recent": [list(m) for m in self.recent],
            "front": [list(m) for m in self.front],
        }

    def load(self, state: dict[str, Any]) -> None:
        self.elite.load(state.get("elite", []))
        self.recent = deque(
            ((str(a), float(r), [float(x) for x in v]) for a, r, v in state.get("recent", [])),
            maxlen=self.size,
        )
        self.front = [(str(a), [float(x) for x in v]) for a, v in state.get("front", [])]
        self._front_near.clear()
