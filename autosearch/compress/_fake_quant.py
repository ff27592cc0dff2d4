"""int8 accuracy estimated in eager mode: simulated (fake) quantization of the float
network, without exporting or lowering it.

It simulates what :mod:`autosearch.compress._quantize` lowers for real, with the same
observers as torchao's ``X86InductorQuantizer``: every convolution's and linear
layer's weight is rounded to int8 per output channel (symmetric, PerChannelMinMax),
and its input to uint8 per tensor (affine, a HistogramObserver calibrated on the same
training images; 7 bits without VNNI), as is the input of every block (so that a
block's convolutions and its shortcut read the same rounded tensor, as in the
program). Batch norm is not folded first: per-channel symmetric rounding of a weight
scaled per output channel (the fold) gives the same grid scaled, so the rounding is the
same. What is not simulated (the order of the program's fused int8 arithmetic and
requantization, pooling's shared ranges) is why this is an estimate;
``benchmarks/scoring.py`` measures it against the real program.
"""

from __future__ import annotations

import copy
import functools
import itertools
import warnings
import weakref
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.nn as nn

from autosearch.compress._quantize import _calibration, has_vnni
from autosearch.compress.variants import Compression, Derived
from autosearch.data import Dataset

__all__ = ["estimate_int8", "int8_bytes"]

_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
_HEADER_PER_LAYER = 250


def _observer(reduce_range: bool) -> Any:
    """torchao's HistogramObserver as the real path configures it, with its range
    search (a loop of up to 10⁵ steps that indexes a tensor at each) run on a list of
    floats, its quantization errors computed for several steps at once
    (:func:`quantization_errors`): the same steps and result, without a tensor access
    per step; and its first histogram counted by :func:`histogram` (the same counts as
    ``torch.histc``)."""
    return _observer_class()(
        dtype=torch.uint8, quant_min=0, quant_max=127 if reduce_range else 255, eps=2**-12
    )


@functools.cache
def _observer_class() -> type:
    from torchao.quantization.pt2e.observer import HistogramObserver

    class Observer(HistogramObserver):
        def reset_histogram(
            self, x: torch.Tensor, min_val: torch.Tensor, max_val: torch.Tensor
        ) -> None:
            counts = histogram(x, self.bins, min_val, max_val)
            if counts is None:
                super().reset_histogram(x, min_val, max_val)
                return
            self.min_val.resize_(min_val.shape).copy_(min_val)
            self.max_val.resize_(max_val.shape).copy_(max_val)
            self.histogram.detach_().resize_(counts.shape).copy_(counts)

        def _non_linear_param_search(self) -> tuple[torch.Tensor, torch.Tensor]:
            bin_width = (self.max_val - self.min_val) / self.bins
            total = torch.sum(self.histogram).item()
            cumulative = torch.cumsum(self.histogram, dim=0).tolist()
            start_bin, end_bin = _searched(self, _search_path(cumulative, total, self.bins))
            return self.min_val + bin_width * start_bin, self.min_val + bin_width * (end_bin + 1)

    return Observer


def _search_path(cumulative: list[float], total: float, bins: int) -> Iterator[tuple[int, int]]:
    """The (start, end) bins torchao's range search tries, in its order, each taken as
    accepted (the search stops at the first whose error is larger than the last's, so
    the steps before it are the same): alpha and beta moved 1e-5 a step toward each
    other, the side that moves more bins moved, steps that move no bin skipped."""
    alpha, beta, start_bin, end_bin = 0.0, 1.0, 0, bins - 1
    while alpha < beta:
        next_alpha, next_beta = alpha + 1e-5, beta - 1e-5
        left, right = start_bin, end_bin
        while left < end_bin and cumulative[left] < next_alpha * total:
            left += 1
        while right > start_bin and cumulative[right] > next_beta * total:
            right -= 1
        next_start, next_end = start_bin, end_bin
        if (left - start_bin) > (end_bin - right):
            next_start, alpha = left, next_alpha
        else:
            next_end, beta = right, next_beta
        if next_start == start_bin and next_end == end_bin:
            continue
        yield next_start, next_end
        start_bin, end_bin = next_start, next_end


