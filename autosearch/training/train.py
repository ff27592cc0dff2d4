"""One readable training loop shared by every trial.

The trainer knows nothing of studies or Optuna: it reports each epoch through a
callback, which may raise to end the run. It runs on the device and precision of a
:class:`autosearch.training.runtime.Runtime`, under DDP when started by torchrun, and writes a
checkpoint after every epoch so that an interrupted run resumes where it stopped and
ends with the same weights.

Images in memory are indexed a batch at a time and augmented batched on the device (kept
on a GPU when they take at most half its free memory). A streamed folder is read by a
``DataLoader`` with worker processes and a ``DistributedSampler``, each rank reading
only its share; its batches are augmented the same way once they reach the device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from autosearch._checks import Check, check_fields, flag, real, whole
from autosearch.data import Dataset, FileSplit, Split
from autosearch.errors import ConfigError, TrialFailed
from autosearch.scoring.cost import cpu_threads
from autosearch.training import _checkpoint as checkpoint_file
from autosearch.training import sharding
from autosearch.training._batch import batch_cap, find_batch_size, grown
from autosearch.training._feed import Batch, epoch_batches
from autosearch.training._optim import (
    OPTIMIZERS,
    SCHEDULES,
    make_optimizer,
    make_schedule,
    retune,
)
from autosearch.training._step import (
    GraphedStep,
    NonFiniteWatch,
    backward_and_step,
    graph_refusal,
)
from autosearch.training.runtime import PRECISIONS, Runtime, autocast, resolve
from autosearch.training.sharding import PARALLEL, Parallel

logger = logging.getLogger(__name__)

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
        warmup_epochs: Raise the learning rate linearly to ``lr`` over this many
            epochs (fractions allowed) before the cosine schedule; for large batches
            and learning rates. 0: none.
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
        cuda_graphs: On a CUDA GPU, capture the training step in a CUDA graph after
            three eager steps and replay it (one launch per step instead of hundreds:
            small candidates are launch-bound). Used where it applies (one process,
            bf16 or fp32, cosine schedule, not a supernet or distillation); elsewhere,
            and where capture fails (logged once), steps run eagerly.
        parallel: How ranks started by torchrun share the work: ``"ddp"`` (a whole
            copy of the model on every rank), ``"fsdp"`` (parameters, gradients and
            optimizer state sharded over every rank: candidates larger than one device)
            or ``"hsdp"`` (sharded within groups of ``shard_size`` ranks, replicated
            across the groups). Each rank reads its share of every batch in all three.
            In one process it changes nothing but the checkpoint's format (sharded, so
            that a run resumes at any number of ranks).
        shard_size: Ranks a group under ``"hsdp"`` (default: the ranks of one node).
    """

    epochs: int = 10
    batch_size: int = 64
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = 0.05
    weight_decay: float = 5e-4
    label_smoothing: float = 0.0
    schedule: Literal["cosine", "onecycle"] = "cosine"
    warmup_epochs: float = 0.0
    grad_clip: float | None = None
    crop_padding: int = 0
    flip: bool = False
    cutout: int = 0
    precision: str = "auto"
    device: str = "auto"
    channels_last: bool = False
    compile: bool = False
    auto_batch_size: bool = False
    cuda_graphs: bool = True
    parallel: Parallel = "ddp"
    shard_size: int | None = None

    def __post_init__(self) -> None:
        check_fields("TrainConfig", self, _CHECKS)
        if self.shard_size is not None and self.parallel != "hsdp":
            raise ConfigError(
                f"TrainConfig shard_size={self.shard_size} with parallel={self.parallel!r}: "
                "a shard size applies to parallel='hsdp' only; set parallel='hsdp' or drop it"
            )
        if self.warmup_epochs and self.schedule == "onecycle":
            raise ConfigError(
                f"TrainConfig warmup_epochs={self.warmup_epochs} with schedule='onecycle', "
                "which warms up itself: set warmup_epochs=0, or schedule='cosine'"
            )
        if self.warmup_epochs >= self.epochs:
            raise ConfigError(
                f"TrainConfig warmup_epochs={self.warmup_epochs} leaves none of the "
                f"{self.epochs} epochs to the schedule: warm up for fewer epochs"
            )


