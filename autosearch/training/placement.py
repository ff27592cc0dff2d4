"""How many trials share a GPU: the rule that places a study's workers on GPUs.

A trial on a GPU holds its process's CUDA context, the candidate's weights with their
gradients and optimizer state, the activations a training step keeps for the backward
pass at the trial's batch, and the training images where they are resident
(autosearch.training._feed.resident). :func:`step_need` measures the activations for
real: one training step's forward at a batch of two on the CPU, every tensor autograd
saves counted once (``saved_tensors_hooks``), scaled to the batch. What the allocator
holds at a step's peak is more than that: on an H200 (benchmarks/gpu.py's placement
section, ResNet-20 at widths 16, 32 and 64, bf16, batch 256, CUDA graphs and cuDNN's
autotuner on) it was twice the counted size plus 0.47 GiB, within 0.03 GiB at each width;
the rule counts the weights and activations twice and 0.5 GiB beside them
(:data:`STEP_PEAK`, :data:`WORKSPACE_BYTES`). :func:`per_gpu` fits as many such trials as
:data:`HEADROOM` of a GPU's free memory holds, at most :data:`MAX_PER_GPU`; :func:`assign`
spreads a study's workers over the GPUs evenly and refuses, before any worker starts,
more than fit.

The same rule gives a Ray worker its ``num_gpus`` fraction (``1 / per_gpu``:
autosearch.workers.executors.RayExecutor with ``num_gpus="auto"``), and ``per_gpu=`` on
either executor overrides it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from autosearch._checks import check_fields, whole
from autosearch.errors import ConfigError, require

__all__ = [
    "CONTEXT_BYTES",
    "HEADROOM",
    "MAX_PER_GPU",
    "STEP_PEAK",
    "WORKSPACE_BYTES",
    "Need",
    "assign",
    "per_gpu",
    "step_need",
]

GiB = 2**30
# A process's CUDA context with cuDNN's and cuBLAS's workspaces: about 0.5 GiB on the
# H100 / H200 (PyTorch's own caching allocator comes on top and is counted below).
CONTEXT_BYTES = 600 * 2**20
# A training step's peak in the allocator against its counted tensors (weights with their
# gradients and optimizer state, what it saves for backward), and what the allocator holds
# beyond them (cuDNN's and cuBLAS's workspaces, the CUDA graph's pool): measured on an
# H200 (the module's docstring). Which part is which is measured next (the placement
# section's three peaks in benchmarks/gpu.py).
STEP_PEAK = 2
WORKSPACE_BYTES = 512 * 2**20
# Of the free memory, what trials may plan on: the caching allocator's fragmentation,
# cuDNN's algorithm workspaces and the evaluation's batches take the rest.
HEADROOM = 0.8
# More trials a GPU than this gained nothing where it was measured (benchmarks/gpu.py's
# workers section, benchmarks/RESULTS.md): the GPU's time is shared, not multiplied, and
# each process costs a context.
MAX_PER_GPU = 8
_PARTS = ("weights", "activations", "data", "workspace", "context")
# Optimizer state per parameter: SGD's momentum, AdamW's two moments.
_STATES = {"sgd": 1, "adamw": 2}


@dataclass(frozen=True)
class Need:
    """What one trial holds on its GPU, in bytes."""

    weights: int  # parameters, gradients and the optimizer's state
    activations: int  # what a training step saves for backward, at the trial's batch
    data: int = 0  # training images resident on the GPU
    workspace: int = WORKSPACE_BYTES  # the allocator's beyond the step's tensors
    context: int = CONTEXT_BYTES
    batch: int = 0

    def __post_init__(self) -> None:
        checks = [(name, whole(0), "a whole number of bytes >= 0") for name in _PARTS]
        check_fields("Need", self, [*checks, ("batch", whole(0), "a whole number >= 0")])

    @property
    def total(self) -> int:
        """The allocator's peak over a training step (see :data:`STEP_PEAK`) and the
        process's CUDA context."""
        step = STEP_PEAK * (self.weights + self.activations) + self.data
        return step + self.workspace + self.context

    def describe(self) -> str:
        at = f" at batch {self.batch}" if self.batch else ""
        return (
            f"{self.total / GiB:.2f} GiB (context {self.context / GiB:.2f}, workspaces "
            f"{self.workspace / GiB:.2f}, {STEP_PEAK} x (weights and optimizer "
            f"{self.weights / GiB:.3f}, activations {self.activations / GiB:.3f}{at}), "
            f"images {self.data / GiB:.3f})"
        )

    @staticmethod
    def largest(needs: Sequence[Need]) -> Need:
        if not needs:
            raise ConfigError("no candidate to size: Need.largest needs at least one")
        return max(needs, key=lambda n: n.total)


