"""One readable training loop shared by every trial.

The trainer knows nothing of studies or Optuna: it reports each epoch through a
callback, which may raise to end the run. It runs on the device and precision of a
:class:`autosearch.runtime.Runtime`, under DDP when started by torchrun, and writes a
checkpoint after every epoch so that an interrupted run resumes where it stopped and
ends with the same weights.

Images in memory are indexed a batch at a time and augmented batched on the device (kept
on a GPU when they take at most half its free memory). A streamed folder is read by a
``DataLoader`` with worker processes and a ``DistributedSampler``, each rank reading
only its share; its batches are augmented the same way once they reach the device.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from autosearch.data import Dataset, FileSplit, Split
from autosearch.errors import TrialFailed
from autosearch.runtime import PRECISIONS, Runtime, autocast, resolve

__all__ = [
    "Criterion",
    "EpochResult",
    "TrainConfig",
    "TrainResult",
    "evaluate",
    "find_batch_size",
    "train",
]


# (logits, normalised inputs, labels) -> scalar loss
Criterion = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How every candidate of a study is trained.

    Attributes:
        epochs: Passes over the training split.
        batch_size: Images per step (the global batch: DDP ranks share it).
        optimizer: ``"sgd"`` (Nesterov momentum 0.9) or ``"adamw"``.
        lr: Peak learning rate.
        weight_decay: Decoupled (AdamW) or L2 (SGD) weight decay.
        label_smoothing: Cross-entropy label smoothing.
        schedule: ``"cosine"`` (to zero) or ``"onecycle"`` (warm-up, then anneal).
        grad_clip: Clip the gradients' global norm to this (None: no clipping).
        crop_padding: Random-crop augmentation with this zero padding (0 = off).
        flip: Random horizontal flips (off for digits and text-like images).
        cutout: Side of a random square zeroed in each normalised image (0 = off).
        precision: ``"auto"`` (fp32 on CPU, bf16 or fp16 on GPUs), ``"fp32"``,
            ``"bf16"`` or ``"fp16"`` (with a dynamic loss scaler).
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``.
        channels_last: NHWC memory format (faster convolutions on GPUs).
        compile: Train through ``torch.compile``.
        auto_batch_size: On a GPU, train with the largest batch that fits (doubling
            from ``batch_size``), the learning rate scaled with it (linear rule).
    """

    epochs: int = 10
    batch_size: int = 64
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = 0.05
    weight_decay: float = 5e-4
    label_smoothing: float = 0.0
    schedule: Literal["cosine", "onecycle"] = "cosine"
    grad_clip: float | None = None
    crop_padding: int = 0
    flip: bool = False
    cutout: int = 0
    precision: str = "auto"
    device: str = "auto"
    channels_last: bool = False
    compile: bool = False
    auto_batch_size: bool = False

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(
                f"epochs and batch_size must be >= 1, got {self.epochs}, {self.batch_size}"
            )
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {sorted(_OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if self.schedule not in _SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(_SCHEDULES)}, got {self.schedule!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be positive or None, got {self.grad_clip}")


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
    precision: str = "fp32"
    world_size: int = 1

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

_SCHEDULES: dict[str, Callable[[torch.optim.Optimizer, TrainConfig, int], Any]] = {
    "cosine": lambda opt, c, steps: torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps),
    "onecycle": lambda opt, c, steps: torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=c.lr, total_steps=steps
    ),
}


def train(
    model: nn.Module,
    data: Dataset,
    config: TrainConfig,
    *,
    seed: int,
    on_epoch: Callable[[EpochResult], None] | None = None,
    checkpoint: str | Path | None = None,
    runtime: Runtime | None = None,
    criterion: Criterion | None = None,
) -> TrainResult:
    """Train ``model`` in place on ``data.train``, validating after each epoch.

    The loss is cross-entropy (with the config's label smoothing) unless ``criterion``
    is given: ``criterion(logits, inputs, labels)`` on the normalised, augmented batch
    (knowledge distillation uses it to ask a teacher about the same images).

    With ``checkpoint``, the state after every epoch (model, optimizer, schedule, loss
    scaler, RNG states, history) is written there, and a run that finds one resumes
    from it. Under torchrun every rank calls this; rank 0 writes the checkpoint.

    Raises:
        TrialFailed: the loss became NaN or infinite, or the device ran out of memory.
    """
    runtime = runtime or resolve(device=config.device, precision=config.precision)
    if config.auto_batch_size and runtime.device.type == "cuda":
        size = find_batch_size(model, data, config, runtime)
        config = dataclasses.replace(
            config, batch_size=size, lr=config.lr * size / config.batch_size
        )
    try:
        return _train(model, data, config, seed, on_epoch, checkpoint, runtime, criterion)
    except torch.OutOfMemoryError:
        raise TrialFailed(
            f"out of memory on {runtime.device} at batch size "
            f"{config.batch_size}; lower batch_size or the budget"
        ) from None


