"""The controller protocol and the outcome a trial reports to it."""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from autosearch.architecture import Architecture
from autosearch.errors import ConfigError
from autosearch.space import SearchSpace

__all__ = ["Controller", "Outcome"]

Status = Literal["complete", "failed", "stopped"]


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

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The controller's full state as JSON values."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; later asks repeat the original's."""

    def reseed(self, stream: int) -> None:
        """Draw from now on from random stream ``stream``, independent of the current
        one (its state then travels in :meth:`state_dict`). Parallel workers of one
        study each take a stream of their own, so they rarely propose the same
        architecture at once. Controllers without randomness keep this no-op."""
        return None

    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """Constructor arguments except the space: ``type(c)(space, **c.config())``."""
