"""The search-space protocol: named gene domains, validation, and a network builder.

A space writes :meth:`SearchSpace.domains`, :meth:`SearchSpace.network` and, where
some genes only matter in some networks, :meth:`SearchSpace.canonicalize` and
:meth:`SearchSpace.validate`. Sampling, mutation, encoding, description and
building derive from those.
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

__all__ = [
    "SIZE_LIMITS",
    "Categorical",
    "Domain",
    "IntRange",
    "NetworkSpec",
    "SearchSpace",
    "check_sizes",
]

_MAX_MUTATION_TRIES = 100
_MAX_BUDGET_TRIES = 200

# The largest size of each kind a space accepts. A stored study is data: one holding
# widths=[10**9] or max_stages=10**6 is refused in one line when it is read, not in an
# allocation when a worker builds the network. Far above any network trained today.
SIZE_LIMITS = {"channels": 8192, "blocks": 1024, "stages": 32, "stride": 8, "kernel": 31}


def check_sizes(owner: str, kind: str, **sizes: Any) -> None:
    """Refuse any of ``sizes`` (a number, or a sequence of them) that is not a whole
    number from 1 to ``SIZE_LIMITS[kind]``, naming ``owner``'s field."""
    limit = SIZE_LIMITS[kind]
    for name, given in sizes.items():
        values = given if isinstance(given, tuple | list) else (given,)
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise ConfigError(
                    f"{owner} {name}: {value!r} is not a number of {kind} from 1 to {limit}"
                )


@dataclass(frozen=True)
class Categorical:
    """A gene whose value is one of ``choices`` (ints, floats, strings or bools)."""

    choices: tuple[Gene, ...]
    default: Gene | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "choices", tuple(self.choices))
        if not self.choices:
            raise ConfigError("a Categorical domain needs at least one choice")
        if self.default is None:
            object.__setattr__(self, "default", self.choices[0])
        elif self.default not in self.choices:
            raise ConfigError(f"default {self.default!r} is not one of {self.choices}")

    def values(self) -> tuple[Gene, ...]:
        return self.choices

    def contains(self, value: Gene) -> bool:
        # bool is an int in Python: keep True from matching a choice of 1.
        return any(type(value) is type(c) and value == c for c in self.choices)

    def sample(self, rng: np.random.Generator) -> Gene:
        return self.choices[int(rng.integers(len(self.choices)))]

    def encode(self, value: Gene) -> float:
        """Position of ``value`` among the choices, scaled to [0, 1]."""
        index = self.choices.index(value)
        return index / max(len(self.choices) - 1, 1)

    def describe(self) -> str:
        return "{" + ", ".join(map(str, self.choices)) + "}"


