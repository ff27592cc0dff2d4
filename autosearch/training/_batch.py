"""``auto_batch_size``: the largest batch that fits on the GPU, within a rule that keeps
training as it converges at the configured batch (see :data:`MAX_GROWTH`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from autosearch.data import Dataset
from autosearch.errors import TrialFailed
from autosearch.training._optim import make_optimizer
from autosearch.training.runtime import Runtime, autocast

# A TrainConfig (autosearch.training.train, which imports this module): typed loosely here.
TrainConfig = Any

__all__ = ["MAX_GROWTH", "MIN_STEPS", "batch_cap", "find_batch_size", "grown"]


# How far auto_batch_size grows a batch: the linear learning-rate rule holds with a warm-up
# up to large factors on long runs (Goyal et al. 2017: 32x over 90 epochs); a search's
# short runs on small datasets diverged at 16x (4,096 from 256, 22.5 % accuracy). So at
# most 8x, and never so large that an epoch has fewer than MIN_STEPS steps to learn in.
MAX_GROWTH, MIN_STEPS = 8, 50


def batch_cap(config: TrainConfig, data: Dataset) -> int:
    """The largest batch auto_batch_size may choose (a power-of-two multiple of
    ``config.batch_size``), before memory is tried: see MAX_GROWTH and MIN_STEPS."""
    cap = config.batch_size
    while cap * 2 <= config.batch_size * MAX_GROWTH and len(data.train) // (cap * 2) >= MIN_STEPS:
        cap *= 2
    return cap


def grown(config: TrainConfig, fits: int, *, cap: int, images: int) -> tuple[TrainConfig, str]:
    """``config`` at the batch ``fits`` (the largest that fit, within :func:`batch_cap`):
    the learning rate scaled linearly with it and, where it grew and the schedule does
    not warm up itself, a linear warm-up of a fifth of the run (at most 5 epochs, at
    least what was asked); and what was chosen and why it stopped there, in words."""
    factor = fits / config.batch_size
    warmup = config.warmup_epochs
    if factor > 1 and config.schedule == "cosine":
        warmup = max(warmup, min(5.0, config.epochs / 5))
    chosen = dataclasses.replace(
        config, batch_size=fits, lr=config.lr * factor, warmup_epochs=warmup
    )
    if fits < cap:
        why = "the GPU's memory"
    elif cap == config.batch_size * MAX_GROWTH:
        why = f"at most {MAX_GROWTH}x the configured batch"
    else:
        why = f"at least {MIN_STEPS} steps an epoch of {images} images"
    said = (
        f"batch {fits} (grown {factor:g}x from {config.batch_size}; no further: {why}), "
        f"learning rate {config.lr:g} -> {chosen.lr:g} (linear rule)"
    )
    if warmup != config.warmup_epochs:
        said += f", warmed up over {warmup:g} epochs"
    return chosen, said


def find_batch_size(
    model: nn.Module, data: Dataset, config: TrainConfig, runtime: Runtime, *, limit: int = 4096
) -> int:
    """The largest batch, doubling from ``config.batch_size``, for which a training step
    (forward, backward, optimizer step, in the run's precision) does not run out of
    memory; at most ``limit`` and the training split's size. The model's weights are
    restored afterwards."""
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.to(runtime.device).train()
    cuda = runtime.device.type == "cuda"
    optimizer = make_optimizer(list(model.parameters()), config, cuda)
    largest = min(limit, len(data.train))
    images, labels = data.train.take(torch.arange(largest)), data.train.y[:largest]
    fits, size = 0, config.batch_size
    while size <= largest:
        try:
            x = data.normalize(images[:size].to(runtime.device))
            with autocast(runtime):
                loss = F.cross_entropy(model(x), labels[:size].to(runtime.device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        except torch.OutOfMemoryError:
            break
        finally:
            if runtime.device.type == "cuda":
                torch.cuda.empty_cache()
        fits, size = size, size * 2
    model.load_state_dict(saved)
    if not fits:
        raise TrialFailed(
            f"out of memory on {runtime.device} even at batch size {config.batch_size}; "
            "lower batch_size or the budget"
        )
    return fits