def _train(
    model: nn.Module,
    data: Dataset,
    config: TrainConfig,
    seed: int,
    on_epoch: Callable[[EpochResult], None] | None,
    checkpoint: str | Path | None,
    runtime: Runtime,
    criterion: Criterion | None = None,
) -> TrainResult:
    device = runtime.device
    memory = torch.channels_last if config.channels_last else torch.contiguous_format
    model.to(device)
    if config.channels_last:  # supported by Module.to, though missing from its type stubs
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    net: nn.Module = model
    if runtime.distributed:
        ids = [device.index] if device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if config.compile:
        net = torch.compile(net)  # type: ignore[assignment]
    # Data order and augmentation draw from a CPU generator: the same on every device
    # and every rank, so DDP ranks agree on each global batch.
    generator = torch.Generator().manual_seed(seed)
    if isinstance(data.train, FileSplit):
        loader, sampler = data.train.loader(
            math.ceil(config.batch_size / runtime.world_size),  # each rank reads its share
            seed=seed,
            rank=runtime.rank,
            world_size=runtime.world_size,
            pin_memory=device.type == "cuda",
        )
        steps_per_epoch = len(loader)
    else:
        store = _resident(data.train.x.nbytes, device)
        train_x, train_y = data.train.x.to(store), data.train.y.to(store)
        if store != device and device.type == "cuda":
            train_x, train_y = train_x.pin_memory(), train_y.pin_memory()
        steps_per_epoch = math.ceil(len(data.train) / config.batch_size)
    optimizer = _OPTIMIZERS[config.optimizer](list(model.parameters()), config)
    schedule = _SCHEDULES[config.schedule](optimizer, config, config.epochs * steps_per_epoch)
    scaler = torch.amp.GradScaler(device.type, enabled=runtime.precision == "fp16")
    history: list[EpochResult] = []
    state_path = Path(checkpoint) if checkpoint else None
    first = 1
    if state_path is not None and state_path.is_file():
        first, history = _restore(state_path, model, optimizer, schedule, scaler, generator)
    for epoch in range(first, config.epochs + 1):
        start = time.perf_counter()
        model.train()
        if isinstance(data.train, FileSplit):
            batches = _streamed_epoch(loader, sampler, epoch, data, config, seed, runtime)
        else:
            batches = _memory_epoch(train_x, train_y, data, config, generator, runtime)
        total_loss = torch.zeros((), device=device)
        seen = torch.zeros((), device=device)
        for step, (x, y, share) in enumerate(batches):
            with autocast(runtime):
                logits = net(x.contiguous(memory_format=memory))
                if criterion is None:
                    loss = F.cross_entropy(logits, y, label_smoothing=config.label_smoothing)
                else:
                    loss = criterion(logits, x, y)
            optimizer.zero_grad(set_to_none=True)
            _step(loss * share if share != 1.0 else loss, model, optimizer, scaler, config)
            schedule.step()
            total_loss += loss.detach().float() * len(y)  # this rank's samples
            seen += len(y)
            # A non-finite loss poisons every later step: stop now, with where and why.
            if step % 16 == 0 and not _finite_everywhere(loss, runtime):
                raise TrialFailed(
                    f"loss became {loss.item()} at epoch {epoch}, step {step}; "
                    "lower the learning rate or check the data"
                )
        if runtime.distributed:
            dist.all_reduce(total_loss)  # every rank reports the global mean
            dist.all_reduce(seen)
        train_loss = total_loss.item() / seen.item()
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
        if state_path is not None and runtime.rank == 0:
            _save(state_path, epoch, history, model, optimizer, schedule, scaler, generator)
        if on_epoch is not None:
            on_epoch(result)
    return TrainResult(
        history=tuple(history), precision=runtime.precision, world_size=runtime.world_size
    )


Batch = tuple[torch.Tensor, torch.Tensor, float]  # (normalised images, labels, loss weight)


def _memory_epoch(
    images: torch.Tensor,
    labels: torch.Tensor,
    data: Dataset,
    config: TrainConfig,
    generator: torch.Generator,
    runtime: Runtime,
) -> Iterator[Batch]:
    """One epoch over images in memory: the global batch is drawn and augmented alike on
    every rank, then each rank keeps its share."""
    order = torch.randperm(len(labels), generator=generator)
    for batch in order.split(config.batch_size):
        index = batch.to(images.device)
        x = images[index].to(runtime.device, non_blocking=True)
        y = labels[index].to(runtime.device, non_blocking=True)
        x = _cutout(data.normalize(_augment(x, config, generator)), config.cutout, generator)
        if not runtime.distributed:
            yield x, y, 1.0
            continue
        x, y = x[runtime.rank :: runtime.world_size], y[runtime.rank :: runtime.world_size]
        # DDP averages gradients over ranks; weighting each rank's mean by its share
        # makes that the global batch's mean even when shares are uneven.
        yield x, y, len(y) * runtime.world_size / len(batch)


