"""Batch-norm statistics recomputed for the weights as they are ("precise BN").

Batch norm evaluates with running statistics, an exponential average of the batches'
statistics as the weights moved. While the weights move fast (a high learning rate,
early in a run) the average trails them, and the network is evaluated with statistics
of weights it no longer has: its validation accuracy falls far below its worth (Wu &
Johnson, "Rethinking 'Batch' in BatchNorm", 2021, section 3.1; pycls' ``precise_bn``).
Recomputed over a few batches of training images with the weights fixed, the
statistics are the network's own, and its accuracy is what it has learnt so far.

A population's rounds rank members this way (``benchmarks/RESULTS.md``,
population-based training, measures what it changes); a supernet's subnets are
evaluated this way (autosearch.weight_sharing.supernet: their statistics come from the
batches they are calibrated on). The recomputation itself is PyTorch's
(``torch.optim.swa_utils.update_bn``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator

import torch
import torch.nn as nn
from torch.optim.swa_utils import update_bn

from autosearch.data import Dataset, FileSplit, Split

__all__ = ["precise_bn", "recompute_statistics"]

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
    device = next(scored.parameters(), torch.empty(0)).device

    def first_images() -> Iterator[torch.Tensor]:
        seen = 0
        for x, _ in split.batches(batch_size):
            x = x[: images - seen]
            yield data.normalize(x.to(device, non_blocking=True))
            seen += len(x)
            if seen >= images:
                return

    recompute_statistics(scored, first_images())
    return scored.eval()


def recompute_statistics(model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """Recompute ``model``'s batch-norm running statistics over ``batches`` (inputs as
    the network takes them): each becomes the plain average over the batches (not an
    exponential one), the weights untouched, the model's mode as it was."""
    update_bn(batches, model)
