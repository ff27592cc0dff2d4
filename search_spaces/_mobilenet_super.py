"""The MobileNet supernet: every network of an elastic MobileNet sub-space in one set
of weights (Once-for-All's elastic depth, expansion, kernel and width, with
squeeze-excitation switchable where it is shared).

Elastic: each stage's depth, width, expansion, kernel size and squeeze-excitation.
Fixed: width multiplier, activation, stem, head, the number of stages, each stage's
block type and stride. A subnet's weights copied into ``_mobilenet_net.MobileNet``
give the same network (``pairs``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from search_spaces._dynamic import DynamicBatchNorm2d, DynamicConv2d, DynamicLinear
from search_spaces._mobilenet_net import ACTIVATIONS, make_divisible

__all__ = ["MobileNetSupernet"]


class _ConvNorm(nn.Module):
    """A dynamic conv, its batch norm and (optionally) the activation."""

    def __init__(self, conv: DynamicConv2d, act: str | None) -> None:
        super().__init__()
        self.conv, self.norm = conv, DynamicBatchNorm2d(conv.weight.shape[0])
        self.act = ACTIVATIONS[act]() if act else nn.Identity()

    def forward(self, x: torch.Tensor, c_out: int | None = None, kernel: int | None = None):
        return self.act(self.norm(self.conv(x, c_out, kernel)))

    def pairs(self, seq: Any) -> Iterator[tuple[Any, nn.Module]]:
        yield seq[0], self.conv
        yield seq[1], self.norm


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        squeezed = make_divisible(channels / 4)
        self.reduce = DynamicConv2d(channels, squeezed, 1, bias=True)
        self.expand = DynamicConv2d(squeezed, channels, 1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        scale = F.relu(self.reduce(x.mean((2, 3), keepdim=True), make_divisible(c / 4)))
        return x * F.hardsigmoid(self.expand(scale, c))

    def pairs(self, se: Any) -> Iterator[tuple[Any, nn.Module]]:
        yield se.reduce, self.reduce
        yield se.expand, self.expand


class _Block(nn.Module):
    """An inverted-residual (``ir``) or depthwise-separable (``ds``) block at its largest
    input, width, expansion and kernel; ``forward`` runs it at a subnet's."""

    def __init__(
        self,
        block: str,
        c_in: int,
        c_out: int,
        *,
        stride: int,
        expansion: int,
        kernel: int,
        kernels: tuple[int, ...],
        se: bool,
        act: str,
        transforms: bool,
    ) -> None:
        super().__init__()
        self.ir, self.stride = block == "ir", stride
        hidden = round(c_in * expansion) if self.ir else c_in
        if self.ir:
            self.expand = _ConvNorm(DynamicConv2d(c_in, hidden, 1), act)
        depthwise = DynamicConv2d(
            hidden, hidden, kernel, stride, depthwise=True, kernels=kernels, transforms=transforms
        )
        self.depthwise = _ConvNorm(depthwise, act)
        self.se = _SqueezeExcite(hidden) if se else None
        self.project = _ConvNorm(DynamicConv2d(hidden, c_out, 1), None if self.ir else act)

    def forward(self, x: torch.Tensor, *, width: int, expansion: int, kernel: int, se: bool):
        c_in = x.shape[1]
        out = x
        if self.ir and expansion != 1:
            out = self.expand(x, round(c_in * expansion))
        out = self.depthwise(out, kernel=kernel)
        if se:
            assert self.se is not None, "squeeze-excitation asked of a supernet built without it"
            out = self.se(out)
        out = self.project(out, width)
        residual = self.ir and self.stride == 1 and c_in == width
        return x + out if residual else out

    def pairs(self, block: Any, expansion: int, se: bool) -> Iterator[tuple[Any, nn.Module]]:
        layers = list(block.block if self.ir else block)
        if self.ir and expansion != 1:
            yield from self.expand.pairs(layers.pop(0))
        yield from self.depthwise.pairs(layers.pop(0))
        if se:
            assert self.se is not None
            yield from self.se.pairs(layers.pop(0))
        yield from self.project.pairs(layers.pop(0))


class MobileNetSupernet(nn.Module):
    """A MobileNet at the largest sizes of its elastic genes (the keyword arguments of
    ``_mobilenet_net.MobileNet`` for the largest subnet, squeeze-excitation built where
    any subnet uses it); :meth:`activate` with a subnet's keyword arguments makes
    ``forward`` run that subnet. ``kernels``: the kernel sizes subnets use;
    ``transforms``: OFA's learned kernel transformations for the smaller ones."""

    def __init__(
        self,
        *,
        in_channels: int,
        num_classes: int,
        stem_width: int,
        stem_stride: int,
        stages: list[list[Any]],
        head_width: int,
        activation: str,
        dropout: float = 0.2,
        kernels: tuple[int, ...] = (),
        transforms: bool = False,
    ) -> None:
        super().__init__()
        self.stem = _ConvNorm(DynamicConv2d(in_channels, stem_width, 3, stem_stride), activation)
        self.stages = nn.ModuleList()
        channels = stem_width
        for block, depth, width, stride, expansion, kernel, se in stages:
            blocks = nn.ModuleList()
            for index in range(depth):
                blocks.append(
                    _Block(
                        block,
                        channels,
                        width,
                        stride=stride if index == 0 else 1,
                        expansion=expansion,
                        kernel=kernel,
                        kernels=kernels,
                        se=se,
                        act=activation,
                        transforms=transforms,
                    )
                )
                channels = width
            self.stages.append(blocks)
        self.head = _ConvNorm(DynamicConv2d(channels, head_width, 1), activation)
        self.dropout = nn.Dropout(dropout)
        self.classifier = DynamicLinear(head_width, num_classes)
        for m in self.modules():
            if isinstance(m, DynamicConv2d) and m.bias is not None:
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.classifier.weight, 0, 0.01)
        nn.init.zeros_(self.classifier.bias)
        self.active = [list(s) for s in stages]

    def activate(self, *, stages: list[list[Any]], **_: Any) -> None:
        """Run the subnet of these ``_mobilenet_net.MobileNet`` keyword arguments."""
        self.active = [list(s) for s in stages]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        stages: list[Any] = list(self.stages)
        for blocks, (_, depth, width, _, expansion, kernel, se) in zip(
            stages, self.active, strict=True
        ):
            for block in list(blocks)[:depth]:
                x = block(x, width=width, expansion=expansion, kernel=kernel, se=se)
        x = self.head(x)
        return self.classifier(self.dropout(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))

    def pairs(
        self, subnet: Any, *, stages: list[list[Any]], **others: Any
    ) -> Iterator[tuple[Any, nn.Module]]:
        """(layer of ``subnet``, a ``_mobilenet_net.MobileNet`` built with these keyword
        arguments; layer of this supernet) for every layer with weights."""
        features = iter(subnet.features)
        yield from self.stem.pairs(next(features))
        mine: list[Any] = list(self.stages)
        for blocks, (_, depth, _, _, expansion, _, se) in zip(mine, stages, strict=True):
            for block in list(blocks)[:depth]:
                yield from block.pairs(next(features), expansion, se)
        yield from self.head.pairs(next(features))
        yield subnet.classifier[1], self.classifier
