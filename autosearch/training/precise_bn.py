"""Batch-norm statistics recomputed for the weights as they are ("precise BN").

Batch norm evaluates with running statistics, an exponential average of the batches'
statistics as the weights moved. While the weights move fast (a high learning rate,
early in a run) the average trails them, and the network is evaluated with statistics
of weights it no longer has: its validation accuracy falls far below its worth (Wu &
Johnson, "Rethinking 'Batch' in BatchNorm", 2021, section 3.1; pycls' ``precise_bn``).
Recomputed over a few batches of training images with the weights fixed, the
statistics are the network's own, and its accuracy is what it has learnt so far.

A population's rounds rank members this way: measured on a small ResNet of the ResNet
space with Fashion-MNIST, halfway through a cosine schedule, members with the highest
learning rates scored 0.22–0.33 as trained and 0.71–0.73 with their statistics
recomputed; the two that ended best of their seed's 8 ranked 7th and 8th as trained,
3rd and 1st recomputed (``benchmarks/RESULTS.md``, population-based training).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from autosearch.data import Dataset, FileSplit, Split

__all__ = ["precise_bn"]

_NORMS = (nn.modules.batchnorm._BatchNorm,)


@torch.no_grad()
def precise_bn(
    model: nn.Module, split: Split | FileSplit, data: Dataset, *, images: int, batch_size: int = 256
) -> nn.Module:
    """A copy of ``model`` whose batch norms hold their inputs' mean and variance,
    averaged over batches of the first ``images`` images of ``split`` (unaugmented,
    normalized as trained),
    in evaluation mode; ``model`` itself is left as it was. A model without batch norm
    is returned as it is."""
    if images < 1:
        raise ValueError(f"images={images!r}: expected a number of images >= 1")
    if not any(isinstance(m, _NORMS) for m in model.modules()):
        return model
    scored = copy.deepcopy(model)
    for norm in scored.modules():
        if isinstance(norm, _NORMS) and norm.track_running_stats:
            norm.reset_running_stats()
            norm.momentum = None  # a cumulative average: every batch weighs the same
    scored.train()
    device = next(scored.parameters(), torch.empty(0)).device
    seen = 0
    for x, _ in split.batches(batch_size):
        x = x[: images - seen]
        scored(data.normalize(x.to(device, non_blocking=True)))
        seen += len(x)
        if seen >= images:
            break
    return scored.eval()
