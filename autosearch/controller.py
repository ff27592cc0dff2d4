"""The controller protocol and the outcome a trial reports to it."""

from __future__ import annotations

import abc
import itertools
import logging
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from autosearch.architecture import Architecture
from autosearch.errors import ConfigError, InvalidArchitectureError, SpaceExhausted
from autosearch.space import SearchSpace

__all__ = ["Controller", "Outcome", "PoolScorer", "unseen_architecture"]

logger = logging.getLogger(__name__)

# Spaces up to this many gene assignments are enumerated, when draws find nothing
# unseen, to tell a truly exhausted space from bad luck (NB201: 15,625).
_ENUMERABLE = 1_000_000

Status = Literal["complete", "failed", "stopped"]

#: Scores a pool of untrained candidates at once: each zero-cost proxy's value for every
#: architecture, in the pool's order (higher is better; NaN where one cannot be had).
PoolScorer = Callable[[Sequence[Architecture]], Mapping[str, Sequence[float]]]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a trial tells its controller.

    Attributes:
        reward: The scalar to maximise (higher is better); ``None`` for a failed trial.
        objectives: The study's objective values by name (``{"accuracy": .97, "flops": 2e6}``).
        status: ``"complete"``, ``"failed"`` (no usable result) or ``"stopped"`` (ended
            early by the study; ``reward`` is the value reached so far).
        reason: Why the trial failed or stopped.
    """

    reward: float | None = None
    objectives: Mapping[str, float] = field(default_factory=dict)
    status: Status = "complete"
    reason: str = ""

    def __post_init__(self) -> None:
        if self.status not in ("complete", "failed", "stopped"):
            raise ConfigError(f"status must be complete, failed or stopped, not {self.status!r}")
        if self.status != "failed" and (self.reward is None or not math.isfinite(self.reward)):
            raise ConfigError(
                f"a {self.status} outcome needs a finite reward, got {self.reward!r}; "
                "use Outcome.failed(reason) for a trial without a result"
            )
        object.__setattr__(self, "objectives", dict(self.objectives))

    @classmethod
    def failed(cls, reason: str) -> Outcome:
        return cls(status="failed", reason=reason)

    @property
    def ok(self) -> bool:
        return self.status != "failed"


class Controller(abc.ABC):
    """Base class of every search strategy.

    A controller proposes architectures of ``space`` (:meth:`ask`) and learns from
    outcomes (:meth:`tell`). ``ask`` may be called several times before any
    ``tell``; ``tell`` accepts architectures the controller never proposed (results
    of other workers, or stored results replayed when a study resumes). Seeded
    controllers repeat their decisions exactly.
    """

    name: ClassVar[str] = ""

    def __init__(self, space: SearchSpace, **options: Any) -> None:
        """Every controller takes its space first, then keyword-only options
        (``seed=`` among them) that :meth:`config` returns."""
        self.space = space

    @abc.abstractmethod
    def ask(self) -> Architecture:
        """Propose the next architecture to evaluate."""

    @abc.abstractmethod
    def tell(self, arch: Architecture, outcome: Outcome) -> None:
        """Learn from the outcome of ``arch`` (asked by this controller or not)."""

    #: Keys of :meth:`state_dict` that :meth:`mark_seen` rebuilds from a study's trials.
    #: A study leaves them out of the state it saves after every trial (they grow with
    #: the study) and calls :meth:`mark_seen` with its trials' architectures when it opens.
    seen_state: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The controller's full state as JSON values."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; later asks repeat the original's."""

    def mark_seen(self, arch_ids: Iterable[str]) -> None:
        """These architectures are in the study already (running, finished or failed):
        never propose them. Restores the :attr:`seen_state` keys a study did not save.
        Controllers that do not track what they have proposed keep this no-op."""
        return None

    def reseed(self, stream: int) -> None:
        """Draw from now on from random stream ``stream``, independent of the current
        one (its state then travels in :meth:`state_dict`). Parallel workers of one
        study each take a stream of their own, so they rarely propose the same
        architecture at once. Controllers without randomness keep this no-op."""
        return None

    @property
    def needs_scorer(self) -> bool:
        """True for a controller that ranks untrained candidates by zero-cost proxies
        (the warm-up of controllers/zero_cost.py) and has no scorer of its own: a study
        gives it one (:meth:`use_scorer`), and refuses it without ``proxies=``."""
        return False

    def use_scorer(self, scorer: PoolScorer, *, seed: int) -> None:
        """Called by a study that scores its candidates by zero-cost proxies:
        ``scorer`` computes the study's proxies of a pool of architectures, each as its
        trial stores them (its initialization, the study's batch); ``seed`` is the
        study's. Controllers that do not score untrained candidates keep this no-op."""
        return None

    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """Constructor arguments except the space: ``type(c)(space, **c.config())``."""


def unseen_architecture(
    space: SearchSpace,
    seen: Collection[str],
    rng: np.random.Generator,
    *,
    near: Architecture | None = None,
    tries: int = 200,
    why: str = "",
) -> Architecture:
    """An architecture of ``space`` whose id is not in ``seen``: the fallback of a
    controller whose own proposals are all seen (a collapsed policy, a converged
    population). First a random walk of one-gene mutations from ``near``, then uniform
    draws, then, in a space small enough to enumerate, the first unseen architecture
    in enumeration order. Logs that it fell back, saying ``why``.

    Raises:
        SpaceExhausted: every architecture of the space within its budget is seen.
    """
    if why:
        logger.info("%s; proposing an unseen architecture instead", why)
    walk = near

    def step() -> Architecture:
        nonlocal walk
        walk = space.mutate(walk, rng) if walk is not None else space.sample(rng)
        return walk

    draws: list[Callable[[], Architecture]] = [step] if near is not None else []
    draws.append(lambda: space.sample(rng))
    for draw in draws:
        for _ in range(tries):
            try:
                arch = draw()
            except InvalidArchitectureError:  # no mutation or draw fits the budget
                break
            if arch.arch_id not in seen:
                return arch
    if space.size() <= _ENUMERABLE:
        for arch in _enumerate(space):
            if arch.arch_id not in seen and space.within_budget(arch):
                return arch
        raise SpaceExhausted(
            f"every architecture of space {space.name!r} within its budget has been "
            f"proposed ({len(seen)} seen): the search is complete"
        )
    raise SpaceExhausted(
        f"no unseen architecture of space {space.name!r} in {len(draws) * tries} draws "
        f"({len(seen)} seen of at most {space.size()}): the space within its budget is "
        "nearly exhausted; widen the space or loosen its budget to search on"
    )


def _enumerate(space: SearchSpace) -> Iterator[Architecture]:
    domains = space.domains()
    for values in itertools.product(*(d.values() for d in domains.values())):
        yield space.make(dict(zip(domains, values, strict=True)))
