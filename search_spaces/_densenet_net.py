"""DenseNet (Huang et al. 2017) for any input size, in plain torch.

This file imports nothing but torch: autosearch copies it next to exported weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class DenseLayer(nn.Module):
    """BN-ReLU-Conv3×3 producing ``growth`` new channels, concatenated to the input;
    with ``bottleneck`` a BN-ReLU-Conv1×1 to ``bn_size × growth`` channels comes first
    (DenseNet-B)."""

    def __init__(self, c_in: int, growth: int, bottleneck: bool, bn_size: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if bottleneck:
            layers += [
                nn.BatchNorm2d(c_in),
                nn.ReLU(inplace=True),
                nn.Conv2d(c_in, bn_size * growth, 1, bias=False),
            ]
            c_in = bn_size * growth
        layers += [
            nn.BatchNorm2d(c_in),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_in, growth, 3, padding=1, bias=False),
        ]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.layers(x)], 1)


class Transition(nn.Sequential):
    """BN-ReLU-Conv1×1 (compressing channels) and 2×2 average pooling."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(
            nn.BatchNorm2d(c_in),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_in, c_out, 1, bias=False),
            nn.AvgPool2d(2, 2),
        )


class DenseNet(nn.Module):
    """Dense blocks joined by transitions, then BN-ReLU, pooling and a linear head.

    Args:
        in_channels: Image channels.
        num_classes: Output logits.
        stem: ``"cifar"`` (one 3×3 conv) or ``"imagenet"`` (7×7/2 conv-BN-ReLU + 3×3/2 max-pool).
        stem_width: Channels after the stem (the "initial features").
        growth: Channels each dense layer adds (k).
        blocks: Dense layers per block.
        bottleneck: 1×1 bottleneck convolutions in the dense layers (DenseNet-B).
        compression: Share of channels a transition keeps (DenseNet-C when < 1).
        bn_size: Bottleneck width in multiples of ``growth``.
    """

    def __init__(
        self,
        *,
        in_channels: int,
        num_classes: int,
        stem: str,
        stem_width: int,
        growth: int,
        blocks: list[int],
        bottleneck: bool,
        compression: float,
        bn_size: int = 4,
    ) -> None:
        super().__init__()
        if stem == "imagenet":
            features: list[nn.Module] = [
                nn.Conv2d(in_channels, stem_width, 7, 2, padding=3, bias=False),
                nn.BatchNorm2d(stem_width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, padding=1),
            ]
        else:
            features = [nn.Conv2d(in_channels, stem_width, 3, padding=1, bias=False)]
        channels = stem_width
        for index, layers in enumerate(blocks):
            for _ in range(layers):
                features.append(DenseLayer(channels, growth, bottleneck, bn_size))
                channels += growth
            if index < len(blocks) - 1:
                out = int(channels * compression)
                features.append(Transition(channels, out))
                channels = out
        features += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*features)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.features(x)), 1))
