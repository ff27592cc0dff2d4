"""What a network costs.

Conventions (state them wherever a number is shown):

* **FLOPs** = 2 × MACs of convolutions and linear layers, as counted by
  ``torch.utils.flop_counter.FlopCounterMode`` for one image (batch 1). Batch norm,
  activations, pooling and additions are not counted. Depthwise and grouped
  convolutions are counted exactly.
* **MACs** = multiply-accumulates = FLOPs / 2. Published CIFAR / ImageNet figures
  are MACs (ResNet-20: 40.8 M MACs).
* **params** = number of elements of every parameter (buffers such as batch-norm
  running statistics are not counted).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["CONVENTIONS", "Cost", "Tally", "measure"]

CONVENTIONS = (
    "FLOPs = 2 x MACs of conv/linear layers for one image (FlopCounterMode); batch norm, "
    "activations and pooling not counted; params = parameter elements."
)


@dataclass(frozen=True, kw_only=True)
class Cost:
    flops: int
    macs: int
    params: int


def measure(model: nn.Module, input_shape: Sequence[int]) -> Cost:
    """Count FLOPs, MACs and parameters of ``model`` for one ``(C, H, W)`` image.

    The model runs one forward pass in eval mode (its mode is restored after).
    """
    was_training = model.training
    model.eval()
    # A model built under torch.device("meta") is counted without memory or compute.
    device = next(model.parameters(), torch.empty(0)).device
    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), counter:
            model(torch.zeros(1, *input_shape, device=device))
    finally:
        model.train(was_training)
    flops = int(counter.get_total_flops())
    params = sum(p.numel() for p in model.parameters())
    return Cost(flops=flops, macs=flops // 2, params=params)


@dataclass(kw_only=True)
class Tally:
    """An analytic cost model: MACs and parameters counted layer by layer while
    tracking the feature map's shape, in microseconds instead of a forward pass.

    Spaces use it to check budgets before building anything; their tests check it
    against :func:`measure` (FlopCounterMode). Batch-norm parameters are counted,
    their (and activations', pooling's) operations are not, as in :func:`measure`.

    Example:
        >>> t = Tally(channels=3, height=32, width=32)
        >>> t.conv(16, 3).linear_head(10).cost().macs
        442528
    """

    channels: int
    height: int
    width: int
    macs: int = 0
    params: int = 0

    def conv(
        self,
        c_out: int,
        kernel: int,
        stride: int = 1,
        *,
        groups: int = 1,
        padding: int | None = None,
        bias: bool = False,
        bn: bool = True,
    ) -> Tally:
        """A Conv2d (padding ``kernel // 2`` by default), optionally followed by BN."""
        pad = kernel // 2 if padding is None else padding
        self.height = (self.height + 2 * pad - kernel) // stride + 1
        self.width = (self.width + 2 * pad - kernel) // stride + 1
        weights = c_out * (self.channels // groups) * kernel * kernel
        self.macs += weights * self.height * self.width
        self.params += weights + (c_out if bias else 0) + (2 * c_out if bn else 0)
        self.channels = c_out
        return self

    def bn(self) -> Tally:
        self.params += 2 * self.channels
        return self

    def pool(self, kernel: int, stride: int, padding: int = 0) -> Tally:
        self.height = (self.height + 2 * padding - kernel) // stride + 1
        self.width = (self.width + 2 * padding - kernel) // stride + 1
        return self

    def linear(self, out: int, *, bias: bool = True) -> Tally:
        """A linear layer on a flat vector of ``channels`` features."""
        self.macs += self.channels * out
        self.params += self.channels * out + (out if bias else 0)
        self.channels = out
        return self

    def linear_head(self, num_classes: int) -> Tally:
        """Global average pooling, then a linear classifier."""
        self.height = self.width = 1
        return self.linear(num_classes)

    def fork(self) -> Tally:
        """A branch from the current feature map (a shortcut, an SE block, a cell edge)."""
        branch = copy.copy(self)
        branch.macs = branch.params = 0
        return branch

    def join(self, *branches: Tally) -> Tally:
        """Add the branches' costs; the feature map becomes the first branch's."""
        for b in branches:
            self.macs += b.macs
            self.params += b.params
        if branches:
            self.channels, self.height, self.width = (
                branches[0].channels,
                branches[0].height,
                branches[0].width,
            )
        return self

    @classmethod
    def of(cls, input_shape: Sequence[int]) -> Tally:
        """A tally starting from ``(C, H, W)`` images."""
        channels, height, width = input_shape
        return cls(channels=channels, height=height, width=width)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.channels, self.height, self.width)

    def cost(self) -> Cost:
        return Cost(flops=2 * self.macs, macs=self.macs, params=self.params)
