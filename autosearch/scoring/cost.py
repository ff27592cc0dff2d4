"""What a network costs.

Conventions (state them wherever a number is shown):

* **FLOPs** = 2 × MACs of convolutions and linear layers, as counted by
  ``torch.utils.flop_counter.FlopCounterMode`` for one image (batch 1). Batch norm,
  activations, pooling and additions are not counted. Depthwise and grouped
  convolutions are counted exactly.
* **MACs** = multiply-accumulates = FLOPs / 2. Published CIFAR / ImageNet figures
  are MACs (ResNet-20: 40.8 M MACs).
* **params** = number of elements of every parameter (buffers such as batch-norm
  running statistics are not counted).
* **sparse MACs** = each conv/linear layer's MACs × the density (share of non-zero
  weights) of its weight: what a sparse kernel would have to compute.
* **BOPs** (bit-operations) = MACs × weight bits × activation bits (32 × 32 for fp32,
  8 × 8 for int8), as in the mixed-precision NAS literature.
* **bytes** = size of the weights as saved: a safetensors file of the state dict for
  float models (zeros of unstructured pruning are stored, so it does not shrink),
  ``torch.export.save`` of the quantized program for int8.
* **latency** = median wall time of one forward pass per image, in milliseconds, on
  one CPU thread (or the model's GPU), after warm-up: at batch 1 (``latency``) and in
  batches of 32 (``latency_batched``).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from autosearch.errors import ConfigError

__all__ = [
    "CONVENTIONS",
    "Cost",
    "Tally",
    "check_threads",
    "cpu_threads",
    "latency",
    "layer_macs",
    "measure",
    "safetensors_size",
    "saved_bytes",
    "seconds_per_call",
    "sparse_macs",
]

CONVENTIONS = (
    "FLOPs = 2 x MACs of conv/linear layers for one image (FlopCounterMode); batch norm, "
    "activations and pooling not counted; params = parameter elements; sparse MACs = "
    "layer MACs x weight density; BOPs = MACs x weight bits x activation bits; bytes = "
    "weights as saved; latency = median ms per image on one CPU thread, batch 1 and 32."
)


@dataclass(frozen=True, kw_only=True)
class Cost:
    flops: int
    macs: int
    params: int


def _count(model: nn.Module, input_shape: Sequence[int]) -> FlopCounterMode:
    """One forward pass of a single image in eval mode (the mode is restored after),
    under a FLOP counter."""
    was_training = model.training
    model.eval()
    # A model built under torch.device("meta") is counted without memory or compute.
    device = next(model.parameters(), torch.empty(0)).device
    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), counter:
            model(torch.zeros(1, *input_shape, device=device))
    finally:
        model.train(was_training)
    return counter


def measure(model: nn.Module, input_shape: Sequence[int]) -> Cost:
    """Count FLOPs, MACs and parameters of ``model`` for one ``(C, H, W)`` image.

    The model runs one forward pass in eval mode (its mode is restored after).
    """
    flops = int(_count(model, input_shape).get_total_flops())
    params = sum(p.numel() for p in model.parameters())
    return Cost(flops=flops, macs=flops // 2, params=params)


def layer_macs(model: nn.Module, input_shape: Sequence[int]) -> dict[str, int]:
    """MACs of each convolution and linear layer (by module name) for one image,
    as counted by FlopCounterMode; a layer called twice counts twice."""
    counts = _count(model, input_shape).get_flop_counts()
    root = type(model).__name__
    return {
        name: int(sum(counts[f"{root}.{name}"].values())) // 2
        for name, module in model.named_modules()
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear))
        and f"{root}.{name}" in counts
    }


def sparse_macs(model: nn.Module, input_shape: Sequence[int]) -> int:
    """Sparse-effective MACs: each layer's MACs × the share of its weights that are
    non-zero (pruning masks applied through ``torch.nn.utils.prune`` count)."""
    modules = dict(model.named_modules())
    total = 0.0
    for name, macs in layer_macs(model, input_shape).items():
        weight = modules[name].weight
        total += macs * float((weight != 0).sum()) / weight.numel()
    return round(total)


def saved_bytes(model: nn.Module) -> int:
    """Bytes of the model's state dict saved as safetensors (float weights, dense),
    computed from the names, dtypes and shapes, not written: a file is an 8-byte length,
    a JSON header padded with spaces to a multiple of 8 bytes, then the tensors' data,
    in the order the library writes them (tests/test_estimates.py checks the figure
    against ``safetensors.torch.save`` byte for byte). A subnet on a GPU is not copied
    back to count it."""
    return safetensors_size(model.state_dict())


def safetensors_size(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes of ``tensors`` saved by ``safetensors.torch.save`` (see :func:`saved_bytes`)."""
    rank, names = _safetensors_order()
    try:
        ordered = sorted(tensors.items(), key=lambda kv: (-rank[kv[1].dtype], kv[0]))
    except KeyError as exc:
        raise ValueError(f"safetensors cannot save a tensor of dtype {exc}") from None
    header, offset = {}, 0
    for name, tensor in ordered:
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": names[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = len(json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode())
    return 8 + -(-text // 8) * 8 + offset


@functools.cache
def _safetensors_order() -> tuple[dict[torch.dtype, int], dict[torch.dtype, str]]:
    """For each dtype safetensors saves: its rank in the file's order (the library
    writes larger ranks first, then by name) and its name in the header, read once from
    the library itself (a file of one small tensor of each dtype)."""
    from safetensors.torch import save  # a light, pure dependency; imported on use

    dtypes = []
    for dtype in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn,
        torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64,
    ):  # fmt: skip
        try:
            save({"t": torch.zeros(1, dtype=dtype)})
        except Exception:  # a dtype this version of the library does not save
            continue
        dtypes.append(dtype)
    saved = save({f"t{i}": torch.zeros(1, dtype=d) for i, d in enumerate(dtypes)})
    length = int.from_bytes(saved[:8], "little")
    header = json.loads(saved[8 : 8 + length])
    header.pop("__metadata__", None)
    order = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    rank = {dtypes[int(k[1:])]: len(order) - i for i, k in enumerate(order)}
    names = {dtypes[int(k[1:])]: str(header[k]["dtype"]) for k in order}
    return rank, names


@contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """torch runs on ``n`` CPU threads inside the block (as it ran before, after).

    Raises:
        ValueError: ``n`` is not a whole number from 1 to this machine's CPU count (a
            count read from a file never reaches torch's thread pool unchecked).
    """
    check_threads(n)
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_threads(n: object) -> int:
    """``n`` as a thread count: a whole number from 1 to this machine's CPU count.

    Raises:
        ValueError: saying what was given and what is allowed.
    """
    most = os.cpu_count() or 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= most:
        raise ValueError(
            f"a thread count must be a whole number from 1 to this machine's {most} CPUs, got {n!r}"
        )
    return n


@torch.no_grad()
def latency(
    model: nn.Module,
    input_shape: Sequence[int],
    *,
    batch: int = 1,
    threads: int = 1,
    warmup: int = 3,
    repeats: int = 7,
    min_seconds: float | None = None,
    device: torch.device | str | None = None,
) -> float:
    """Median milliseconds per image of a forward pass of ``batch`` images.

    Runs on ``device`` (default: where the model's parameters are, else CPU); on the
    CPU with ``threads`` threads (1 by default: what an edge core sees, and steadier on
    a shared machine). After ``warmup`` calls, each of ``repeats`` samples times enough
    calls to last ``min_seconds`` (default ``$AUTOSEARCH_LATENCY_SAMPLE_SECONDS``, else
    0.05); the median of the samples is returned.

    Raises:
        ConfigError: ``$AUTOSEARCH_LATENCY_SAMPLE_SECONDS`` is not a number of seconds > 0.
    """
    if min_seconds is None:
        min_seconds = sample_seconds()
    if device is None:
        device = next(model.parameters(), torch.empty(0)).device
    device = torch.device(device)
    x = torch.randn(batch, *input_shape, device=device)
    was_training = model.training
    model.eval()  # in training mode the random inputs would move batch-norm statistics
    try:
        with cpu_threads(threads if device.type == "cpu" else torch.get_num_threads()):
            samples = seconds_per_call(
                lambda: model(x), warmup=warmup, repeats=repeats, min_seconds=min_seconds
            )
    finally:
        model.train(was_training)
    return statistics.median(samples) * 1e3 / batch


