"""A small CNN model space written with NNI 3 (the NNI side of benchmarks/vs_nni.py and
the example of search_spaces.from_nni). Importing this module needs NNI."""

from __future__ import annotations

import nni
import torch
import torch.nn as nn
from nni.nas.nn.pytorch import (
    LayerChoice,
    ModelSpace,
    MutableBatchNorm2d,
    MutableConv2d,
    MutableLinear,
    Repeat,
)

__all__ = ["SmallCNN"]


def _conv(width: object, kernel: int) -> nn.Module:
    return nn.Sequential(
        MutableConv2d(width, width, kernel, padding=kernel // 2, bias=False),
        MutableBatchNorm2d(width),
        nn.ReLU(),
    )


class _Block(nn.Module):
    def __init__(self, width: object, label: str) -> None:
        super().__init__()
        self.op = LayerChoice(
            {"conv3": _conv(width, 3), "conv5": _conv(width, 5), "skip": nn.Identity()},
            label=label,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class SmallCNN(ModelSpace):
    """A stem (searched width), 1 to 3 blocks of a searched operation, a pooled head.

    Genes: ``width`` in {8, 16, 32}, ``depth`` in {1, 2, 3}, ``op0``..``op2`` in
    {conv3, conv5, skip}.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        width = nni.choice("width", [8, 16, 32])
        self.stem = nn.Sequential(
            MutableConv2d(in_channels, width, 3, padding=1, bias=False),
            MutableBatchNorm2d(width),
            nn.ReLU(),
        )
        self.blocks = Repeat(lambda i: _Block(width, f"op{i}"), (1, 3), label="depth")
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = MutableLinear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.blocks(self.stem(x))).flatten(1))