# (field, check, what is expected): every TrainConfig is checked when it is made.
_CHECKS: tuple[Check, ...] = (
    ("epochs", whole(1), "an integer >= 1"),
    ("batch_size", whole(1), "an integer >= 1"),
    ("optimizer", lambda v: v in OPTIMIZERS, "'sgd' or 'adamw'"),
    ("lr", real(0, above=True), "a finite number > 0, e.g. 0.05"),
    ("weight_decay", real(0), "a finite number >= 0"),
    ("label_smoothing", real(0, 1), "a number in [0, 1)"),
    ("schedule", lambda v: v in SCHEDULES, "'cosine' or 'onecycle'"),
    ("warmup_epochs", real(0), "a number of epochs >= 0, e.g. 1 (0: no warm-up)"),
    ("grad_clip", lambda v: v is None or (real(0, above=True)(v)), "None or a number > 0"),
    ("crop_padding", whole(0), "an integer >= 0 (0: no random crops)"),
    ("cutout", whole(0), "an integer >= 0 (0: no cutout)"),
    ("precision", lambda v: v in PRECISIONS, f"one of {', '.join(PRECISIONS)}"),
    (
        "device",
        lambda v: (
            isinstance(v, str) and re.fullmatch(r"auto|cpu|mps|cuda(:\d{1,3})?", v) is not None
        ),
        "'auto', 'cpu', 'cuda', 'cuda:1' or 'mps'",
    ),
    *(
        (name, flag, "True or False")
        for name in ("flip", "channels_last", "compile", "auto_batch_size", "cuda_graphs")
    ),
    ("parallel", lambda v: v in PARALLEL, "'ddp', 'fsdp' or 'hsdp'"),
    ("shard_size", lambda v: v is None or whole(1)(v), "None or an integer >= 1"),
)


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
    # Bytes this rank held while it trained ("parameters", "optimizer"), measured from
    # the tensors: about 1/N of the whole under parallel="fsdp" with N ranks.
    held: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def val_accuracy(self) -> float:
        return self.history[-1].val_accuracy

    @property
    def seconds(self) -> float:
        return sum(e.seconds for e in self.history)


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
    until: int | None = None,
    adaptive: Collection[str] = (),
) -> TrainResult:
    """Train ``model`` in place on ``data.train``, validating after each epoch.

    The loss is cross-entropy (with the config's label smoothing) unless ``criterion``
    is given: ``criterion(logits, inputs, labels)`` on the normalised, augmented batch
    (knowledge distillation uses it to ask a teacher about the same images).

    With ``checkpoint``, the state after every epoch (model, optimizer, schedule, loss
    scaler, RNG states, history) is written there, and a run that finds one resumes
    from it. Under torchrun every rank calls this; rank 0 writes the checkpoint.

    ``until`` stops after that epoch (the schedule still spans ``config.epochs``); a later
    call with the same checkpoint goes on. ``adaptive`` names settings that may change
    between such calls (population-based training: ``lr``, ``weight_decay``,
    ``label_smoothing``): a checkpoint resumes whatever they were, and this call's values
    win over the restored ones (the learning-rate schedule rescaled to the new peak).

    Raises:
        TrialFailed: the loss became NaN or infinite, or the device ran out of memory.
        ConfigError: the model has nothing to train, or ``adaptive`` names a setting that
            cannot change mid-run.
    """
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            f"{type(model).__name__} has no trainable parameters: there is nothing to train "
            f"(parallel={config.parallel!r})"
        )
    runtime = runtime or resolve(device=config.device, precision=config.precision)
    if config.auto_batch_size and runtime.device.type == "cuda":
        cap = batch_cap(config, data)
        fits = find_batch_size(model, data, config, runtime, limit=cap)
        config, said = grown(config, fits, cap=cap, images=len(data.train))
        logger.info("auto_batch_size: %s", said)
    unknown = set(adaptive) - set(ADAPTIVE)
    if unknown:
        raise ConfigError(
            f"{sorted(unknown)} cannot change while a run trains: the adaptive settings are "
            f"{', '.join(ADAPTIVE)}"
        )
    options = _Options(on_epoch, checkpoint, criterion, until, frozenset(adaptive))
    try:
        return _train(model, data, config, seed, runtime, options)
    except torch.OutOfMemoryError:
        raise TrialFailed(
            f"out of memory on {runtime.device} at batch size "
            f"{config.batch_size}; lower batch_size or the budget"
        ) from None


# Settings a run may change between calls on one checkpoint (population-based training).
ADAPTIVE = ("lr", "weight_decay", "label_smoothing")


