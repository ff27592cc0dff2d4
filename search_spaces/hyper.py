"""Training hyperparameters searched together with any architecture space."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from autosearch.architecture import Architecture, Gene
from autosearch.errors import ConfigError
from autosearch.registry import register_space, spaces
from autosearch.scoring.cost import Cost
from autosearch.space import Categorical, Domain, NetworkSpec, SearchSpace
from search_spaces.resnet import ResNetSpace

__all__ = ["HyperparameterSpace"]

# gene -> TrainConfig field, and its short form in descriptions
_FIELDS = {
    "hp.lr": ("lr", "lr"),
    "hp.weight_decay": ("weight_decay", "wd"),
    "hp.batch_size": ("batch_size", "bs"),
    "hp.optimizer": ("optimizer", ""),
    "hp.label_smoothing": ("label_smoothing", "ls"),
}


@register_space("hyper")
@dataclass(frozen=True, kw_only=True)
class HyperparameterSpace(SearchSpace):
    """``space``'s genes plus training hyperparameters (``hp.lr``, ``hp.weight_decay``,
    ``hp.batch_size``, ``hp.optimizer``, ``hp.label_smoothing``), which the trainer
    applies over the study's TrainConfig. An empty choice tuple leaves that setting
    to the study.

    Without a budget of its own, the wrapper takes ``space``'s.

    Example:
        >>> HyperparameterSpace(space=ResNetSpace(), lr=(0.03, 0.1), optimizer=("sgd",))
    """

    space: SearchSpace
    lr: tuple[float, ...] = (0.01, 0.03, 0.1)
    weight_decay: tuple[float, ...] = (0.0, 1e-4, 5e-4)
    batch_size: tuple[int, ...] = (32, 64, 128)
    optimizer: tuple[str, ...] = ("sgd", "adamw")
    label_smoothing: tuple[float, ...] = (0.0, 0.1)

    def __post_init__(self) -> None:
        super().__post_init__()
        inner: Any = self.space
        if isinstance(inner, Mapping):  # from a stored config: {"name": ..., "config": ...}
            inner = spaces.get(inner["name"])(**inner["config"])
            object.__setattr__(self, "space", inner)
        if not isinstance(inner, SearchSpace) or isinstance(inner, HyperparameterSpace):
            raise ConfigError(
                "HyperparameterSpace wraps one architecture space, e.g. ResNetSpace()"
            )
        for field, _ in _FIELDS.values():
            object.__setattr__(self, field, tuple(getattr(self, field)))
        if self.max_flops is None and self.max_params is None:
            for field in ("max_flops", "max_params", "budget_input", "budget_classes"):
                object.__setattr__(self, field, getattr(inner, field))

    @classmethod
    def example(cls) -> HyperparameterSpace:
        return cls(space=ResNetSpace.example())

    def _split(self, arch: Architecture) -> Architecture:
        genes = {g: v for g, v in arch.items() if g not in _FIELDS}
        return Architecture(space=self.space.name, genes=genes)

    def domains(self) -> Mapping[str, Domain]:
        genes = dict(self.space.domains())
        for gene, (field, _) in _FIELDS.items():
            if getattr(self, field):
                genes[gene] = Categorical(getattr(self, field))
        return genes

    def canonicalize(self, arch: Architecture) -> Architecture:
        self.validate(arch)
        inner = self.space.canonicalize(self._split(arch))
        hp = {g: v for g, v in arch.items() if g in _FIELDS}
        return Architecture(space=self.name, genes={**inner, **hp})

    def check_input(self, arch: Architecture, input_shape: Sequence[int]) -> None:
        self.space.check_input(self._split(arch), input_shape)

    def network(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> NetworkSpec:
        return self.space.network(
            self._split(arch), input_shape=input_shape, num_classes=num_classes
        )

    def cost_model(
        self, arch: Architecture, input_shape: tuple[int, int, int], num_classes: int
    ) -> Cost | None:
        return self.space.cost_model(self._split(arch), input_shape, num_classes)

    def train_overrides(self, arch: Architecture) -> dict[str, Any]:
        return {_FIELDS[g][0]: v for g, v in arch.items() if g in _FIELDS}

    def describe(self, arch: Architecture) -> str:
        hp = " ".join(f"{_FIELDS[g][1]}{v}" for g, v in arch.items() if g in _FIELDS)
        return f"{self.space.describe(self._split(arch))} | {hp}"

    def references(self) -> list[str]:
        return self.space.references()

    def reference(self, name: str) -> Architecture:
        inner = self.space.reference(name)
        defaults = {g: cast(Gene, d.default) for g, d in self.domains().items() if g in _FIELDS}
        return self.make({**inner, **defaults})