@dataclass(frozen=True)
class IntRange:
    """An integer gene in ``[low, high]`` (both included) on a grid of ``step``."""

    low: int
    high: int
    step: int = 1
    default: int | None = None

    def __post_init__(self) -> None:
        if self.high < self.low or self.step < 1 or (self.high - self.low) % self.step:
            raise ConfigError(
                f"IntRange({self.low}, {self.high}, step={self.step}) is empty or off-grid"
            )
        if self.default is None:
            object.__setattr__(self, "default", self.low)
        elif not self.contains(self.default):
            raise ConfigError(f"default {self.default!r} is not in {self.describe()}")

    def values(self) -> tuple[int, ...]:
        return tuple(range(self.low, self.high + 1, self.step))

    def contains(self, value: Gene) -> bool:
        return (
            type(value) is int
            and self.low <= value <= self.high
            and (value - self.low) % self.step == 0
        )

    def sample(self, rng: np.random.Generator) -> int:
        return self.low + self.step * int(rng.integers((self.high - self.low) // self.step + 1))

    def encode(self, value: Gene) -> float:
        return (int(value) - self.low) / max(self.high - self.low, 1)

    def describe(self) -> str:
        step = f" step {self.step}" if self.step != 1 else ""
        return f"[{self.low}..{self.high}{step}]"


Domain = Categorical | IntRange


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
        return self._within_budget(
            lambda: self.make({g: d.sample(rng) for g, d in domains.items()}), "sample"
        )

    def mutate(self, arch: Architecture, rng: np.random.Generator) -> Architecture:
        """A valid architecture within the budget that builds a different network.

        One gene is redrawn at a time; genes that the canonical form resets give
        the same network, so the draw repeats (a bounded number of times).
        """
        arch = self.canonicalize(arch)
        domains = [(g, d) for g, d in self.domains().items() if len(d.values()) > 1]
        if not domains:
            raise InvalidArchitectureError(f"space {self.name!r} has one point: nothing to mutate")

        def redraw() -> Architecture:
            for _ in range(_MAX_MUTATION_TRIES):
                gene, domain = domains[int(rng.integers(len(domains)))]
                others = [v for v in domain.values() if v != arch[gene]]
                child = self.make({**arch, gene: others[int(rng.integers(len(others)))]})
                if child != arch:
                    return child
            raise InvalidArchitectureError(
                f"no mutation of {self.describe(arch)} changed the network in "
                f"{_MAX_MUTATION_TRIES} tries; the space may be too constrained"
            )

        return self._within_budget(redraw, f"mutation of {self.describe(arch)}")

    def _within_budget(self, draw: Callable[[], Architecture], what: str) -> Architecture:
        if self.max_flops is None and self.max_params is None:
            return draw()
        smallest: Cost | None = None
        for _ in range(_MAX_BUDGET_TRIES):
            arch = draw()
            cost = self.cost(arch)
            if self._fits(cost):
                return arch
            if smallest is None or cost.flops < smallest.flops:
                smallest = cost
        assert smallest is not None
        raise BudgetError(
            f"no {what} of space {self.name!r} met the budget (max_flops={self.max_flops:.4g}, "
            f"max_params={self.max_params}) in {_MAX_BUDGET_TRIES} draws; the smallest drawn had "
            f"{smallest.flops:.4g} FLOPs and {smallest.params} params at {self.budget_input}. "
            "Loosen the budget or narrow the space's depths and widths"
            if self.max_flops is not None
            else f"no {what} of space {self.name!r} met max_params={self.max_params} in "
            f"{_MAX_BUDGET_TRIES} draws; the smallest drawn had {smallest.params} params. "
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
        return np.array([d.encode(arch[g]) for g, d in self.domains().items()], dtype=np.float64)

    def one_hot(self, arch: Architecture) -> np.ndarray:
        """One indicator per gene value (a categorical encoding for predictors: the
        values of a gene are not ordered, or not evenly)."""
        parts = []
        for gene, domain in self.domains().items():
            values = domain.values()
            row = np.zeros(len(values))
            row[values.index(arch[gene])] = 1.0
            parts.append(row)
        return np.concatenate(parts)

    def neighbours(self, arch: Architecture) -> list[Architecture]:
        """Every distinct network one gene away from ``arch`` (canonical forms; the
        budget is not checked)."""
        arch = self.canonicalize(arch)
        found: dict[str, Architecture] = {}
        for gene, domain in self.domains().items():
            for value in domain.values():
                if value != arch[gene]:
                    child = self.make({**arch, gene: value})
                    if child != arch:
                        found.setdefault(child.arch_id, child)
        return list(found.values())

    def build(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> nn.Module:
        """Validate ``arch`` for ``input_shape`` and build its network (fresh weights)."""
        arch = self.canonicalize(arch)
        self.check_input(arch, tuple(input_shape))
        return self.network(arch, input_shape=tuple(input_shape), num_classes=num_classes).build()

    def size(self) -> int:
        """The number of gene assignments (an upper bound on distinct networks)."""
        return int(np.prod([len(d.values()) for d in self.domains().values()], dtype=object))


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
