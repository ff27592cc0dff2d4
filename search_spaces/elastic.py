"""The elastic part of a space: what one weight-sharing supernet contains.

``ResNetSpace(...).supernet(elastic=("stage1.depth", "stage1.width"), fixed={...})``
is an :class:`ElasticSpace`: an ordinary search space whose genes are the elastic ones
(the others fixed, by the user or at the space's largest), searched by any controller,
trained from scratch like any space, or evaluated on the trained supernet that
:meth:`ElasticSpace.build_supernet` makes (autosearch.weight_sharing.supernet trains and
evaluates it).
Its architectures become architectures of the wrapped space with :meth:`ElasticSpace.full`;
a subnet's network is the wrapped space's ordinary network.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from autosearch.architecture import Architecture, Gene
from autosearch.errors import ConfigError, InvalidArchitectureError, suggest
from autosearch.registry import register_space, spaces
from autosearch.scoring.cost import Cost
from autosearch.space import Domain, NetworkSpec, SearchSpace
from search_spaces._dynamic import copy_slices
from search_spaces._shareable import Shareable

__all__ = ["ElasticNetwork", "ElasticSpace"]


@register_space("elastic")
@dataclass(frozen=True, kw_only=True)
class ElasticSpace(SearchSpace):
    """The sub-space of ``space`` that one supernet holds (see the module docstring).

    Args:
        space: A space with a supernet (``ResNetSpace``, ``MobileNetSpace``).
        elastic: The genes subnets vary (default: every elastic gene of ``space`` that
            the fixed genes leave in use).
        fixed: Values of the other genes (default: the largest value of each
            numeric gene's domain, strides and non-numeric genes at their defaults).
        kernel_transform: Where kernels are elastic, OFA's learned kernel
            transformation matrices (else plain centred crops).

    Without a budget of its own, the elastic space takes ``space``'s.
    """

    space: SearchSpace
    elastic: tuple[str, ...] = ()
    fixed: Mapping[str, Gene] | tuple[tuple[str, Gene], ...] = ()
    kernel_transform: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        inner: Any = self.space
        if isinstance(inner, Mapping):  # from a stored config: {"name": ..., "config": ...}
            inner = spaces.get(inner["name"])(**inner["config"])
            object.__setattr__(self, "space", inner)
        able = inner.elastic_genes if isinstance(inner, Shareable) else None
        if not isinstance(inner, SearchSpace) or able is None or not able():
            name = getattr(inner, "name", type(inner).__name__)
            raise ConfigError(
                f"space {name!r} has no supernet; weight sharing supports ResNetSpace, "
                "MobileNetSpace and NB201Space (space.supernet(...))"
            )
        if self.max_flops is None and self.max_params is None:
            for field in ("max_flops", "max_params", "budget_input", "budget_classes"):
                object.__setattr__(self, field, getattr(inner, field))
        fixed = dict(self.fixed)
        _check_names(inner, fixed, "fixed")
        _check_names(inner, dict.fromkeys(self.elastic), "elastic")
        not_elastic = [g for g in self.elastic if g not in able()]
        if not_elastic:
            raise ConfigError(
                f"gene {not_elastic[0]!r} of space {inner.name!r} is not elastic: a supernet "
                f"shares weights across {', '.join(able())}; give it a value in fixed={{...}}"
            )
        both = sorted(set(fixed) & set(self.elastic))
        if both:
            raise ConfigError(f"gene {both[0]!r} is both fixed and elastic; choose one")
        domains = inner.domains()
        largest = {g: fixed.get(g, _fixed_default(g, d)) for g, d in domains.items()}
        try:
            inner.validate(Architecture(space=inner.name, genes=largest))
        except InvalidArchitectureError as exc:
            raise ConfigError(f"supernet of space {inner.name!r}: {exc}") from None

        def used(gene: str) -> bool:  # whether the network depends on it, others largest
            return all(inner.make({**largest, gene: v})[gene] == v for v in domains[gene].values())

        elastic = tuple(self.elastic) or tuple(g for g in able() if g not in fixed and used(g))
        unused = [g for g in elastic if not used(g)]
        if unused:
            raise ConfigError(
                f"gene {unused[0]!r} has no effect with these fixed genes (the network "
                "ignores it); fix it, or leave it out of elastic="
            )
        if self.kernel_transform and not any(g.endswith(".kernel") for g in elastic):
            raise ConfigError("kernel_transform=True needs an elastic kernel gene (stageI.kernel)")
        fixed = {g: largest[g] for g in domains if g not in elastic}
        order = list(domains)
        object.__setattr__(self, "elastic", tuple(sorted(elastic, key=order.index)))
        object.__setattr__(self, "fixed", tuple(sorted(fixed.items())))

    def __hash__(self) -> int:
        return hash((self.space, self.elastic, self.fixed, self.kernel_transform, self.max_flops))

    @classmethod
    def example(cls) -> ElasticSpace:
        make: Callable[..., SearchSpace] = spaces.get("resnet")  # by name: not imported
        inner = make(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16))
        return cls(space=inner, fixed={"stages": 2, "block": "basic"})

    # The genes ------------------------------------------------------------------------
    def domains(self) -> Mapping[str, Domain]:
        inner = self.space.domains()
        return {gene: inner[gene] for gene in self.elastic}

    def full(self, arch: Architecture) -> Architecture:
        """``arch`` as an architecture of the wrapped space (fixed genes added)."""
        self.validate(arch)
        genes = {**dict(self.fixed), **arch}
        return self.space.make(genes)

    def project(self, arch: Architecture) -> Architecture:
        """An architecture of the wrapped space as one of this elastic space; refused in
        one line, naming the gene, when it is not in the supernet's sub-space."""
        arch = self.space.canonicalize(arch)
        fixed = self.space.make({**arch, **dict(self.fixed)})
        for gene, value in fixed.items():
            if gene not in self.elastic and arch[gene] != value:
                raise ConfigError(
                    f"gene {gene!r} = {arch[gene]!r} is outside this supernet's sub-space: it is "
                    f"fixed to {value!r}; evaluate architectures with {gene}={value!r}"
                )
        return self.make({g: arch[g] for g in self.elastic})

    def canonicalize(self, arch: Architecture) -> Architecture:
        self.validate(arch)
        full = self.space.make({**dict(self.fixed), **arch})
        return Architecture(space=self.name, genes={g: full[g] for g in self.elastic})

    def largest(self) -> Architecture:
        return self.make({g: _largest(d) for g, d in self.domains().items()})

    def smallest(self) -> Architecture:
        return self.make({g: _smallest(d) for g, d in self.domains().items()})

    # Delegated to the wrapped space ------------------------------------------------------
    def check_input(self, arch: Architecture, input_shape: Sequence[int]) -> None:
        self.space.check_input(self.full(arch), input_shape)

    def network(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> NetworkSpec:
        return self.space.network(self.full(arch), input_shape=input_shape, num_classes=num_classes)

    def cost_model(
        self, arch: Architecture, input_shape: tuple[int, int, int], num_classes: int
    ) -> Cost | None:
        return self.space.cost_model(self.full(arch), input_shape, num_classes)

    def train_overrides(self, arch: Architecture) -> dict[str, Any]:
        return self.space.train_overrides(self.full(arch))

    def describe(self, arch: Architecture) -> str:
        return self.space.describe(self.full(arch))

    def plain(self, arch: Architecture) -> Architecture:
        return self.full(arch)

    # The supernet --------------------------------------------------------------------------
    def build_supernet(self, *, input_shape: Sequence[int], num_classes: int) -> ElasticNetwork:
        """The supernet (fresh weights) of this sub-space for these images."""
        shape = tuple(input_shape)
        largest = self.full(self.largest())
        domains = self.space.domains()
        kernels = sorted(
            {int(v) for g in self.elastic if g.endswith(".kernel") for v in domains[g].values()}
        )
        net = self.space.build_supernet(  # type: ignore[attr-defined]
            largest,
            input_shape=shape,
            num_classes=num_classes,
            kernels=tuple(kernels),
            transforms=self.kernel_transform,
        )
        return ElasticNetwork(self, net, shape, num_classes)

    def fingerprint(self) -> dict[str, Any]:
        """What a trained supernet's weights depend on (its budget does not matter): a
        checkpoint of another fingerprint is of another supernet."""
        return {
            "space": {"name": self.space.name, "config": self.space.config()},
            "elastic": list(self.elastic),
            "fixed": [[g, v] for g, v in dict(self.fixed).items()],
            "kernel_transform": self.kernel_transform,
        }


class ElasticNetwork(nn.Module):
    """A supernet: ``activate(arch)`` (an architecture of its elastic space) makes
    ``forward`` run that subnet; :meth:`subnet` copies it out as an ordinary network."""

    def __init__(
        self, space: ElasticSpace, net: nn.Module, input_shape: tuple[int, ...], num_classes: int
    ) -> None:
        super().__init__()
        self.net: Any = net
        self.space, self.input_shape, self.num_classes = space, tuple(input_shape), num_classes

    def _kwargs(self, arch: Architecture) -> dict[str, Any]:
        spec = self.space.network(arch, input_shape=self.input_shape, num_classes=self.num_classes)
        return dict(spec.kwargs)

    def activate(self, arch: Architecture) -> None:
        self.net.activate(**self._kwargs(arch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def subnet(self, arch: Architecture) -> nn.Module:
        """``arch``'s ordinary network (the wrapped space's) with the supernet's weights,
        on the supernet's device; every tensor of it is written from the supernet, which
        is checked. (Built on the CPU and moved: built on the meta device, to skip the
        initial weights, it took longer: torch's device context runs every
        initialisation through Python; a GPU's device context is such a context too.)"""
        kwargs = self._kwargs(arch)
        model = self.space.build(arch, input_shape=self.input_shape, num_classes=self.num_classes)
        device = next(self.net.parameters()).device
        if device.type != "cpu":
            model = model.to(device)
        written = copy_slices(list(self.pairs(model, kwargs)))
        tensors = [*model.named_parameters(), *model.named_buffers()]
        missing = [name for name, tensor in tensors if id(tensor) not in written]
        if missing:
            raise RuntimeError(
                f"the supernet of space {self.space.name!r} gives subnet {arch.arch_id} no "
                f"values for {', '.join(missing)}: its pairs() must name every layer "
                "with weights (a bug in the space)"
            )
        return model

    def pairs(self, model: nn.Module, kwargs: Mapping[str, Any]) -> Iterator[Any]:
        return self.net.pairs(model, **kwargs)


def _fixed_default(gene: str, domain: Domain) -> Gene:
    """A gene nobody fixed: its largest value (strides: the space's default, since a
    larger stride makes a smaller network)."""
    return domain.default if gene.endswith("stride") else _largest(domain)  # type: ignore[return-value]


def _largest(domain: Domain) -> Gene:
    values = domain.values()
    numeric = all(isinstance(v, int | float) for v in values)
    return max(values) if numeric else domain.default  # type: ignore[type-var,return-value]


def _smallest(domain: Domain) -> Gene:
    values = domain.values()
    numeric = all(isinstance(v, int | float) for v in values)
    return min(values) if numeric else domain.default  # type: ignore[type-var,return-value]


def _check_names(space: SearchSpace, genes: Mapping[str, Any], what: str) -> None:
    domains = space.domains()
    for gene in genes:
        if gene not in domains:
            close = suggest(gene, domains)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise ConfigError(f"{what}: space {space.name!r} has no gene {gene!r}{hint}")
