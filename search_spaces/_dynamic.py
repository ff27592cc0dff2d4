"""Layers whose active size is chosen per forward, for weight-sharing supernets.

A subnet uses the first channels of every weight, batch-norm statistic and head row,
and the centred crop of the largest kernel (Once-for-All, Cai et al. 2020; BigNAS, Yu
et al. 2020). :func:`copy_slices` copies those slices into an ordinary layer of the
subnet's own network, so that the subnet becomes a plain network of its space.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["DynamicBatchNorm2d", "DynamicConv2d", "DynamicLinear", "copy_slices"]


class DynamicConv2d(nn.Module):
    """A convolution of at most ``c_out`` × ``c_in`` channels and ``kernel`` size;
    ``forward(x, c_out, kernel)`` uses the first ``c_out`` filters over the input's
    channels and the centred ``kernel`` crop. ``depthwise``: one filter per input
    channel (``c_out`` is then the input's channels). ``transforms``: OFA's learned
    kernel transformations, a matrix per smaller kernel applied to the crop."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        kernel: int,
        stride: int = 1,
        *,
        depthwise: bool = False,
        bias: bool = False,
        kernels: tuple[int, ...] = (),
        transforms: bool = False,
    ) -> None:
        super().__init__()
        self.stride, self.depthwise, self.kernel = stride, depthwise, kernel
        shape = (c_out, 1 if depthwise else c_in, kernel, kernel)
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.zeros(c_out)) if bias else None
        nn.init.kaiming_normal_(self.weight, mode="fan_out", nonlinearity="relu")
        # OFA: k×k kernels from the (K)×(K) one through a learned k²×k² matrix, initialised
        # as the identity (a plain centred crop), one per smaller kernel size.
        self.transforms = nn.ParameterDict(
            {str(k): nn.Parameter(torch.eye(k * k)) for k in kernels if transforms and k < kernel}
        )

    def kernel_weight(self, kernel: int) -> torch.Tensor:
        """The weight at ``kernel`` size: the centred crop, transformed where learned."""
        if kernel == self.kernel:
            return self.weight
        start = (self.kernel - kernel) // 2
        crop = self.weight[:, :, start : start + kernel, start : start + kernel]
        transform = self.transforms[str(kernel)] if str(kernel) in self.transforms else None
        if transform is None:
            return crop
        flat = crop.reshape(-1, kernel * kernel) @ transform
        return flat.reshape(crop.shape)

    def forward(self, x: torch.Tensor, c_out: int | None = None, kernel: int | None = None):
        c_in = x.shape[1]
        kernel = kernel or self.kernel
        weight = self.kernel_weight(kernel)
        if self.depthwise:
            weight, groups = weight[:c_in], c_in
            bias = self.bias[:c_in] if self.bias is not None else None
        else:
            c_out = c_out or weight.shape[0]
            weight, groups = weight[:c_out, :c_in], 1
            bias = self.bias[:c_out] if self.bias is not None else None
        return F.conv2d(x, weight, bias, self.stride, kernel // 2, groups=groups)

    def sliced(self, target: nn.Conv2d) -> dict[str, torch.Tensor]:
        """The slices an ordinary conv of ``target``'s shape takes over."""
        c_out, c_in, kernel, _ = target.weight.shape
        weight = self.kernel_weight(kernel)[:c_out, :c_in]
        state = {"weight": weight}
        if target.bias is not None:
            assert self.bias is not None, "the subnet's conv has a bias the supernet lacks"
            state["bias"] = self.bias[:c_out]
        return state


class DynamicBatchNorm2d(nn.BatchNorm2d):
    """Batch norm over the input's (first) channels: statistics and affine weights are
    sliced; training updates the slices of the running statistics in place."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        if c == self.num_features:
            return super().forward(x)
        momentum = self.momentum if self.momentum is not None else 0.0
        if self.training and self.track_running_stats:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative average, as nn.BatchNorm2d does
                momentum = 1.0 / float(self.num_batches_tracked)
        use_batch = self.training or self.running_mean is None
        return F.batch_norm(
            x,
            self.running_mean[:c] if self.running_mean is not None else None,
            self.running_var[:c] if self.running_var is not None else None,
            self.weight[:c],
            self.bias[:c],
            use_batch,
            momentum,
            self.eps,
        )

    def sliced(self, target: nn.BatchNorm2d) -> dict[str, torch.Tensor]:
        c = target.num_features
        assert self.running_mean is not None and self.running_var is not None
        assert self.num_batches_tracked is not None
        return {
            "weight": self.weight[:c],
            "bias": self.bias[:c],
            "running_mean": self.running_mean[:c],
            "running_var": self.running_var[:c],
            "num_batches_tracked": self.num_batches_tracked,
        }


class DynamicLinear(nn.Linear):
    """A linear layer over the input's (first) features."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight[:, : x.shape[1]], self.bias)

    def sliced(self, target: nn.Linear) -> dict[str, torch.Tensor]:
        state = {"weight": self.weight[: target.out_features, : target.in_features]}
        if target.bias is not None:
            state["bias"] = self.bias[: target.out_features]
        return state


def copy_slices(pairs: list[tuple[nn.Module, nn.Module]]) -> set[int]:
    """Copy each supernet layer's slices into its ordinary counterpart, in place (a
    supernet layer that is an ordinary one, of the same shapes, is copied whole).
    Returns the ids of the tensors written."""
    written: set[int] = set()
    with torch.no_grad():
        for target, source in pairs:
            sliced = getattr(source, "sliced", None)
            if sliced is None:
                target.load_state_dict(source.state_dict())
                written.update(map(id, target.state_dict(keep_vars=True).values()))
                continue
            for name, value in sliced(target).items():
                tensor = getattr(target, name)
                tensor.copy_(value)
                written.add(id(tensor))
    return written
