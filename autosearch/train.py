"""One plain training loop shared by every trial.

The trainer knows nothing of studies or Optuna: it reports each epoch through a
callback, which may raise to end the run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from autosearch.data import Dataset, Split
from autosearch.errors import TrialFailed

__all__ = ["EpochResult", "TrainConfig", "TrainResult", "evaluate", "train"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How every candidate of a study is trained.

    Attributes:
        epochs: Passes over the training split.
        batch_size: Images per step.
        optimizer: ``"sgd"`` (Nesterov momentum 0.9) or ``"adamw"``.
        lr: Peak learning rate; a cosine schedule takes it to zero.
        weight_decay: Decoupled (AdamW) or L2 (SGD) weight decay.
        label_smoothing: Cross-entropy label smoothing.
        crop_padding: Random-crop augmentation with this zero padding (0 = off).
        flip: Random horizontal flips (off for digits and text-like images).
    """

    epochs: int = 10
    batch_size: int = 64
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = 0.05
    weight_decay: float = 5e-4
    label_smoothing: float = 0.0
    crop_padding: int = 0
    flip: bool = False

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(
                f"epochs and batch_size must be >= 1, got {self.epochs}, {self.batch_size}"
            )
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {sorted(_OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")


@dataclass(frozen=True, kw_only=True)
class EpochResult:
    epoch: int  # 1-based
    train_loss: float
    val_accuracy: float
    val_loss: float
    seconds: float


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    history: tuple[EpochResult, ...]

    @property
    def val_accuracy(self) -> float:
        return self.history[-1].val_accuracy

    @property
    def seconds(self) -> float:
        return sum(e.seconds for e in self.history)


def _sgd(params: list[nn.Parameter], c: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        params, lr=c.lr, momentum=0.9, nesterov=True, weight_decay=c.weight_decay
    )


def _adamw(params: list[nn.Parameter], c: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay)


_OPTIMIZERS: dict[str, Callable[[list[nn.Parameter], TrainConfig], torch.optim.Optimizer]] = {
    "sgd": _sgd,
    "adamw": _adamw,
}


def train(
    model: nn.Module,
    data: Dataset,
    config: TrainConfig,
    *,
    seed: int,
    on_epoch: Callable[[EpochResult], None] | None = None,
) -> TrainResult:
    """Train ``model`` in place on ``data.train``, validating after each epoch.

    Raises:
        TrialFailed: the loss became NaN or infinite.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = _OPTIMIZERS[config.optimizer](list(model.parameters()), config)
    steps_per_epoch = math.ceil(len(data.train) / config.batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, config.epochs * steps_per_epoch
    )
    history: list[EpochResult] = []
    for epoch in range(1, config.epochs + 1):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(data.train), generator=generator)
        total_loss = torch.zeros(())
        for step, index in enumerate(order.split(config.batch_size)):
            x = _augment(data.train.x[index], config, generator)
            loss = F.cross_entropy(
                model(data.normalize(x)),
                data.train.y[index],
                label_smoothing=config.label_smoothing,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total_loss += loss.detach() * len(index)
            # A non-finite loss poisons every later step: stop now, with where and why.
            if step % 16 == 0 and not torch.isfinite(loss):
                raise TrialFailed(
                    f"loss became {loss.item()} at epoch {epoch}, step {step}; "
                    "lower the learning rate or check the data"
                )
        train_loss = total_loss.item() / len(data.train)
        if not math.isfinite(train_loss):
            raise TrialFailed(f"loss became {train_loss} in epoch {epoch}; lower the learning rate")
        val_accuracy, val_loss = evaluate(model, data.val, data)
        result = EpochResult(
            epoch=epoch,
            train_loss=train_loss,
            val_accuracy=val_accuracy,
            val_loss=val_loss,
            seconds=time.perf_counter() - start,
        )
        history.append(result)
        if on_epoch is not None:
            on_epoch(result)
    return TrainResult(history=tuple(history))


@torch.no_grad()
def evaluate(
    model: nn.Module, split: Split, data: Dataset, *, batch_size: int = 1024
) -> tuple[float, float]:
    """Top-1 accuracy and mean cross-entropy of ``model`` on ``split``."""
    was_training = model.training
    model.eval()
    correct, loss = 0, 0.0
    for x, y in zip(split.x.split(batch_size), split.y.split(batch_size), strict=True):
        logits = model(data.normalize(x))
        correct += int((logits.argmax(1) == y).sum())
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
    model.train(was_training)
    return correct / len(split), loss / len(split)


def _augment(x: torch.Tensor, config: TrainConfig, generator: torch.Generator) -> torch.Tensor:
    """Batched random crop (with zero padding) and horizontal flip on uint8 images."""
    if config.crop_padding:
        n, c, h, w = x.shape
        p = config.crop_padding
        padded = F.pad(x, (p, p, p, p))
        top = torch.randint(0, 2 * p + 1, (n, 1, 1, 1), generator=generator)
        left = torch.randint(0, 2 * p + 1, (n, 1, 1, 1), generator=generator)
        rows = top + torch.arange(h).view(1, 1, h, 1)
        cols = left + torch.arange(w).view(1, 1, 1, w)
        x = padded[torch.arange(n).view(n, 1, 1, 1), torch.arange(c).view(1, c, 1, 1), rows, cols]
    if config.flip:
        flip = torch.rand(len(x), generator=generator) < 0.5
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    return x
