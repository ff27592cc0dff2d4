"""NAS-Bench-201 search space: one cell (4 nodes, 6 edges, 5 operations) inside the
benchmark's own macro skeleton (C = 16, N = 5).

Architectures read and write the benchmark's strings, e.g.
``|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|``,
so tabular results keyed by those strings can evaluate them (see autosearch.evaluation.tabular).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from autosearch.architecture import Architecture
from autosearch.errors import ConfigError, InvalidArchitectureError
from autosearch.registry import register_space
from autosearch.scoring.cost import Cost, Tally
from autosearch.space import Categorical, Domain, NetworkSpec, SearchSpace, check_sizes
from search_spaces._shareable import WithSupernet

__all__ = ["NB201Space"]

OPERATIONS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
NODES = 4
EDGES = tuple((j, i) for j in range(1, NODES) for i in range(j))  # (to, from), string order
_KERNELS = {"nor_conv_1x1": 1, "nor_conv_3x3": 3}


def _gene(j: int, i: int) -> str:
    return f"node{j}.in{i}"


@register_space("nb201")
@dataclass(frozen=True, kw_only=True)
class NB201Space(SearchSpace, WithSupernet):
    """The NAS-Bench-201 cell space: 5⁶ = 15,625 architectures.

    Genes ``nodeJ.inI`` (J = 1..3, I < J) hold the operation on the edge from node I
    to node J. Every gene matters to the network and its cost (an edge into an unused
    node still holds parameters), so canonicalization keeps all 15,625 distinct, as
    the benchmark does.

    Args:
        channels: C, the first stage's width.
        cells: N, cells per stage.
        operations: The edge operations allowed (a subset of the benchmark's five).
    """

    channels: int = 16
    cells: int = 5
    operations: tuple[str, ...] = OPERATIONS

    @classmethod
    def example(cls) -> NB201Space:
        """One cell per stage at 8 channels: the benchmark's cell and stage layout at a
        size contract tests build, export and train in a moment."""
        return cls(channels=8, cells=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "operations", tuple(self.operations))
        unknown = set(self.operations) - set(OPERATIONS)
        if unknown or not self.operations:
            raise ConfigError(f"operations must be among {OPERATIONS}, got {self.operations}")
        check_sizes("NB201Space", "channels", channels=self.channels)
        check_sizes("NB201Space", "blocks", cells=self.cells)

    def domains(self) -> Mapping[str, Domain]:
        default = "nor_conv_3x3" if "nor_conv_3x3" in self.operations else None
        return {_gene(j, i): Categorical(self.operations, default=default) for j, i in EDGES}

    # The benchmark's string form -------------------------------------------------------
    def to_string(self, arch: Architecture) -> str:
        """``|op~0|+|op~0|op~1|+|op~0|op~1|op~2|``, the benchmark's key."""
        self.validate(arch)
        nodes = (
            "|" + "|".join(f"{arch[_gene(j, i)]}~{i}" for i in range(j)) + "|"
            for j in range(1, NODES)
        )
        return "+".join(nodes)

    def from_string(self, text: str) -> Architecture:
        """Parse a benchmark string; malformed strings raise with what was expected."""
        expected = "like |nor_conv_3x3~0|+|skip_connect~0|none~1|+|none~0|none~1|avg_pool_3x3~2|"
        nodes = text.strip().split("+")
        if len(nodes) != NODES - 1:
            raise InvalidArchitectureError(
                f"NAS-Bench-201 string {text!r} has {len(nodes)} nodes, expected 3, {expected}"
            )
        genes: dict[str, str] = {}
        for j, node in enumerate(nodes, start=1):
            edges = node.strip("|").split("|")
            if len(edges) != j:
                raise InvalidArchitectureError(
                    f"node {j} of {text!r} has {len(edges)} edges, expected {j}, {expected}"
                )
            for expected_source, edge in enumerate(edges):
                op, _, source = edge.partition("~")
                if source != str(expected_source):
                    raise InvalidArchitectureError(
                        f"edge {edge!r} of node {j} in {text!r} should come from node "
                        f"{expected_source}, {expected}"
                    )
                genes[_gene(j, expected_source)] = op
        return self.make(genes)

    def describe(self, arch: Architecture) -> str:
        return self.to_string(arch)

    # Network ----------------------------------------------------------------------------
    def check_input(self, arch: Architecture, input_shape: Sequence[int]) -> None:
        """The two reductions add a strided conv to 2×2 pooling: both need an even map."""
        for stage, size in enumerate(self._sizes(input_shape)[:-1], start=2):
            if min(size) < 2 or size[0] % 2 or size[1] % 2:
                raise InvalidArchitectureError(
                    f"the NAS-Bench-201 skeleton cannot take {tuple(input_shape)} inputs: the "
                    f"reduction before stage {stage} needs an even feature map of at least 2 "
                    f"pixels, got {size[0]}×{size[1]}; resize the images (e.g. to 32×32)"
                )

    @staticmethod
    def _sizes(input_shape: Sequence[int]) -> list[tuple[int, int]]:
        h, w = input_shape[1], input_shape[2]
        return [(h, w), (h // 2, w // 2), (h // 4, w // 4)]

    def network(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> NetworkSpec:
        edges = [[arch[_gene(j, i)] for i in range(j)] for j in range(1, NODES)]
        return NetworkSpec(
            module="search_spaces._nb201_net",
            factory="NB201Network",
            kwargs={
                "in_channels": input_shape[0],
                "num_classes": num_classes,
                "edges": edges,
                "channels": self.channels,
                "cells": self.cells,
            },
        )

    def cost_model(
        self, arch: Architecture, input_shape: tuple[int, int, int], num_classes: int
    ) -> Cost:
        t = Tally.of(input_shape)
        t.conv(self.channels, 3)
        convs = [
            _KERNELS[str(arch[_gene(j, i)])] for j, i in EDGES if arch[_gene(j, i)] in _KERNELS
        ]
        for stage in range(3):
            if stage:
                shortcut = t.fork().pool(2, 2).conv(t.channels * 2, 1, bn=False)
                t.conv(t.channels * 2, 3, 2).conv(t.channels, 3)
                t.join(shortcut)
            for _ in range(self.cells):
                for kernel in convs:
                    edge = t.fork().conv(t.channels, kernel)
                    t.macs += edge.macs
                    t.params += edge.params
        return t.bn().linear_head(num_classes).cost()

    def references(self) -> list[str]:
        return []

    # Weight sharing ------------------------------------------------------------------------
    def elastic_genes(self) -> tuple[str, ...]:
        """Every edge: a supernet holds each operation of each edge (single-path one-shot),
        so ``NB201Space().supernet()`` shares weights across the whole space."""
        return tuple(_gene(j, i) for j, i in EDGES)

    def build_supernet(
        self, largest: Architecture, *, input_shape: Sequence[int], num_classes: int, **_: Any
    ) -> nn.Module:
        """The supernet module (search_spaces._nb201_super): the skeleton at this space's
        channels and cells, every edge holding every one of its operations."""
        from search_spaces._nb201_super import NB201Supernet

        return NB201Supernet(
            in_channels=input_shape[0],
            num_classes=num_classes,
            channels=self.channels,
            cells=self.cells,
            operations=self.operations,
        )