@dataclass(frozen=True)
class _Options:
    on_epoch: Callable[[EpochResult], None] | None
    checkpoint: str | Path | None
    criterion: Criterion | None
    until: int | None
    adaptive: frozenset[str]


def _train(
    model: nn.Module,
    data: Dataset,
    config: TrainConfig,
    seed: int,
    runtime: Runtime,
    options: _Options,
) -> TrainResult:
    loop = _prepare(model, data, config, seed, runtime, options.criterion)
    state_path = Path(options.checkpoint) if options.checkpoint else None
    first, history = 1, list[EpochResult]()
    split = sharding.sharded(config.parallel)  # the checkpoint's format
    together = split and runtime.distributed  # the model itself in shards
    settings = _settings(config, seed, data, options.adaptive)
    if state_path is not None and state_path.is_file():
        first, restored = checkpoint_file.restore(
            state_path,
            loop,
            settings,
            load_shards=(
                (
                    lambda name, digests: sharding.load_shards(
                        state_path, name, loop.model, loop.optimizer, digests
                    )
                )
                if split
                else None
            ),
            first_rank=runtime.rank == 0,
        )
        history = [EpochResult(**e) for e in restored]
        if options.adaptive and restored:  # this call's settings, not the restored ones
            retune(loop.optimizer, loop.schedule, lr=config.lr, weight_decay=config.weight_decay)
    last = config.epochs if options.until is None else min(options.until, config.epochs)
    for epoch in range(first, last + 1):
        start = time.perf_counter()
        train_loss = loop.epoch(epoch)
        if together:
            sharding.average_buffers(loop.model)  # batch-norm statistics, one value
        val_accuracy, val_loss = evaluate(loop.model, data.val, data)
        result = EpochResult(
            epoch=epoch,
            train_loss=train_loss,
            val_accuracy=val_accuracy,
            val_loss=val_loss,
            seconds=time.perf_counter() - start,
        )
        history.append(result)
        if state_path is not None:
            states = [vars(e) for e in history]
            sharding.save_checkpoint(state_path, epoch, states, loop, settings, split, runtime.rank)
        if options.on_epoch is not None:
            options.on_epoch(result)
    held = sharding.held_bytes(loop.model, loop.optimizer)
    if together:
        sharding.full_weights(loop.model, model)  # the candidate, whole, on every rank
    return TrainResult(
        history=tuple(history),
        precision=runtime.precision,
        world_size=runtime.world_size,
        held=held,
    )


@dataclass(kw_only=True, eq=False)
class _Loop:
    """What one training run steps, built once: the model (and ``net``, the model as
    stepped: DDP-wrapped and/or compiled), optimizer, schedule, loss scaler, the data
    order's generator, and where each epoch's batches come from."""

    model: nn.Module
    net: nn.Module
    config: TrainConfig
    runtime: Runtime
    optimizer: torch.optim.Optimizer
    schedule: Any
    scaler: torch.amp.GradScaler
    generator: torch.Generator
    batches: Callable[[int], Iterator[Batch]]
    criterion: Criterion | None
    watch: NonFiniteWatch
    graphed: GraphedStep | None = None

    def epoch(self, epoch: int) -> float:
        """Train one epoch; the mean training loss over every rank's samples."""
        runtime = self.runtime
        self.model.train()
        set_epoch = getattr(self.model, "set_epoch", None)
        if set_epoch is not None:  # a model that changes over the epochs (a supernet's)
            set_epoch(epoch)
        total_loss = torch.zeros((), device=runtime.device)
        seen = 0
        for step, (x, y, share) in enumerate(self.batches(epoch)):
            if self.graphed is not None:
                loss = self.graphed(x, y)
            else:
                loss = self._forward(x, y)
                self.optimizer.zero_grad(set_to_none=True)
                self._backward(loss * share if share != 1.0 else loss)
                loss = loss.detach()  # let this step's autograd graph go
            self.schedule.step()
            total_loss += loss.detach().float() * len(y)  # this rank's samples
            seen += len(y)
            # A non-finite loss poisons every later step: stop, with where and why.
            self.watch.see(loss, epoch, step)
        counts = torch.tensor(float(seen), device=runtime.device)
        if runtime.distributed:
            dist.all_reduce(total_loss)  # every rank reports the global mean
            dist.all_reduce(counts)
        train_loss = total_loss.item() / counts.item()
        if not math.isfinite(train_loss):
            raise TrialFailed(f"loss became {train_loss} in epoch {epoch}; lower the learning rate")
        return train_loss

    def _forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        memory = torch.channels_last if self.config.channels_last else torch.contiguous_format
        # No autocast weight cache inside a CUDA graph (its casts must be captured).
        with autocast(self.runtime, cache=self.graphed is None):
            logits = self.net(x.contiguous(memory_format=memory))
            if self.criterion is None:
                return F.cross_entropy(logits, y, label_smoothing=self.config.label_smoothing)
            return self.criterion(logits, x, y)

    def _backward(self, loss: torch.Tensor) -> None:
        backward_and_step(loss, self.model, self.optimizer, self.scaler, self.config.grad_clip)


