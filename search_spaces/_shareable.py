"""Spaces whose networks one supernet can hold (weight sharing): what the elastic space
needs of such a space, and the ``supernet(...)`` such a space offers. It sits below both
(search_spaces.elastic and the spaces it wraps), so that neither imports the other: the
elastic space is reached through the registry, by its name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch.nn as nn

from autosearch.architecture import Architecture, Gene
from autosearch.registry import spaces
from autosearch.space import SearchSpace

__all__ = ["Shareable", "WithSupernet"]


@runtime_checkable
class Shareable(Protocol):
    """A space a supernet can hold: the genes it shares weights across, and the module
    that holds every network of the space at ``largest``'s sizes."""

    def elastic_genes(self) -> tuple[str, ...]: ...

    def build_supernet(
        self, largest: Architecture, *, input_shape: Sequence[int], num_classes: int, **options: Any
    ) -> nn.Module: ...


class WithSupernet:
    """Gives a :class:`Shareable` space its ``supernet(...)``."""

    def supernet(
        self,
        *,
        elastic: Sequence[str] = (),
        fixed: Mapping[str, Gene] | None = None,
        **options: Any,
    ) -> SearchSpace:
        """The elastic sub-space one supernet holds (search_spaces.elastic.ElasticSpace):
        ``elastic`` the genes its subnets vary, ``fixed`` the values of the others;
        ``kernel_transform=True`` learns OFA's kernel transformations where kernels are
        elastic."""
        make: Callable[..., SearchSpace] = spaces.get("elastic")
        return make(space=self, elastic=tuple(elastic), fixed=dict(fixed or {}), **options)
