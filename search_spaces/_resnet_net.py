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


class PadShortcut(nn.Module):
    """Option A of He et al. (2016): subsample, then zero-pad the new channels.

    Parameter-free; the CIFAR ResNets (ResNet-20/56/110) use it.
    """

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.c_in, self.extra, self.stride = c_in, c_out - c_in, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride > 1:
            x = x[:, :, :: self.stride, :: self.stride]
        return nn.functional.pad(x, (0, 0, 0, 0, 0, self.extra)) if self.extra else x

    def to_prunable(self) -> nn.Conv2d:
        """The same map as a 1×1 convolution (identity on the kept channels, zeros for the
        padded ones), whose channels a structural pruner can follow."""
        c_in = self.c_in
        conv = nn.Conv2d(c_in, c_in + self.extra, 1, self.stride, bias=False)
        with torch.no_grad():
            conv.weight.zero_()
            conv.weight[torch.arange(c_in), torch.arange(c_in), 0, 0] = 1.0
        return conv


def make_shortcut(kind: str, c_in: int, c_out: int, stride: int) -> nn.Module:
    """Identity when shapes match; else a 1×1 projection (option B) or zero padding (A)."""
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    if kind == "pad" and c_out >= c_in:
        return PadShortcut(c_in, c_out, stride)
    return conv_bn(c_in, c_out, 1, stride)


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with a residual connection (He et al. 2016)."""

    expansion = 1

    def __init__(self, c_in: int, width: int, stride: int, shortcut: str) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = conv_bn(c_in, width, 3, stride)
        self.conv2 = conv_bn(width, c_out, 3)
        self.shortcut = make_shortcut(shortcut, c_in, c_out, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.conv1(x))
        return self.relu(self.conv2(out) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1×1 reduce, 3×3 (carrying the stride), 1×1 expand ×4, as torchvision's v1.5."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int, shortcut: str) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = conv_bn(c_in, width, 1)
        self.conv2 = conv_bn(width, width, 3, stride)
        self.conv3 = conv_bn(width, c_out, 1)
        self.shortcut = make_shortcut(shortcut, c_in, c_out, stride)
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
        shortcut: ``"projection"`` (1×1 conv + BN where shapes change) or ``"pad"``
            (parameter-free subsampling and zero padding).
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
        shortcut: str = "projection",
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
                layers.append(block_cls(channels, width, stride if index == 0 else 1, shortcut))
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