def _streamed_epoch(
    loader: DataLoader,
    sampler: DistributedSampler[int],
    epoch: int,
    data: Dataset,
    config: TrainConfig,
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
        x = _cutout(data.normalize(_augment(x, config, generator)), config.cutout, generator)
        yield x, y, 1.0  # the sampler gives every rank equally many samples


def _resident(nbytes: int, device: torch.device, free: int | None = None) -> torch.device:
    """Where in-memory training images live: on the training device, unless it is a GPU
    on which they would take more than half of the free memory (``free``: bytes, read
    from the GPU when not given); then in CPU memory, copied a batch at a time."""
    if device.type != "cuda":
        return device
    if free is None:
        free = torch.cuda.mem_get_info(device)[0]
    return device if nbytes <= free // 2 else torch.device("cpu")


def _step(
    loss: torch.Tensor,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    config: TrainConfig,
) -> None:
    """Backward and optimizer step; through the loss scaler only when fp16 needs it."""
    if scaler.is_enabled():
        scaler.scale(loss).backward()
        if config.grad_clip is not None:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        return
    loss.backward()
    if config.grad_clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()


def find_batch_size(
    model: nn.Module, data: Dataset, config: TrainConfig, runtime: Runtime, *, limit: int = 4096
) -> int:
    """The largest batch, doubling from ``config.batch_size``, for which a training step
    (forward, backward, optimizer step, in the run's precision) does not run out of
    memory; at most ``limit`` and the training split's size. The model's weights are
    restored afterwards."""
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.to(runtime.device).train()
    optimizer = _OPTIMIZERS[config.optimizer](list(model.parameters()), config)
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


def _finite_everywhere(loss: torch.Tensor, runtime: Runtime) -> bool:
    """Whether the loss is finite on every rank: ranks must stop together, or the ones
    still training wait forever on the ones that stopped."""
    finite = torch.isfinite(loss.detach()).to(torch.int32).reshape(1)
    if runtime.distributed:
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return bool(finite.item())


def _save(
    path: Path,
    epoch: int,
    history: list[EpochResult],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: Any,
    scaler: torch.amp.GradScaler,
    generator: torch.Generator,
) -> None:
    state = {
        "epoch": epoch,
        "history": [vars(e) for e in history],
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "scaler": scaler.state_dict(),
        "generator": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # atomic: a crash mid-write leaves the previous checkpoint


def _restore(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: Any,
    scaler: torch.amp.GradScaler,
    generator: torch.Generator,
) -> tuple[int, list[EpochResult]]:
    # weights_only: a checkpoint holds tensors and plain values, never arbitrary objects.
    state = torch.load(path, weights_only=True, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    scaler.load_state_dict(state["scaler"])
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["epoch"]) + 1, [EpochResult(**e) for e in state["history"]]


@torch.no_grad()
def evaluate(
    model: nn.Module, split: Split | FileSplit, data: Dataset, *, batch_size: int = 1024
) -> tuple[float, float]:
    """Top-1 accuracy and mean cross-entropy of ``model`` on ``split`` (on its device)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters(), torch.empty(0)).device
    correct, loss = 0, 0.0
    for x, y in split.batches(batch_size):
        x, y = x.to(device), y.to(device)
        logits = model(data.normalize(x)).float()
        correct += int((logits.argmax(1) == y).sum())
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
    model.train(was_training)
    return correct / len(split), loss / len(split)


def _augment(x: torch.Tensor, config: TrainConfig, generator: torch.Generator) -> torch.Tensor:
    """Batched random crop (with zero padding) and horizontal flip on uint8 images."""
    n, c, h, w = x.shape
    if config.crop_padding:
        p = config.crop_padding
        padded = F.pad(x, (p, p, p, p))
        top = torch.randint(0, 2 * p + 1, (n, 1, 1, 1), generator=generator).to(x.device)
        left = torch.randint(0, 2 * p + 1, (n, 1, 1, 1), generator=generator).to(x.device)
        rows = top + torch.arange(h, device=x.device).view(1, 1, h, 1)
        cols = left + torch.arange(w, device=x.device).view(1, 1, 1, w)
        batch = torch.arange(n, device=x.device).view(n, 1, 1, 1)
        x = padded[batch, torch.arange(c, device=x.device).view(1, c, 1, 1), rows, cols]
    if config.flip:
        flip = (torch.rand(n, generator=generator) < 0.5).to(x.device)
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    return x


def _cutout(x: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """Zero a ``size``-sided square at a random centre of each normalised image (DeVries
    & Taylor 2017); the square may hang over the border."""
    if not size:
        return x
    n, _, h, w = x.shape
    cy = torch.randint(0, h, (n, 1, 1), generator=generator).to(x.device)
    cx = torch.randint(0, w, (n, 1, 1), generator=generator).to(x.device)
    rows = torch.arange(h, device=x.device).view(1, h, 1)
    cols = torch.arange(w, device=x.device).view(1, 1, w)
    hole = ((rows - cy).abs() <= size // 2) & ((cols - cx).abs() <= size // 2)
    return x * (~hole).unsqueeze(1)