def sample_seconds() -> float:
    """How long each latency sample lasts: ``$AUTOSEARCH_LATENCY_SAMPLE_SECONDS``, else
    0.05 s (seven samples a measurement: shorter is quicker and noisier)."""
    raw = os.environ.get("AUTOSEARCH_LATENCY_SAMPLE_SECONDS", "").strip()
    if not raw:
        return 0.05
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"AUTOSEARCH_LATENCY_SAMPLE_SECONDS={raw!r}: expected seconds > 0 (0.05 by default)"
        )
    return value


def seconds_per_call(
    run: Callable[[], object], *, warmup: int = 2, repeats: int = 5, min_seconds: float = 0.002
) -> list[float]:
    """Seconds per call of ``run``: after ``warmup`` calls, ``repeats`` samples, each
    timing enough calls to last ``min_seconds``. Timed by ``torch.utils.benchmark``'s
    Timer, which synchronizes an accelerator around each sample; at this thread's
    number of torch threads (the Timer's default would be one)."""
    from torch.utils.benchmark import Timer

    timer = Timer(stmt="run()", globals={"run": run}, num_threads=torch.get_num_threads())
    first = timer.timeit(max(warmup, 1)).mean  # the warm-up, which sizes the samples
    calls = max(1, int(min_seconds / max(first, 1e-7)))
    return [timer.timeit(calls).mean for _ in range(repeats)]


@dataclass(kw_only=True)
class Tally:
    """An analytic cost model: MACs and parameters counted layer by layer while
    tracking the feature map's shape, in microseconds instead of a forward pass.

    Spaces use it to check budgets before building anything; their tests check it
    against :func:`measure` (FlopCounterMode). Batch-norm parameters are counted,
    their (and activations', pooling's) operations are not, as in :func:`measure`.

    Example:
        >>> t = Tally(channels=3, height=32, width=32)
        >>> t.conv(16, 3).linear_head(10).cost().macs
        442528
    """

    channels: int
    height: int
    width: int
    macs: int = 0
    params: int = 0

    def conv(
        self,
        c_out: int,
        kernel: int,
        stride: int = 1,
        *,
        groups: int = 1,
        padding: int | None = None,
        bias: bool = False,
        bn: bool = True,
    ) -> Tally:
        """A Conv2d (padding ``kernel // 2`` by default), optionally followed by BN."""
        pad = kernel // 2 if padding is None else padding
        self.height = (self.height + 2 * pad - kernel) // stride + 1
        self.width = (self.width + 2 * pad - kernel) // stride + 1
        weights = c_out * (self.channels // groups) * kernel * kernel
        self.macs += weights * self.height * self.width
        self.params += weights + (c_out if bias else 0) + (2 * c_out if bn else 0)
        self.channels = c_out
        return self

    def bn(self) -> Tally:
        self.params += 2 * self.channels
        return self

    def pool(self, kernel: int, stride: int, padding: int = 0) -> Tally:
        self.height = (self.height + 2 * padding - kernel) // stride + 1
        self.width = (self.width + 2 * padding - kernel) // stride + 1
        return self

    def linear(self, out: int, *, bias: bool = True) -> Tally:
        """A linear layer on a flat vector of ``channels`` features."""
        self.macs += self.channels * out
        self.params += self.channels * out + (out if bias else 0)
        self.channels = out
        return self

    def linear_head(self, num_classes: int) -> Tally:
        """Global average pooling, then a linear classifier."""
        self.height = self.width = 1
        return self.linear(num_classes)

    def fork(self) -> Tally:
        """A branch from the current feature map (a shortcut, an SE block, a cell edge)."""
        branch = copy.copy(self)
        branch.macs = branch.params = 0
        return branch

    def join(self, *branches: Tally) -> Tally:
        """Add the branches' costs; the feature map becomes the first branch's."""
        for b in branches:
            self.macs += b.macs
            self.params += b.params
        if branches:
            self.channels, self.height, self.width = (
                branches[0].channels,
                branches[0].height,
                branches[0].width,
            )
        return self

    @classmethod
    def of(cls, input_shape: Sequence[int]) -> Tally:
        """A tally starting from ``(C, H, W)`` images."""
        channels, height, width = input_shape
        return cls(channels=channels, height=height, width=width)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.channels, self.height, self.width)

    def cost(self) -> Cost:
        return Cost(flops=2 * self.macs, macs=self.macs, params=self.params)
