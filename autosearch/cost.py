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

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["CONVENTIONS", "Cost", "measure"]

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