def _prepare(
    model: nn.Module,
    data: Dataset,
    config: TrainConfig,
    seed: int,
    runtime: Runtime,
    criterion: Criterion | None,
) -> _Loop:
    device = runtime.device
    model, net = sharding.place(
        model,
        device,
        distributed=runtime.distributed,
        parallel=config.parallel,
        shard_size=config.shard_size,
        channels_last=config.channels_last,
    )
    if config.compile:
        net = torch.compile(net)  # type: ignore[assignment]
    # Data order and augmentation draw from a CPU generator: the same on every device
    # and every rank, so DDP ranks agree on each global batch.
    generator = torch.Generator().manual_seed(seed)
    batches, steps_per_epoch = epoch_batches(data, config, seed, runtime, generator)
    refusal = graph_refusal(
        device=device,
        distributed=runtime.distributed,
        precision=runtime.precision,
        schedule=config.schedule,
        compiled=config.compile,
        custom_loss=criterion is not None,
        model=model,
        streamed=data.streamed,
    )
    graphed = config.cuda_graphs and refusal is None
    optimizer = make_optimizer(list(model.parameters()), config, graphed)
    loop = _Loop(
        model=model,
        net=net,
        config=config,
        runtime=runtime,
        optimizer=optimizer,
        schedule=make_schedule(optimizer, config, steps_per_epoch, config.epochs),
        scaler=torch.amp.GradScaler(device.type, enabled=runtime.precision == "fp16"),
        generator=generator,
        batches=batches,
        criterion=criterion,
        watch=NonFiniteWatch(device, runtime.distributed),
    )
    if graphed:
        loop.graphed = GraphedStep(loop._forward, loop._backward, optimizer)
    elif config.cuda_graphs and device.type == "cuda":
        logger.debug("training steps run eagerly: %s", refusal)
    return loop


def _settings(
    config: TrainConfig, seed: int, data: Dataset, adaptive: Collection[str] = ()
) -> dict[str, Any]:
    """What a run's result depends on besides the model: a checkpoint resumes only a run
    with the same (the same training config, seed and data)."""
    # How ranks share the work does not change the run: a checkpoint resumes at another
    # number of ranks, or the other sharding (its format is checked apart).
    shared = {"parallel", "shard_size", *adaptive}
    return {
        **{k: v for k, v in dataclasses.asdict(config).items() if k not in shared},
        "seed": seed,
        "data": data.name,
        "images": [len(data.train), len(data.val)],
    }


@torch.no_grad()
def evaluate(
    model: nn.Module, split: Split | FileSplit, data: Dataset, *, batch_size: int = 1024
) -> tuple[float, float]:
    """Top-1 accuracy and mean cross-entropy of ``model`` on ``split`` (on its device).
    A model that names ``evaluation_threads`` (an int8 program: its results repeat only
    on one CPU thread) is evaluated on that many."""
    was_training = model.training
    model.eval()
    device = next(model.parameters(), torch.empty(0)).device
    correct = torch.zeros((), dtype=torch.int64, device=device)
    loss = torch.zeros((), dtype=torch.float64, device=device)
    threads = getattr(model, "evaluation_threads", None)
    try:
        with cpu_threads(threads) if threads else contextlib.nullcontext():
            for x, y in split.batches(batch_size):  # summed on the device: one wait, at the end
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                logits = model(data.normalize(x)).float()
                correct += (logits.argmax(1) == y).sum()
                loss += F.cross_entropy(logits, y, reduction="sum").double()
    finally:
        model.train(was_training)
    return int(correct) / len(split), float(loss) / len(split)
