"""The ResNet supernet: every ResNet of an elastic sub-space in one set of weights.

Elastic: the stem width, each stage's depth (its first blocks run) and width (the first
channels of every weight). Fixed: the stem kind, block type, shortcut kind, the number
of stages and their strides. A subnet's weights copied into ``_resnet_net.ResNet`` give
the same network (``pairs``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from search_spaces._dynamic import DynamicBatchNorm2d, DynamicConv2d, DynamicLinear
from search_spaces._resnet_net import BLOCKS, PadShortcut

__all__ = ["ResNetSupernet"]


class _Block(nn.Module):
    """A residual block at its largest; ``forward(x, width)`` runs it at ``width``
    (the input's channels are whatever the previous block gave)."""

    def __init__(self, c_in: int, width: int, stride: int, block: str, shortcut: str) -> None:
        super().__init__()
        self.expansion = BLOCKS[block].expansion
        self.bottleneck = block == "bottleneck"
        self.stride, self.shortcut = stride, shortcut
        c_out = width * self.expansion
        kernels: tuple[int, ...] = (1, 3, 1) if self.bottleneck else (3, 3)
        strides: tuple[int, ...] = (1, stride, 1) if self.bottleneck else (stride, 1)
        widths: tuple[int, ...] = (width, width, c_out) if self.bottleneck else (width, c_out)
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList()
        channels = c_in
        for kernel, s, w in zip(kernels, strides, widths, strict=True):
            self.convs.append(DynamicConv2d(channels, w, kernel, s))
            self.norms.append(DynamicBatchNorm2d(w))
            channels = w
        # A projection for whenever a subnet's block changes shape (for "pad" shortcuts:
        # when the block narrows, which padding cannot do): only a stage's first block can.
        self.project = DynamicConv2d(c_in, c_out, 1, stride)
        self.project_norm = DynamicBatchNorm2d(c_out)

    def shortcut_kind(self, c_in: int, c_out: int) -> str:
        """What the subnet's ``make_shortcut`` builds for these channels."""
        if self.stride == 1 and c_in == c_out:
            return "identity"
        return "pad" if self.shortcut == "pad" and c_out >= c_in else "projection"

    def forward(self, x: torch.Tensor, width: int) -> torch.Tensor:
        c_in, c_out = x.shape[1], width * self.expansion
        out = x
        sizes = (width, width, c_out) if self.bottleneck else (width, c_out)
        for i, (conv, norm, size) in enumerate(zip(self.convs, self.norms, sizes, strict=True)):
            out = norm(conv(out, size))
            if i < len(sizes) - 1:
                out = F.relu(out)
        kind = self.shortcut_kind(c_in, c_out)
        if kind == "identity":
            skip = x
        elif kind == "pad":
            skip = PadShortcut(c_in, c_out, self.stride)(x)
        else:
            skip = self.project_norm(self.project(x, c_out))
        return F.relu(out + skip)

    def pairs(self, block: Any) -> Iterator[tuple[Any, nn.Module]]:
        """(layer of the subnet's block, layer of this one), for copying weights."""
        convs = [block.conv1, block.conv2] + ([block.conv3] if self.bottleneck else [])
        for seq, conv, norm in zip(convs, self.convs, self.norms, strict=True):
            yield seq[0], conv
            yield seq[1], norm
        if isinstance(block.shortcut, nn.Sequential):  # a projection
            yield block.shortcut[0], self.project
            yield block.shortcut[1], self.project_norm


class ResNetSupernet(nn.Module):
    """A ResNet at the largest sizes of its elastic genes (the keyword arguments of
    ``_resnet_net.ResNet`` for the largest subnet); :meth:`activate` with a subnet's
    keyword arguments makes ``forward`` run that subnet."""

    def __init__(
        self,
        *,
        in_channels: int,
        num_classes: int,
        stem: str,
        stem_width: int,
        block: str,
        shortcut: str = "projection",
        stages: list[list[int]],
    ) -> None:
        super().__init__()
        imagenet = stem == "imagenet"
        self.stem_conv = DynamicConv2d(
            in_channels, stem_width, 7 if imagenet else 3, 2 if imagenet else 1
        )
        self.stem_norm = DynamicBatchNorm2d(stem_width)
        self.stem_pool = nn.MaxPool2d(3, 2, padding=1) if imagenet else nn.Identity()
        expansion = BLOCKS[block].expansion
        self.stages = nn.ModuleList()
        channels = stem_width
        for depth, width, stride in stages:
            blocks = nn.ModuleList()
            for index in range(depth):
                blocks.append(_Block(channels, width, stride if index == 0 else 1, block, shortcut))
                channels = width * expansion
            self.stages.append(blocks)
        self.head = DynamicLinear(channels, num_classes)
        self.active: dict[str, Any] = {
            "stem_width": stem_width,
            "stages": [[d, w] for d, w, _ in stages],
        }

    def activate(self, *, stem_width: int, stages: list[list[int]], **_: Any) -> None:
        """Run the subnet of these ``_resnet_net.ResNet`` keyword arguments."""
        self.active = {"stem_width": stem_width, "stages": [[d, w] for d, w, _ in stages]}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem_norm(self.stem_conv(x, self.active["stem_width"])))
        x = self.stem_pool(x)
        stages: list[Any] = list(self.stages)
        for blocks, (depth, width) in zip(stages, self.active["stages"], strict=True):
            for block in list(blocks)[:depth]:
                x = block(x, width)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def pairs(
        self, subnet: Any, *, stages: list[list[int]], **others: Any
    ) -> Iterator[tuple[Any, nn.Module]]:
        """(layer of ``subnet``, a ``_resnet_net.ResNet`` built with these keyword
        arguments; layer of this supernet) for every layer with weights."""
        yield subnet.stem[0][0], self.stem_conv
        yield subnet.stem[0][1], self.stem_norm
        flat = iter(subnet.stages)
        mine: list[Any] = list(self.stages)
        for blocks, (depth, _, _) in zip(mine, stages, strict=True):
            for block in list(blocks)[:depth]:
                yield from block.pairs(next(flat))
        yield subnet.head, self.head
