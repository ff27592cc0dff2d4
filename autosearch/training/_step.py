"""One training step, eager or replayed from a CUDA graph, and a watch for a loss that
stops being finite, neither of which makes the host wait for the GPU.

A small candidate on a GPU is launch-bound: its hundreds of kernels per step take less
time on the GPU than Python takes to launch them. :class:`GraphedStep` runs the first
steps eagerly (they warm up the allocator and cuDNN, and build the optimizer's state),
then captures one whole step (forward, loss, backward, gradient clipping, optimizer
step) in a CUDA graph and replays it for every later batch of the same shape: one
launch per step. The learning rate lives in a device tensor that each step fills from
the schedule, so the schedule goes on as in eager training. Where capture fails, the
step stays eager and the log says so once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn as nn

from autosearch.errors import TrialFailed

logger = logging.getLogger(__name__)

__all__ = ["GraphedStep", "NonFiniteWatch", "backward_and_step", "graph_refusal"]

# (images, labels) -> the loss; a step's forward pass and loss, under autocast.
Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (loss) -> None: backward, clipping and the optimizer's step.
Backward = Callable[[torch.Tensor], None]


def graph_refusal(
    *,
    device: torch.device,
    distributed: bool,
    precision: str,
    schedule: str,
    compiled: bool,
    custom_loss: bool,
    model: nn.Module,
    streamed: bool = False,
) -> str | None:
    """Why a run's steps cannot be captured in a CUDA graph (None: they can)."""
    if device.type != "cuda":
        return "not on a CUDA device"
    reasons = {
        "DDP's gradient hooks synchronise across processes": distributed,
        "fp16's loss scaler reads its overflow flag on the host": precision == "fp16",
        "onecycle also changes the momentum every step": schedule == "onecycle",
        "torch.compile already chooses its own graphs": compiled,
        "a custom criterion (distillation) may run a teacher": custom_loss,
        # A supernet samples another subnet each step: no two steps share a graph.
        "the model changes between steps": hasattr(model, "set_epoch"),
        # Seen on an H200: the DataLoader's pin-memory thread calls CUDA while the
        # step is captured, and capture refuses that.
        "a streamed folder's loader pins memory in another thread": streamed,
    }
    return next((reason for reason, applies in reasons.items() if applies), None)


class GraphedStep:
    """Training steps for one run: eager for the first ``warmup``, then one captured
    CUDA graph replayed for each batch of the captured shape (a last, smaller batch of
    an epoch runs eagerly). The optimizer must take a tensor learning rate inside a
    graph (fused SGD, or AdamW with ``capturable``)."""

    def __init__(
        self,
        forward: Forward,
        backward: Backward,
        optimizer: torch.optim.Optimizer,
        *,
        warmup: int = 3,
    ) -> None:
        self.forward, self.backward, self.optimizer = forward, backward, optimizer
        self.warmup, self.steps = warmup, 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed: str | None = None
        self._x = self._y = self._loss = torch.empty(0)
        self._lr: list[torch.Tensor] = []
        self._keep: list[torch.Tensor | None] = []  # the graph's gradients, kept alive

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Train on one batch; the batch's loss (a device tensor, read it before the
        next call: a replay overwrites it)."""
        self.steps += 1
        if self.graph is None and self.failed is None and self.steps > self.warmup:
            self._capture(x, y)
        if self.graph is not None and x.shape == self._x.shape:
            self._x.copy_(x, non_blocking=True)
            self._y.copy_(y, non_blocking=True)
            for lr, group in zip(self._lr, self.optimizer.param_groups, strict=True):
                lr.fill_(group["lr"])
            self.graph.replay()
            return self._loss
        return self._eager(x, y)

    def _eager(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.graph is None and self.steps <= self.warmup:
            # Warm-up on a side stream, as CUDA graph capture asks: lazy initialisation
            # (cuBLAS handles, cuDNN plans, the allocator's pools) happens off the
            # stream that will be captured.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = self._step(x, y)
            torch.cuda.current_stream().wait_stream(side)
            return loss
        return self._step(x, y)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward(x, y)
        self.backward(loss)
        # Detached: a loss kept by the caller would keep this step's autograd graph
        # (and its gradient accumulators, made on the warm-up stream) alive.
        return loss.detach()

    def _capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        groups = self.optimizer.param_groups
        rates = [group["lr"] for group in groups]
        self._x, self._y = x.clone(), y.clone()
        self._lr = [torch.tensor(float(r), device=x.device) for r in rates]
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # the graph's backward makes them
        try:
            for group, lr in zip(groups, self._lr, strict=True):
                group["lr"] = lr  # captured by address; filled before each replay
            # thread_local: only this thread's calls may break the capture.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._loss = self.forward(self._x, self._y)
                self.backward(self._loss)
        except Exception as exc:  # any capture failure: stay eager
            self.failed = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            logger.warning("CUDA graph capture failed (%s); this run trains eagerly", self.failed)
            torch.cuda.synchronize()
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.graph = graph
            self._keep = [p.grad for g in groups for p in g["params"]]
        finally:
            for group, rate in zip(groups, rates, strict=True):
                group["lr"] = rate


class NonFiniteWatch:
    """Notices a loss that is no longer finite (it poisons every later step) and ends
    the run with where it happened.

    On a CPU, and under DDP (where every rank must stop at the same step), it looks
    every ``every`` steps. On a single GPU it never waits: each step folds the loss
    into a flag on the device, every ``every`` steps the flag is copied to the host
    asynchronously, and a copy is read once the GPU has finished it: a bad loss ends
    the run at most a few checks later."""

    def __init__(self, device: torch.device, distributed: bool, every: int = 16) -> None:
        self.every = every
        self.lazy = device.type == "cuda" and not distributed
        self.distributed = distributed
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        self._copies: list[tuple[int, int, torch.cuda.Event, torch.Tensor]] = []

    def see(self, loss: torch.Tensor, epoch: int, step: int) -> None:
        if not self.lazy:
            if step % self.every == 0:
                self._now(loss, epoch, step)
            return
        self.flag |= ~torch.isfinite(loss.detach())
        if step % self.every:
            return
        host = torch.empty((), dtype=torch.bool, pin_memory=True)
        host.copy_(self.flag, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._copies.append((epoch, step, done, host))
        while self._copies and self._copies[0][2].query():
            at_epoch, at_step, _, seen = self._copies.pop(0)
            if bool(seen):
                raise TrialFailed(
                    f"loss became nan or infinite at epoch {at_epoch}, by step {at_step}; "
                    "lower the learning rate or check the data"
                )

    def _now(self, loss: torch.Tensor, epoch: int, step: int) -> None:
        finite = torch.isfinite(loss.detach()).to(torch.int32).reshape(1)
        if self.distributed:  # ranks must stop together, or the others wait forever
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
        if not bool(finite.item()):
            raise TrialFailed(
                f"loss became {loss.item()} at epoch {epoch}, step {step}; "
                "lower the learning rate or check the data"
            )


def backward_and_step(
    loss: torch.Tensor,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    grad_clip: float | None,
) -> None:
    """Backward and optimizer step; through the loss scaler only when fp16 needs it."""
    if scaler.is_enabled():
        scaler.scale(loss).backward()
        if grad_clip is not None:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        return
    loss.backward()
    if grad_clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
