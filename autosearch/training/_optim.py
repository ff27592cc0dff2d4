"""The optimizers and learning-rate schedules a ``TrainConfig`` names.

A schedule steps once per training step. ``warmup_epochs`` raises the learning rate
linearly from ``lr / w`` to ``lr`` over its first ``w`` steps (Goyal et al. 2017: large
batches and learning rates diverge or end badly without it), then the named schedule
runs over the steps left; with no warm-up the cosine schedule is torch's
``CosineAnnealingLR``, exactly as before the option existed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn as nn

__all__ = [
    "OPTIMIZERS",
    "SCHEDULES",
    "Recipe",
    "make_optimizer",
    "make_schedule",
    "retune",
    "warmup_steps",
]


class Recipe(Protocol):
    """What the optimizer and schedule read of a ``TrainConfig``."""

    @property
    def optimizer(self) -> str: ...
    @property
    def lr(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def schedule(self) -> str: ...
    @property
    def warmup_epochs(self) -> float: ...


# ``graphed``: the steps are captured in a CUDA graph, which needs the fused kernels (they
# take the learning rate as a device tensor). Only then: torch's fused SGD fails on a
# parameter that first gets a gradient after the first step (its momentum buffer is
# None), which a supernet's sandwich steps do (seen on an H200); eager steps keep
# torch's default (foreach) kernels.
def _sgd(params: list[nn.Parameter], c: Recipe, graphed: bool) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        params,
        lr=c.lr,
        momentum=0.9,
        nesterov=True,
        weight_decay=c.weight_decay,
        fused=True if graphed else None,
    )


def _adamw(params: list[nn.Parameter], c: Recipe, graphed: bool) -> torch.optim.Optimizer:
    # capturable: its step counts live on the device, so a CUDA graph can replay it.
    return torch.optim.AdamW(
        params,
        lr=c.lr,
        weight_decay=c.weight_decay,
        fused=True if graphed else None,
        capturable=graphed,
    )


OPTIMIZERS: dict[str, Callable[[list[nn.Parameter], Recipe, bool], torch.optim.Optimizer]] = {
    "sgd": _sgd,
    "adamw": _adamw,
}
SCHEDULES = ("cosine", "onecycle")


def make_optimizer(
    params: list[nn.Parameter], config: Recipe, graphed: bool
) -> torch.optim.Optimizer:
    return OPTIMIZERS[config.optimizer](params, config, graphed)


def warmup_steps(config: Recipe, steps_per_epoch: int, steps: int) -> int:
    """The warm-up's length in steps: ``warmup_epochs`` of them, at most all but one."""
    return min(round(config.warmup_epochs * steps_per_epoch), max(steps - 1, 0))


def make_schedule(
    optimizer: torch.optim.Optimizer, config: Recipe, steps_per_epoch: int, epochs: int
) -> Any:
    steps = epochs * steps_per_epoch
    if config.schedule == "onecycle":  # warms up itself (TrainConfig refuses warmup_epochs)
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config.lr, total_steps=steps)
    warmup = warmup_steps(config, steps_per_epoch, steps)
    if warmup == 0:
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def retune(
    optimizer: torch.optim.Optimizer, schedule: Any, *, lr: float, weight_decay: float
) -> None:
    """Give a restored run new settings: the learning-rate schedule rescaled so that its
    peak is ``lr`` (where it is in its course is kept: cosine, warm-up and one-cycle are
    all proportional to their peak), and ``weight_decay``. Tensors the optimizer holds
    (a CUDA graph's learning rate) change in place."""
    factors = []
    for group in optimizer.param_groups:
        peak = group.get("max_lr", group.get("initial_lr", group["lr"]))
        factor = lr / float(peak)
        factors.append(factor)
        for key in ("lr", "initial_lr", "max_lr", "min_lr"):
            if key in group:
                if isinstance(group[key], torch.Tensor):
                    group[key].mul_(factor)
                else:
                    group[key] = group[key] * factor
        group["weight_decay"] = weight_decay
    if hasattr(schedule, "base_lrs"):
        schedule.base_lrs = [b * f for b, f in zip(schedule.base_lrs, factors, strict=True)]
