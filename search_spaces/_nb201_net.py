"""The NAS-Bench-201 network (Dong & Yang 2020), in plain torch.

A stem, three stages of ``N`` cells at widths C, 2C, 4C joined by ResNet basic-block
reductions, BN-ReLU, pooling and a linear head, as in the benchmark's ``TinyNetwork``.
A cell is a DAG of 4 nodes; each of its 6 edges carries one operation. This file
imports nothing but torch: autosearch copies it next to exported weights.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn

OPERATIONS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")


class ReLUConvBN(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, padding: int) -> None:
        super().__init__(
            nn.ReLU(inplace=False),
            nn.Conv2d(c_in, c_out, kernel, stride, padding, bias=False),
            nn.BatchNorm2d(c_out),
        )


class Zero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul(0.0)


def operation(name: str, channels: int) -> nn.Module:
    """One edge's operation; inside a cell the width never changes and stride is 1."""
    if name == "none":
        return Zero()
    if name == "skip_connect":
        return nn.Identity()
    if name == "nor_conv_1x1":
        return ReLUConvBN(channels, channels, 1, 1, 0)
    if name == "nor_conv_3x3":
        return ReLUConvBN(channels, channels, 3, 1, 1)
    if name == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
    raise ValueError(f"unknown NAS-Bench-201 operation {name!r}; known: {OPERATIONS}")


class Cell(nn.Module):
    """Node j (1..3) sums its edges' operations applied to every earlier node i."""

    def __init__(self, edges: list[list[str]], channels: int) -> None:
        super().__init__()
        self.edges = nn.ModuleList(
            nn.ModuleList(operation(op, channels) for op in ops) for ops in edges
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nodes = [x]
        for ops in cast(list[nn.ModuleList], self.edges):
            total = ops[0](nodes[0])
            for i in range(1, len(ops)):
                total = total + ops[i](nodes[i])
            nodes.append(total)
        return nodes[-1]


class ResNetReduction(nn.Module):
    """The benchmark's reduction cell: a basic block with stride 2 whose shortcut is
    2×2 average pooling followed by a 1×1 convolution."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv_a = ReLUConvBN(c_in, c_out, 3, 2, 1)
        self.conv_b = ReLUConvBN(c_out, c_out, 3, 1, 1)
        self.downsample = nn.Sequential(nn.AvgPool2d(2, 2), nn.Conv2d(c_in, c_out, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(x) + self.conv_b(self.conv_a(x))


class NB201Network(nn.Module):
    """Args:
    in_channels: Image channels.
    num_classes: Output logits.
    edges: ``edges[j - 1][i]`` is the operation from node i to node j.
    channels: C, the width of the first stage.
    cells: N, cells per stage.
    """

    def __init__(
        self,
        *,
        in_channels: int,
        num_classes: int,
        edges: list[list[str]],
        channels: int = 16,
        cells: int = 5,
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
            layers += [Cell(edges, width) for _ in range(cells)]
        self.cells = nn.Sequential(*layers)
        self.lastact = nn.Sequential(nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lastact(self.cells(self.stem(x)))
        return self.classifier(torch.flatten(self.pool(x), 1))
