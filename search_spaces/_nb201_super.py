"""The NAS-Bench-201 supernet: every operation of every edge in one set of weights.

Each edge of each cell holds all of the space's operations (single-path one-shot: SPOS,
Guo et al. 2020); a subnet is one operation per edge, the same in every cell, as in
the benchmark. The operations with weights (the two convolutions) keep their own
convolution and batch norm per edge and cell; ``none``, ``skip_connect`` and
``avg_pool_3x3`` have none. The stem, the reductions and the head are shared by every
subnet. A subnet's weights copied into ``_nb201_net.NB201Network`` give the same
network (``pairs``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.nn as nn

from search_spaces._nb201_net import OPERATIONS, ResNetReduction, operation

__all__ = ["NB201Supernet"]


class _MixedCell(nn.Module):
    """A cell whose every edge holds each of ``operations``; ``forward(x, edges)`` runs
    the one named per edge (``edges[j - 1][i]``: from node i to node j)."""

    def __init__(self, operations: tuple[str, ...], channels: int) -> None:
        super().__init__()
        self.edges = nn.ModuleList(
            nn.ModuleList(
                nn.ModuleDict({op: operation(op, channels) for op in operations}) for _ in range(j)
            )
            for j in range(1, 4)
        )

    def forward(self, x: torch.Tensor, edges: list[list[str]]) -> torch.Tensor:
        nodes = [x]
        for choices, ops in zip(cast(list[nn.ModuleList], self.edges), edges, strict=True):
            total = None
            for i, (mixed, op) in enumerate(
                zip(cast(list[nn.ModuleDict], choices), ops, strict=True)
            ):
                out = mixed[op](nodes[i])
                total = out if total is None else total + out
            nodes.append(cast(torch.Tensor, total))
        return nodes[-1]

    def pairs(self, cell: Any, edges: list[list[str]]) -> Iterator[tuple[nn.Module, nn.Module]]:
        """(layer of the subnet's cell, layer of this one) for each chosen operation
        that has weights."""
        for theirs, choices, ops in zip(
            cell.edges, cast(list[nn.ModuleList], self.edges), edges, strict=True
        ):
            for target, mixed, op in zip(
                theirs, cast(list[nn.ModuleDict], choices), ops, strict=True
            ):
                if any(True for _ in target.parameters()):
                    yield target, mixed[op]


class NB201Supernet(nn.Module):
    """The benchmark's skeleton (``_nb201_net.NB201Network``) with mixed cells;
    :meth:`activate` with a subnet's keyword arguments makes ``forward`` run it."""

    def __init__(
        self,
        *,
        in_channels: int,
        num_classes: int,
        channels: int = 16,
        cells: int = 5,
        operations: tuple[str, ...] = OPERATIONS,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        )
        layers: list[nn.Module] = []
        width = channels
        for stage in range(3):
            if stage:
                layers.append(ResNetReduction(width, width * 2))
                width *= 2
            layers += [_MixedCell(tuple(operations), width) for _ in range(cells)]
        self.cells = nn.ModuleList(layers)
        self.lastact = nn.Sequential(nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(width, num_classes)
        self.active: list[list[str]] = [[operations[0]] * j for j in range(1, 4)]

    def activate(self, *, edges: list[list[str]], **_: Any) -> None:
        """Run the subnet of these ``_nb201_net.NB201Network`` keyword arguments."""
        self.active = [list(ops) for ops in edges]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layer in self.cells:
            x = layer(x, self.active) if isinstance(layer, _MixedCell) else layer(x)
        x = self.lastact(x)
        return self.classifier(torch.flatten(self.pool(x), 1))  # type: ignore[no-any-return]

    def pairs(
        self, subnet: Any, *, edges: list[list[str]], **_: Any
    ) -> Iterator[tuple[nn.Module, nn.Module]]:
        """(layer of ``subnet``, an ``NB201Network`` built with these keyword arguments;
        layer of this supernet) for every layer with weights."""
        yield subnet.stem, self.stem
        for theirs, mine in zip(subnet.cells, self.cells, strict=True):
            if isinstance(mine, _MixedCell):
                yield from mine.pairs(theirs, edges)
            else:
                yield theirs, mine
        yield subnet.lastact, self.lastact
        yield subnet.classifier, self.classifier
