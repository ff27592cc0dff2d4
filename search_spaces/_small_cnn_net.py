"""The small CNN: a stem, one to three blocks of a chosen operation, a pooled head.
Imports only torch (exports copy this file)."""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["SmallCNN"]


def _conv(width: int, kernel: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(width, width, kernel, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    )


class SmallCNN(nn.Module):
    """``ops``: one of "conv3", "conv5", "skip" per block."""

    def __init__(self, in_channels: int, num_classes: int, width: int, ops: list[str]) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        kernels = {"conv3": 3, "conv5": 5}
        self.blocks = nn.Sequential(
            *(_conv(width, kernels[op]) if op in kernels else nn.Identity() for op in ops)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.blocks(self.stem(x))).flatten(1))