def step_need(
    model: nn.Module,
    input_shape: Sequence[int],
    *,
    batch: int,
    optimizer: str = "sgd",
    precision: str = "fp32",
    data_bytes: int = 0,
) -> Need:
    """What training ``model`` on inputs of ``input_shape`` (C, H, W) at ``batch``
    holds on a GPU: its weights, gradients and ``optimizer`` state in fp32, and the
    tensors one training step saves for backward, measured at a batch of two on the CPU
    (each counted once, however many operations save it), scaled to ``batch`` and
    halved in bf16 / fp16. The model is left as it was (mode, weights' device)."""
    if optimizer not in _STATES:
        raise ConfigError(f"unknown optimizer {optimizer!r}; use one of {', '.join(_STATES)}")
    require(whole(1)(batch), "batch", batch, "a whole number >= 1")
    params = [p for p in model.parameters() if p.requires_grad]
    weights = sum(p.numel() * 4 for p in params) * (2 + _STATES[optimizer])
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    probe = 2
    seen: dict[int, int] = {}
    held: list[torch.Tensor] = []  # keeps the ids of what was counted from being reused

    # The weights a layer saves for its backward are counted once, above, not per image.
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in own:
            held.append(t)
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t

    was_training = model.training
    # The probe's forward moves batch norm's running statistics: they are put back.
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        model.train()
        x = torch.zeros(probe, *input_shape, device=device)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
            if out.dim() == 2:  # a classifier's logits: what its loss saves too
                out = F.cross_entropy(out, torch.zeros(len(out), dtype=torch.long, device=device))
        del out
    finally:
        model.train(was_training)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        held.clear()
    activations = sum(seen.values()) * batch // probe
    if precision in ("bf16", "fp16"):
        activations //= 2
    return Need(weights=weights, activations=activations, data=data_bytes, batch=batch)


def per_gpu(need: Need, free: int, *, cap: int = MAX_PER_GPU) -> int:
    """How many trials of ``need`` share a GPU with ``free`` bytes free: as many as
    :data:`HEADROOM` of it holds, at least one, at most ``cap``."""
    require(whole(0)(free), "free memory", free, "a whole number of bytes >= 0")
    return max(1, min(cap, int(free * HEADROOM) // max(1, need.total)))


def assign(
    n_workers: int,
    free: Sequence[int],
    need: Callable[[], Need],
    *,
    per_gpu_override: int | None = None,
) -> list[int | None]:
    """The GPU of each of ``n_workers`` workers, spread evenly over the GPUs whose free
    memory is ``free`` (bytes each; none: every worker ``None``, on the CPU). ``need``
    is asked only where workers share a GPU. More workers than fit (the rule's
    :func:`per_gpu`, or ``per_gpu_override``) is refused, saying how many fit."""
    if not free:
        return [None] * n_workers
    gpus = len(free)
    sharing = math.ceil(n_workers / gpus)
    if per_gpu_override is not None:
        require(whole(1)(per_gpu_override), "per_gpu", per_gpu_override, "a whole number >= 1")
        if sharing > per_gpu_override:
            raise ConfigError(
                f"{n_workers} workers on {gpus} GPU(s) put {sharing} on one, but per_gpu is "
                f"{per_gpu_override}; use n_workers <= {gpus * per_gpu_override} or raise per_gpu"
            )
    elif sharing > 1:
        sized = need()
        fits = min(per_gpu(sized, f) for f in free)
        if sharing > fits:
            tightest = min(free)
            raise ConfigError(
                f"{n_workers} workers on {gpus} GPU(s) put {sharing} on one, but only {fits} "
                f"fit: a trial needs {sized.describe()} and the fullest GPU has "
                f"{tightest / GiB:.1f} GiB free ({HEADROOM:.0%} of it planned on; at most "
                f"{MAX_PER_GPU} a GPU); use n_workers <= {gpus * fits}, or set per_gpu on "
                "the executor to place more anyway"
            )
    return [i % gpus for i in range(n_workers)]
