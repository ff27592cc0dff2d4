"""ResNet for any input size, in plain torch.

This file imports nothing but torch: autosearch copies it next to exported weights,
so it must rebuild the network on a machine that has only torch installed.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(c_out),
    )


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with a residual connection (He et al. 2016)."""

    expansion = 1

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = conv_bn(c_in, width, 3, stride)
        self.conv2 = conv_bn(width, c_out, 3)
        self.shortcut = (
            conv_bn(c_in, c_out, 1, stride) if stride != 1 or c_in != c_out else nn.Identity()
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.conv1(x))
        return self.relu(self.conv2(out) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1×1 reduce, 3×3 (carrying the stride), 1×1 expand ×4, as torchvision's v1.5."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = conv_bn(c_in, width, 1)
        self.conv2 = conv_bn(width, width, 3, stride)
        self.conv3 = conv_bn(width, c_out, 1)
        self.shortcut = (
            conv_bn(c_in, c_out, 1, stride) if stride != 1 or c_in != c_out else nn.Identity()
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.conv1(x))
        out = self.relu(self.conv2(out))
        return self.relu(self.conv3(out) + self.shortcut(x))


BLOCKS: dict[str, type[BasicBlock] | type[Bottleneck]] = {
    "basic": BasicBlock,
    "bottleneck": Bottleneck,
}


class ResNet(nn.Module):
    """A stem, stages of residual blocks, global average pooling and a linear head.

    Args:
        in_channels: Image channels.
        num_classes: Output logits.
        stem: ``"cifar"`` (3×3 conv, stride 1) or ``"imagenet"`` (7×7 stride 2 + max-pool).
        stem_width: Channels after the stem.
        block: ``"basic"`` or ``"bottleneck"``.
        stages: ``[depth, width, stride]`` per stage; the first block of a stage
            carries its stride.
    """

    def __init__(
        self,
        *,
        in_channels: int,
        num_classes: int,
        stem: str,
        stem_width: int,
        block: str,
        stages: list[list[int]],
    ) -> None:
        super().__init__()
        if stem == "imagenet":
            self.stem = nn.Sequential(
                conv_bn(in_channels, stem_width, 7, 2),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, padding=1),
            )
        else:
            self.stem = nn.Sequential(conv_bn(in_channels, stem_width, 3), nn.ReLU(inplace=True))
        block_cls = BLOCKS[block]
        layers: list[nn.Module] = []
        channels = stem_width
        for depth, width, stride in stages:
            for index in range(depth):
                layers.append(block_cls(channels, width, stride if index == 0 else 1))
                channels = width * block_cls.expansion
        self.stages = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(self.pool(x), 1))
