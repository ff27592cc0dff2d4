"""MobileNet-style networks (Howard et al. 2017; Sandler et al. 2018), in plain torch.

Depthwise-separable and inverted-residual blocks with a choice of kernel size,
expansion, squeeze-excitation and activation. This file imports nothing but torch:
autosearch copies it next to exported weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "relu6": nn.ReLU6,
    "hswish": nn.Hardswish,
}


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round channels to a multiple of ``divisor``, never below 90 % of ``value``
    (as in the MobileNet reference code)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def conv_bn_act(
    c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, act: str | None = None
) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
    ]
    if act is not None:
        layers.append(ACTIVATIONS[act](inplace=True))
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Channel attention: pool, reduce to a quarter (rounded to 8), expand, hard-sigmoid."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        squeezed = make_divisible(channels / 4)
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.mean((2, 3), keepdim=True)
        scale = nn.functional.hardsigmoid(self.expand(nn.functional.relu(self.reduce(scale))))
        return x * scale


class InvertedResidual(nn.Module):
    """1×1 expansion (skipped at ratio 1), k×k depthwise, optional SE, linear 1×1
    projection; a residual connection when the shapes allow (MobileNetV2)."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        *,
        stride: int,
        expansion: float,
        kernel: int,
        se: bool,
        act: str,
    ) -> None:
        super().__init__()
        hidden = round(c_in * expansion)
        layers: list[nn.Module] = []
        if expansion != 1:
            layers.append(conv_bn_act(c_in, hidden, 1, act=act))
        layers.append(conv_bn_act(hidden, hidden, kernel, stride, groups=hidden, act=act))
        if se:
            layers.append(SqueezeExcite(hidden))
        layers.append(conv_bn_act(hidden, c_out, 1))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class DepthwiseSeparable(nn.Sequential):
    """k×k depthwise conv-BN-act, optional SE, 1×1 pointwise conv-BN-act (MobileNetV1)."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        *,
        stride: int,
        expansion: float,
        kernel: int,
        se: bool,
        act: str,
    ) -> None:
        layers: list[nn.Module] = [conv_bn_act(c_in, c_in, kernel, stride, groups=c_in, act=act)]
        if se:
            layers.append(SqueezeExcite(c_in))
        layers.append(conv_bn_act(c_in, c_out, 1, act=act))
        super().__init__(*layers)


BLOCKS: dict[str, type[nn.Module]] = {"ir": InvertedResidual, "ds": DepthwiseSeparable}


class MobileNet(nn.Module):
    """Stem conv, stages of ``[block, depth, width, stride, expansion, kernel, se]``,
    a 1×1 head conv, pooling, dropout and a linear classifier.

    Channel counts are given after the width multiplier (already divisible by 8).
    """

    def __init__(
        self,
        *,
        in_channels: int,
        num_classes: int,
        stem_width: int,
        stem_stride: int,
        stages: list[list],
        head_width: int,
        activation: str,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            conv_bn_act(in_channels, stem_width, 3, stem_stride, act=activation)
        ]
        channels = stem_width
        for block, depth, width, stride, expansion, kernel, se in stages:
            for index in range(depth):
                layers.append(
                    BLOCKS[block](
                        channels,
                        width,
                        stride=stride if index == 0 else 1,
                        expansion=expansion,
                        kernel=kernel,
                        se=se,
                        act=activation,
                    )
                )
                channels = width
        layers.append(conv_bn_act(channels, head_width, 1, act=activation))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(head_width, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))