def _searched(observer: Any, steps: Iterator[tuple[int, int]]) -> tuple[int, int]:
    """The search's last step before its quantization error grows (torchao's result),
    the errors computed 8 steps at a time, then 16, 32, ...: most searches stop within
    the first 8."""
    norm_min, best, size = float("inf"), (0, observer.bins - 1), 8
    while chunk := list(itertools.islice(steps, size)):
        for step, norm in zip(chunk, quantization_errors(observer, chunk), strict=True):
            if norm > norm_min:
                return best
            norm_min, best = norm, step
        size *= 2
    return best


def quantization_errors(observer: Any, steps: list[tuple[int, int]]) -> list[float]:
    """torchao's ``HistogramObserver._compute_quantization_error(start, end)`` for each
    of ``steps`` at once: the same float32 operations on each element, in the same order
    (a row per step, the same scalars rounded to float32 as torch rounds them), and each
    row summed alone as torch sums the one row: the same errors to the bit, one batch
    of tensor operations instead of one per step."""
    bins, dst_bins = observer.bins, observer.dst_nbins
    bin_width = (observer.max_val.item() - observer.min_val.item()) / bins
    widths = [bin_width * (end - start + 1) / dst_bins for start, end in steps]
    errors = [0.0] * len(steps)  # torchao's answer for an empty destination bin
    rows = [i for i, width in enumerate(widths) if width != 0.0]
    if not rows:
        return errors
    device = observer.histogram.device

    def column(values: list[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)[:, None]

    width = column([widths[i] for i in rows])
    half, minus_half = column([widths[i] / 2 for i in rows]), column([-widths[i] / 2 for i in rows])
    start = column([steps[i][0] for i in rows], torch.int64)
    src_bin = torch.arange(bins, device=device)
    src_bin_begin = (src_bin - start) * bin_width
    src_bin_end = src_bin_begin + bin_width
    top = dst_bins - 1
    dst_bin_of_begin = torch.clamp(torch.div(src_bin_begin, width, rounding_mode="floor"), 0, top)
    dst_bin_of_begin_center = (dst_bin_of_begin + 0.5) * width
    dst_bin_of_end = torch.clamp(torch.div(src_bin_end, width, rounding_mode="floor"), 0, top)
    density = observer.histogram / bin_width

    def norm(begin: torch.Tensor, end: torch.Tensor) -> torch.Tensor:  # torchao's _get_norm
        return density * ((end * end * end - begin * begin * begin) / 3)

    total = torch.zeros(len(rows), bins, device=device)
    total += norm(src_bin_begin - dst_bin_of_begin_center, torch.ones(bins, device=device) * half)
    total += (dst_bin_of_end - dst_bin_of_begin - 1) * norm(minus_half, half)
    total += norm(minus_half, src_bin_end - (dst_bin_of_end * width + half))
    for i, row in zip(rows, total, strict=True):
        errors[i] = row.sum().item()
    return errors


def histogram(
    x: torch.Tensor, bins: int, low: torch.Tensor, high: torch.Tensor
) -> torch.Tensor | None:
    """``torch.histc(x, bins, low, high)`` for a float32 CPU tensor whose values all lie
    in ``[low, high]`` (its own minimum and maximum, as an observer's first histogram
    takes them), counted as histc's CPU kernel bins each value — ``int((v - low) *
    bins / (high - low))`` in float32, the top edge in the last bin — with
    ``bincount``: the same counts, about 2.5 times faster, and the histogram was most
    of an int8 estimate's time. None where it would not be the same: another device
    or dtype, an empty range, or 2**24 values or more (histc adds its counts in float32,
    which stop counting there)."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.numel() >= 2**24:
        return None
    low, high = low.to(torch.float32), high.to(torch.float32)
    if not (torch.isfinite(low) and torch.isfinite(high) and low < high):
        return None
    index = ((x - low) * bins / (high - low)).to(torch.int64).clamp_(0, bins - 1)
    return torch.bincount(index.reshape(-1), minlength=bins).to(torch.float32)


class _Seen:
    """Tensors the hooks of one estimate have already seen, by identity and version
    (weak references: nothing is kept alive, and a tensor changed in place since is
    not the one seen)."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref, int, Any]] = {}

    def get(self, x: torch.Tensor) -> Any:
        item = self._items.get(id(x))
        if item is None or item[0]() is not x or item[1] != x._version:
            return None
        return item[2]

    def put(self, x: torch.Tensor, value: Any) -> None:
        if len(self._items) > 4096:  # forget the tensors gone since
            self._items = {k: v for k, v in self._items.items() if v[0]() is not None}
        self._items[id(x)] = (weakref.ref(x), x._version, value)


class _InputQuant:
    """A forward pre-hook: observes a layer's inputs while calibrating, then rounds
    them to the observed uint8 grid.

    A block's input is also its first convolution's (and its shortcut's): the hooks of
    one estimate share what they have ``seen``, so that such a tensor is observed once
    and, once rounded, not rounded again by a hook of the same grid. The result is the
    same as observing and rounding it at every hook: a hook whose first input another
    hook observed as its only input so far follows that hook (the same histogram, the
    same grid) until either sees another tensor, when it takes a copy of the histogram;
    rounding onto a grid is idempotent (the values come back exactly)."""

    def __init__(self, reduce_range: bool, seen: _Seen) -> None:
        self.reduce_range = reduce_range
        self._observer: Any = None  # made when first needed: most hooks follow another
        self.scale: float | None = None
        self.zero_point = 0
        self.quant_max = 127 if reduce_range else 255
        self.seen = seen
        self.observed = 0  # tensors observed by this hook's own observer
        self.leader: _InputQuant | None = None  # whose histogram this one shares
        self.followers: list[_InputQuant] = []

    @property
    def observer(self) -> Any:
        if self._observer is None:
            self._observer = _observer(self.reduce_range)
        return self._observer

    @observer.setter
    def observer(self, value: Any) -> None:
        self._observer = value

    def __call__(self, module: nn.Module, inputs: tuple) -> tuple | None:
        x = inputs[0]
        if self.scale is None:
            self._observe(x)
            return None
        if self.seen.get(x) == (self.scale, self.zero_point, self.quant_max):
            return None  # already on this grid
        out = fake_quantize(x, self.scale, self.zero_point, self.quant_max)
        self.seen.put(out, (self.scale, self.zero_point, self.quant_max))
        return (out, *inputs[1:])

    def _observe(self, x: torch.Tensor) -> None:
        first = self.seen.get(x)
        if (
            self.leader is None
            and not self.observed
            and isinstance(first, _InputQuant)
            and first.observed == 1
        ):
            self.leader = first  # the same tensor, the leader's only one: the same histogram
            first.followers.append(self)
            return
        if self.leader is not None:  # a second tensor: from here on, a histogram of its own
            self.leader.followers.remove(self)
            self.observer, self.observed = copy.deepcopy(self.leader.observer), 1
            self.leader = None
        for follower in self.followers:  # they keep the histogram as it is now
            follower.observer, follower.observed = copy.deepcopy(self.observer), 1
            follower.leader = None
        self.followers = []
        # torchao's observer where the tensor is: on a GPU its range and histogram are
        # taken there (torch.histc bins as on the CPU), not the activations copied back
        if self._observer is None and x.device.type != "cpu":
            self._observer = _observer(self.reduce_range).to(x.device)
        self.observer(x.detach())
        self.observed += 1
        self.seen.put(x, self)

    def freeze(self) -> None:
        if self.leader is not None and self.leader.scale is not None:
            self.scale, self.zero_point = self.leader.scale, self.leader.zero_point
            return
        source = self.leader or self
        # the range search on the CPU, as the real path runs it (its histogram, 2,048
        # counts, copied back from a GPU)
        scale, zero_point = source.observer.cpu().calculate_qparams()
        self.scale, self.zero_point = float(scale), int(zero_point)


def fake_quantize(x: torch.Tensor, scale: float, zero_point: int, quant_max: int) -> torch.Tensor:
    """``torch.fake_quantize_per_tensor_affine(x, scale, zero_point, 0, quant_max)``,
    computed as its kernel computes it (float32: ``x`` times the float32 reciprocal of
    the scale, rounded half to even, shifted, clamped, scaled back) in five in-place
    passes: the same values, about fifteen times faster on a CPU than the fused op,
    which is what an estimate's evaluation spent most of its time in."""
    inverse = float(1.0 / torch.tensor(scale, dtype=torch.float32))
    out = x.mul(inverse).round_().add_(zero_point).clamp_(0, quant_max)
    return out.sub_(zero_point).mul_(scale)


def _round_weight(layer: nn.Module) -> None:
    w = cast(torch.Tensor, layer.weight).data
    flat = w.reshape(w.shape[0], -1).abs().amax(dim=1)
    scale = torch.clamp(flat / 127.5, min=2**-12)  # symmetric int8 [-128, 127], as the observer
    zero = torch.zeros(w.shape[0], dtype=torch.int32, device=w.device)
    layer.weight.data = torch.fake_quantize_per_channel_affine(w, scale, zero, 0, -128, 127)


def int8_bytes(model: nn.Module) -> int:
    """Bytes of a network's int8 program as :mod:`_quantize` saves it, computed: int8
    weights with a float scale and an int64 zero point per output channel, float
    biases (batch norm folded in: one per output channel), other tensors as floats,
    and the file's header (its names and shapes: about 250 bytes a layer)."""
    total = 0
    for module in model.modules():
        if isinstance(module, _LAYERS):
            out = module.weight.shape[0]
            total += module.weight.numel() + out * (4 + 8) + out * 4 + _HEADER_PER_LAYER
        elif next(module.children(), None) is None and not isinstance(
            module, nn.modules.batchnorm._BatchNorm
        ):
            total += sum(4 * p.numel() for p in module.parameters(recurse=False))
    return total


def _copy(root: nn.Module) -> nn.Module:
    """``copy.deepcopy(root)`` for a tree of modules, made directly: each module a new
    object of its class with its own parameters and buffers (copies, on their device),
    its own child modules and its own containers (hooks, names), other attributes as
    they are (an estimate changes none of them). Shared modules and tensors stay shared
    within the copy. Several times faster than ``deepcopy``, which walks every attribute
    of every module."""
    memo: dict[int, Any] = {}

    def tensor(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        if id(t) not in memo:
            data = t.detach().clone()
            if isinstance(t, nn.Parameter):
                data = nn.Parameter(data, requires_grad=t.requires_grad)
            memo[id(t)] = data
        return cast(torch.Tensor, memo[id(t)])

    def module(m: nn.Module) -> nn.Module:
        if id(m) in memo:
            return cast(nn.Module, memo[id(m)])
        new = m.__class__.__new__(m.__class__)
        memo[id(m)] = new
        state = {
            key: value.copy() if isinstance(value, dict | list | set) else value
            for key, value in vars(m).items()
        }
        state["_parameters"] = {k: tensor(v) for k, v in m._parameters.items()}
        state["_buffers"] = {k: tensor(v) for k, v in m._buffers.items()}
        state["_modules"] = {k: None if c is None else module(c) for k, c in m._modules.items()}
        object.__setattr__(new, "__dict__", state)
        return new

    return module(root)


def _holds_layers(module: nn.Module) -> bool:
    """A block or stage: a container with convolutions or linear layers inside. Its
    input is rounded once for every branch that reads it (the convolution and the
    shortcut), as the lowered program passes one int8 tensor between blocks."""
    return next(module.children(), None) is not None and any(
        isinstance(m, _LAYERS) for m in module.modules()
    )


@torch.no_grad()
def estimate_int8(
    parent: nn.Module, data: Dataset, compression: Compression, *, seed: int
) -> Derived:
    """The int8 variant simulated on ``parent``'s float weights (left unchanged), on
    the device ``parent`` is on (a subnet evaluated on a GPU is estimated there)."""
    model = _copy(parent).eval()
    device = next(model.parameters(), torch.empty(0)).device
    reduce_range = not has_vnni()
    seen = _Seen()
    quants = []
    for layer in model.modules():
        if isinstance(layer, _LAYERS) or (layer is not model and _holds_layers(layer)):
            quant = _InputQuant(reduce_range, seen)
            quants.append(quant)
            layer.register_forward_pre_hook(quant)
    calibration = _calibration(data, compression.calibration_images, seed).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(calibration)  # one pass: one histogram per input, none to merge
        for quant in quants:
            quant.freeze()
    for layer in model.modules():
        if isinstance(layer, _LAYERS):
            _round_weight(layer)
    return Derived(
        model=model,
        float_model=parent,
        weight_bits=8,
        activation_bits=8,
        saved_bytes=int8_bytes(parent),
        details={"reduce_range": float(reduce_range)},
        estimated=True,
    )
