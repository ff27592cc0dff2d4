"""What each training step is fed: an epoch's batches of normalised, augmented images
and their labels, each rank its share.

Images in memory are indexed a batch at a time and augmented batched on the device (kept
on a GPU when they take at most half its free memory). A streamed folder is read by a
``DataLoader`` with worker processes and a ``DistributedSampler``, each rank reading
only its share; its batches are augmented the same way once they reach the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

from autosearch.data import Dataset, FileSplit
from autosearch.data._augment import Draws, crop_flip, cut, draw
from autosearch.training.runtime import Runtime

__all__ = ["Batch", "Feed", "epoch_batches", "resident"]


class Feed(Protocol):
    """The training settings the feed reads (a TrainConfig has them)."""

    @property
    def batch_size(self) -> int: ...
    @property
    def crop_padding(self) -> int: ...
    @property
    def flip(self) -> bool: ...
    @property
    def cutout(self) -> int: ...


Batch = tuple[torch.Tensor, torch.Tensor, float]  # (normalised images, labels, loss weight)


def epoch_batches(
    data: Dataset,
    config: Feed,
    seed: int,
    runtime: Runtime,
    generator: torch.Generator,
) -> tuple[Callable[[int], Iterator[Batch]], int]:
    """Each epoch's batches (a function of the epoch), and how many steps an epoch has."""
    device = runtime.device
    if isinstance(data.train, FileSplit):
        loader, sampler = data.train.loader(
            math.ceil(config.batch_size / runtime.world_size),  # each rank reads its share
            seed=seed,
            rank=runtime.rank,
            world_size=runtime.world_size,
            pin_memory=device.type == "cuda",
        )
        return (
            lambda epoch: _streamed_epoch(loader, sampler, epoch, data, config, seed, runtime)
        ), len(loader)
    store = resident(data.train.x.nbytes, device)
    train_x, train_y = data.train.x.to(store), data.train.y.to(store)
    if store != device and device.type == "cuda":
        train_x, train_y = train_x.pin_memory(), train_y.pin_memory()
    steps = math.ceil(len(data.train) / config.batch_size)
    return (lambda epoch: _memory_epoch(train_x, train_y, data, config, generator, runtime)), steps


def _memory_epoch(
    images: torch.Tensor,
    labels: torch.Tensor,
    data: Dataset,
    config: Feed,
    generator: torch.Generator,
    runtime: Runtime,
) -> Iterator[Batch]:
    """One epoch over images in memory: the global batch is drawn and augmented alike on
    every rank, then each rank keeps its share.

    The epoch's order and augmentation draws are made at its start and copied to the
    device once: each step then only slices them there (no host-to-device copy, and so
    no wait for the GPU, per step)."""
    order = torch.randperm(len(labels), generator=generator)
    draws = _draws(len(labels), data, config, generator).to(runtime.device)
    order = order.to(images.device, non_blocking=True)
    for start in range(0, len(labels), config.batch_size):
        part = slice(start, start + config.batch_size)
        index = order[part]
        x = images[index].to(runtime.device, non_blocking=True)
        y = labels[index].to(runtime.device, non_blocking=True)
        x = _augmented(x, data, config, draws[part])
        if not runtime.distributed:
            yield x, y, 1.0
            continue
        n = len(index)
        x, y = x[runtime.rank :: runtime.world_size], y[runtime.rank :: runtime.world_size]
        # DDP averages gradients over ranks; weighting each rank's mean by its share
        # makes that the global batch's mean even when shares are uneven.
        yield x, y, len(y) * runtime.world_size / n


def _streamed_epoch(
    loader: DataLoader,
    sampler: DistributedSampler[int],
    epoch: int,
    data: Dataset,
    config: Feed,
    seed: int,
    runtime: Runtime,
) -> Iterator[Batch]:
    """One epoch over this rank's share of a streamed split. Each batch's augmentation
    draws from a generator seeded by (seed, epoch, step, rank): no state to carry, so a
    resumed run augments exactly as an uninterrupted one, and ranks draw differently."""
    sampler.set_epoch(epoch)
    for step, (x, y) in enumerate(loader):
        entropy = np.random.SeedSequence([seed, epoch, step, runtime.rank])
        generator = torch.Generator().manual_seed(int(entropy.generate_state(1)[0]))
        x = x.to(runtime.device, non_blocking=True)
        y = y.to(runtime.device, non_blocking=True)
        draws = _draws(len(y), data, config, generator).to(runtime.device)
        yield (
            _augmented(x, data, config, draws),
            y,
            1.0,
        )  # the sampler gives every rank equally many samples


def _draws(n: int, data: Dataset, config: Feed, generator: torch.Generator) -> Draws:
    """The augmentation draws for ``n`` images (none where the config augments nothing)."""
    return draw(
        n,
        data.input_shape[1:],
        crop_padding=config.crop_padding,
        flip=config.flip,
        cutout=config.cutout,
        generator=generator,
    )


def _augmented(x: torch.Tensor, data: Dataset, config: Feed, draws: Draws) -> torch.Tensor:
    """A batch of uint8 images cropped and flipped, normalised, then cut out, as the
    config and ``draws`` say (batched, on the device)."""
    x = crop_flip(x, draws, config.crop_padding)
    return cut(data.normalize(x), draws, config.cutout)


def resident(nbytes: int, device: torch.device, free: int | None = None) -> torch.device:
    """Where in-memory training images live: on the training device, unless it is a GPU
    on which they would take more than half of the free memory (``free``: bytes, read
    from the GPU when not given); then in CPU memory, copied a batch at a time."""
    if device.type != "cuda":
        return device
    if free is None:
        free = torch.cuda.mem_get_info(device)[0]
    return device if nbytes <= free // 2 else torch.device("cpu")
