"""Structural channel pruning with torch-pruning (Fang et al., DepGraph, CVPR 2023).

torch-pruning traces the network's dependency graph, so residual additions, depthwise
convolutions and DenseNet concatenations lose the same channels on every layer they
couple; the result is a smaller dense network, not a masked one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from autosearch.errors import TrialFailed


def _classifier(model: nn.Module) -> nn.Module | None:
    """The last linear (or 1×1 conv) layer: its outputs are the classes, never pruned."""
    last = None
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            last = module
    return last


def _make_prunable(model: nn.Module) -> None:
    """Swap in the traceable equivalent of every submodule that offers one.

    A module whose channel mapping a pruner cannot see (a zero-padding shortcut, say)
    may define ``to_prunable()`` returning an equivalent module made of layers the
    pruner follows; the swap keeps the network's function.
    """
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            convert = getattr(child, "to_prunable", None)
            if callable(convert):
                device = next(model.parameters()).device
                setattr(parent, name, convert().to(device))


def prune_channels(model: nn.Module, input_shape: Sequence[int], *, ratio: float) -> nn.Module:
    """Remove ``ratio`` of the output channels of every prunable layer, choosing the
    channels (groups of coupled channels) of least L2 weight magnitude; in place.

    Raises:
        TrialFailed: the network cannot be traced or pruned, or comes out malformed.
    """
    import torch_pruning as tp  # optional at import time: only this variant needs it

    device = next(model.parameters()).device
    example = torch.randn(2, *input_shape, device=device)
    model.eval()
    with torch.no_grad():
        before = model(example)
    _make_prunable(model)
    head = _classifier(model)
    try:
        pruner = tp.pruner.MetaPruner(
            model,
            example,
            importance=tp.importance.MagnitudeImportance(p=2),
            pruning_ratio=ratio,
            ignored_layers=[head] if head is not None else [],
        )
        pruner.step()
        with torch.no_grad():
            after = model(example)
    except Exception as exc:  # torch-pruning raises bare errors on graphs it cannot follow
        raise TrialFailed(
            f"torch-pruning could not prune this network ({type(exc).__name__}: {exc})"
        ) from exc
    if after.shape != before.shape or not torch.isfinite(after).all():
        raise TrialFailed(
            f"channel pruning produced outputs of shape {tuple(after.shape)} "
            f"(expected {tuple(before.shape)}) or non-finite values"
        )
    return model
