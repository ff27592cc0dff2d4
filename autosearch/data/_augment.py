"""Batched augmentation on the device: every image of a batch drawn at once from one
generator (no per-sample Python loop), so it runs on the GPU with the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["augment", "cutout"]


def augment(
    x: torch.Tensor, *, crop_padding: int, flip: bool, generator: torch.Generator
) -> torch.Tensor:
    """Batched random crop (with ``crop_padding`` zero padding; 0: none) and, with
    ``flip``, random horizontal flips of uint8 images (N, C, H, W), on their device."""
    n, c, h, w = x.shape
    if crop_padding:
        p = crop_padding
        padded = F.pad(x, (p, p, p, p))
        top = torch.randint(0, 2 * p + 1, (n, 1, 1, 1), generator=generator).to(x.device)
        left = torch.randint(0, 2 * p + 1, (n, 1, 1, 1), generator=generator).to(x.device)
        rows = top + torch.arange(h, device=x.device).view(1, 1, h, 1)
        cols = left + torch.arange(w, device=x.device).view(1, 1, 1, w)
        batch = torch.arange(n, device=x.device).view(n, 1, 1, 1)
        x = padded[batch, torch.arange(c, device=x.device).view(1, c, 1, 1), rows, cols]
    if flip:
        flips = (torch.rand(n, generator=generator) < 0.5).to(x.device)
        x = torch.where(flips.view(-1, 1, 1, 1), x.flip(3), x)
    return x


def cutout(x: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
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
