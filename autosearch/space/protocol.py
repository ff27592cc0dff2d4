"""The search-space protocol: named gene domains, validation, a network builder, and
the budget.

A space writes :meth:`SearchSpace.domains`, :meth:`SearchSpace.network` and, where
some genes only matter in some networks, :meth:`SearchSpace.canonicalize` and
:meth:`SearchSpace.validate`. Sampling and mutation (:mod:`autosearch.space.moves`),
encodings (:mod:`autosearch.space.encodings`), description and building derive from
those; the space keeps every draw within its budget.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import importlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.nn as nn

from autosearch.architecture import Architecture, Gene
from autosearch.errors import (
    BudgetError,
    ConfigError,
    InvalidArchitectureError,
    UnknownNameError,
    require,
    suggest,
)
from autosearch.scoring.cost import Cost, measure
from autosearch.space import encodings, moves
from autosearch.space.domains import Domain

__all__ = ["NetworkSpec", "SearchSpace"]

_BUDGET_TRIES = 200


@dataclass(frozen=True, kw_only=True)
class NetworkSpec:
    """How to build a network from a torch-only model file.

    ``module`` is the dotted name of a Python module that imports nothing but torch
    (and the standard library); ``factory`` is a callable in it; ``kwargs`` are plain
    JSON values. Export copies the module's source next to the weights, so the
    network rebuilds anywhere torch is installed.
    """

    module: str
    factory: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def build(self) -> nn.Module:
        factory = getattr(importlib.import_module(self.module), self.factory)
        return factory(**self.kwargs)


@dataclass(frozen=True, kw_only=True)
class SearchSpace(abc.ABC):
    """Base class of every search space.

    Subclasses are frozen keyword-only dataclasses (their fields are the space's
    configuration, see :meth:`config`) registered with
    :func:`autosearch.registry.register_space`.

    Every space takes an optional budget, checked from the architecture alone
    (the network is built on the meta device: no weights, no training):

    Attributes:
        max_flops: Largest FLOPs (2 × MACs) per image at ``budget_input``.
        max_params: Largest number of parameters.
        budget_input: ``(C, H, W)`` of the images the FLOPs budget is counted at.
        budget_classes: Classes of the head the budget is counted with.
    """

    name: ClassVar[str] = ""
    # Packages a space's network module may import besides torch (an adapter to another
    # toolkit's model spaces needs that toolkit; exports then need it too).
    network_needs: ClassVar[tuple[str, ...]] = ()

    max_flops: float | None = None
    max_params: float | None = None
    budget_input: tuple[int, int, int] = (3, 32, 32)
    budget_classes: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget_input", tuple(self.budget_input))
        if len(self.budget_input) != 3 or min(self.budget_input) < 1:
            raise ConfigError(f"budget_input must be (C, H, W), got {self.budget_input}")
        for name in ("max_flops", "max_params"):
            value = getattr(self, name)
            require(
                value is None or (math.isfinite(value) and value > 0),
                f"{type(self).__name__} {name}",
                value,
                "None (no budget) or a number > 0",
            )

    # What a space writes ---------------------------------------------------------------
    @abc.abstractmethod
    def domains(self) -> Mapping[str, Domain]:
        """The named gene domains, in a fixed order (the order of :meth:`encode`)."""

    @abc.abstractmethod
    def network(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> NetworkSpec:
        """The torch-only network for a valid ``arch`` at this input shape."""

    def canonicalize(self, arch: Architecture) -> Architecture:
        """Validate ``arch`` and reset genes its network ignores to their defaults.

        Two architectures that build the same network must canonicalize equal; a
        space whose genes all matter keeps the base behaviour.
        """
        self.validate(arch)
        return arch

    def check_input(self, arch: Architecture, input_shape: Sequence[int]) -> None:
        """Raise InvalidArchitectureError (naming the gene) if ``arch`` cannot take
        images of ``input_shape``, e.g. when its downsampling would shrink a feature
        map to nothing. Spaces whose maps can shrink to nothing override this."""
        return None

    def reset(self, arch: Architecture, genes: Iterable[str]) -> Architecture:
        """``arch`` with ``genes`` set back to their domains' defaults: what a
        :meth:`canonicalize` does with genes the network ignores."""
        domains = self.domains()
        defaults = {g: cast(Gene, domains[g].default) for g in genes}
        return Architecture(space=arch.space, genes={**arch, **defaults})

    def validate(self, arch: Architecture, *, input_shape: Sequence[int] | None = None) -> None:
        """Raise InvalidArchitectureError naming the gene and what is allowed.

        With ``input_shape``, also check that the network takes such images.
        """
        self._check_genes(arch)
        if input_shape is not None:
            self.check_input(arch, tuple(input_shape))

    def _check_genes(self, arch: Architecture) -> None:
        if not isinstance(arch, Architecture):
            raise InvalidArchitectureError(
                f"expected an autosearch.Architecture, got {type(arch).__name__}; "
                "use Architecture.from_json() or space.make({...})"
            )
        if arch.space != self.name:
            raise InvalidArchitectureError(
                f"architecture belongs to space {arch.space!r}, not {self.name!r}; "
                "architectures cannot move between spaces"
            )
        domains = self.domains()
        for gene in arch:
            if gene not in domains:
                close = suggest(gene, domains)
                hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
                raise InvalidArchitectureError(
                    f"space {self.name!r} has no gene {gene!r}{hint}; its genes are "
                    f"{', '.join(domains)}"
                )
        for gene, domain in domains.items():
            if gene not in arch:
                raise InvalidArchitectureError(
                    f"architecture of space {self.name!r} lacks gene {gene!r} "
                    f"(allowed: {domain.describe()})"
                )
            if not domain.contains(arch[gene]):
                raise InvalidArchitectureError(
                    f"gene {gene!r} = {arch[gene]!r} is not allowed in space {self.name!r}; "
                    f"allowed: {domain.describe()}"
                )

    def describe(self, arch: Architecture) -> str:
        """One readable line; spaces override with a compact block string."""
        return " ".join(f"{k}={v}" for k, v in arch.items())

    # Derived ---------------------------------------------------------------------------
    @classmethod
    def unavailable(cls) -> str | None:
        """Why this space cannot be used here (an optional extra not installed, with the
        command that installs it), or None. Contract tests skip such a space."""
        return None

    @classmethod
    def example(cls) -> SearchSpace:
        """A small instance (at most 2 M parameters) for contract tests and docs."""
        return cls(max_params=2_000_000)

    def config(self) -> dict[str, Any]:
        """The constructor arguments as JSON values: ``type(space)(**space.config())``."""
        return {
            f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self) if f.init
        }

    def make(self, genes: Mapping[str, Gene]) -> Architecture:
        """A canonical architecture of this space from a gene mapping."""
        return self.canonicalize(Architecture(space=self.name, genes=genes))

    def default(self) -> Architecture:
        return self.make({g: d.default for g, d in self.domains().items()})  # type: ignore[misc]

    def sample(self, rng: np.random.Generator) -> Architecture:
        """A uniformly drawn gene assignment, canonicalized, within the budget
        (rejection sampling, a bounded number of draws)."""
        domains = self.domains()
        return self._within_budget(lambda: self.make(moves.draw(domains, rng)), "sample")

    def mutate(self, arch: Architecture, rng: np.random.Generator) -> Architecture:
        """A valid architecture within the budget that builds a different network.

        One gene is redrawn at a time; genes that the canonical form resets give
        the same network, so the draw repeats (a bounded number of times).
        """
        arch = self.canonicalize(arch)
        domains = self.domains()
        return self._within_budget(
            lambda: moves.mutation(domains, arch, rng, self.make, self.describe),
            f"mutation of {self.describe(arch)}",
        )

    def _within_budget(self, draw: Callable[[], Architecture], what: str) -> Architecture:
        if self.max_flops is None and self.max_params is None:
            return draw()
        smallest: Cost | None = None
        for _ in range(_BUDGET_TRIES):
            arch = draw()
            cost = self.cost(arch)
            if self._fits(cost):
                return arch
            if smallest is None or cost.flops < smallest.flops:
                smallest = cost
        assert smallest is not None
        raise BudgetError(
            f"no {what} of space {self.name!r} met the budget (max_flops={self.max_flops:.4g}, "
            f"max_params={self.max_params}) in {_BUDGET_TRIES} draws; the smallest drawn had "
            f"{smallest.flops:.4g} FLOPs and {smallest.params} params at {self.budget_input}. "
            "Loosen the budget or narrow the space's depths and widths"
            if self.max_flops is not None
            else f"no {what} of space {self.name!r} met max_params={self.max_params} in "
            f"{_BUDGET_TRIES} draws; the smallest drawn had {smallest.params} params. "
            "Loosen the budget or narrow the space's depths and widths"
        )

    def _fits(self, cost: Cost) -> bool:
        return (self.max_flops is None or cost.flops <= self.max_flops) and (
            self.max_params is None or cost.params <= self.max_params
        )

    def cost(
        self,
        arch: Architecture,
        *,
        input_shape: Sequence[int] | None = None,
        num_classes: int | None = None,
    ) -> Cost:
        """FLOPs (2 × MACs), MACs and parameters of ``arch``, counted on the meta
        device (no memory, no initialisation), at ``budget_input`` by default."""
        shape = tuple(input_shape or self.budget_input)
        classes = num_classes or self.budget_classes
        return _meta_cost(self, self.canonicalize(arch), shape, classes)

    def within_budget(self, arch: Architecture) -> bool:
        if self.max_flops is None and self.max_params is None:
            return True
        return self._fits(self.cost(arch))

    def check_budget(self, arch: Architecture) -> None:
        """Raise BudgetError if ``arch`` exceeds the space's budget."""
        if self.max_flops is None and self.max_params is None:
            return
        cost = self.cost(arch)
        if not self._fits(cost):
            raise BudgetError(
                f"{self.describe(arch)} has {cost.flops:.4g} FLOPs and {cost.params} params at "
                f"{self.budget_input}, over the budget max_flops={self.max_flops}, "
                f"max_params={self.max_params}"
            )

    def references(self) -> list[str]:
        """Names of the published architectures this space contains."""
        return []

    def reference(self, name: str) -> Architecture:
        """The architecture of the published network ``name`` (see :meth:`references`)."""
        raise UnknownNameError(f"{self.name} reference", name, self.references())

    def _reference(self, name: str, table: Mapping[str, Mapping[str, Gene]]) -> Architecture:
        """A reference from a table of its genes; unlisted genes take their defaults."""
        if name not in table:
            raise UnknownNameError(f"{self.name} reference", name, table)
        genes = {g: d.default for g, d in self.domains().items()} | dict(table[name])
        try:
            return self.make(genes)  # type: ignore[arg-type]
        except InvalidArchitectureError as exc:
            raise InvalidArchitectureError(
                f"reference {name!r} does not fit this {type(self).__name__}: {exc}. "
                f"The default {type(self).__name__}() contains every reference"
            ) from None

    def cost_model(
        self, arch: Architecture, input_shape: tuple[int, int, int], num_classes: int
    ) -> Cost | None:
        """An analytic cost of a canonical ``arch`` (see :class:`autosearch.scoring.cost.Tally`),
        or None to count on a meta-device build. It must equal :func:`measure`."""
        return None

    def plain(self, arch: Architecture) -> Architecture:
        """``arch`` as an architecture of the space that builds its network (a wrapper
        space's inner space; the architecture itself for a plain space)."""
        return arch

    def train_overrides(self, arch: Architecture) -> dict[str, Any]:
        """Training settings this architecture carries (searched hyperparameters);
        the trainer applies them over the study's TrainConfig."""
        return {}

    def encode(self, arch: Architecture) -> np.ndarray:
        """A fixed-length float vector in [0, 1], one entry per gene."""
        self.validate(arch)
        return encodings.ordinal(self.domains(), arch)

    def one_hot(self, arch: Architecture) -> np.ndarray:
        """One indicator per gene value (a categorical encoding for predictors: the
        values of a gene are not ordered, or not evenly)."""
        return encodings.one_hot(self.domains(), arch)

    def neighbours(self, arch: Architecture) -> list[Architecture]:
        """Every distinct network one gene away from ``arch`` (canonical forms; the
        budget is not checked)."""
        return moves.neighbours(self.domains(), self.canonicalize(arch), self.make)

    def build(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> nn.Module:
        """Validate ``arch`` for ``input_shape`` and build its network (fresh weights)."""
        arch = self.canonicalize(arch)
        self.check_input(arch, tuple(input_shape))
        return self.network(arch, input_shape=tuple(input_shape), num_classes=num_classes).build()

    def size(self) -> int:
        """The number of gene assignments (an upper bound on distinct networks)."""
        return encodings.size(self.domains())


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, SearchSpace):
        return {"name": value.name, "config": value.config()}
    return value


@functools.lru_cache(maxsize=4096)
def _meta_cost(
    space: SearchSpace, arch: Architecture, input_shape: tuple[int, ...], num_classes: int
) -> Cost:
    space.check_input(arch, input_shape)
    analytic = space.cost_model(arch, input_shape, num_classes)  # type: ignore[arg-type]
    if analytic is not None:
        return analytic
    spec = space.network(arch, input_shape=input_shape, num_classes=num_classes)
    with torch.device("meta"):
        model = spec.build()
    return measure(model, input_shape)
