"""Batched augmentation on the device: every image of a batch drawn at once from one
generator (no per-sample Python loop), so it runs on the GPU with the batch.

The random draws and their use are separate (:func:`draw`, :class:`Draws`), so that a
whole epoch's draws can be made at once and copied to the GPU in one transfer, then
sliced a batch at a time there: no host-to-device copy, and no wait, per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

__all__ = ["Draws", "augment", "cutout", "draw"]


@dataclass(frozen=True)
class Draws:
    """Random choices for ``n`` images: crop offsets, flips and cutout centres (each an
    (n,) tensor, or None where that augmentation is off)."""

    top: torch.Tensor | None = None
    left: torch.Tensor | None = None
    flips: torch.Tensor | None = None
    cy: torch.Tensor | None = None
    cx: torch.Tensor | None = None

    def _map(self, f: Callable[[torch.Tensor], torch.Tensor]) -> Draws:
        return Draws(
            **{k.name: None if (t := getattr(self, k.name)) is None else f(t) for k in fields(self)}
        )

    def to(self, device: torch.device) -> Draws:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def __getitem__(self, part: slice) -> Draws:
        return self._map(lambda t: t[part])


def draw(
    n: int,
    size: tuple[int, int],
    *,
    crop_padding: int,
    flip: bool,
    cutout: int = 0,
    generator: torch.Generator,
) -> Draws:
    """The draws for ``n`` images of ``size`` (height, width), from ``generator``, in a
    fixed order: crop rows, crop columns, flips, cutout rows, cutout columns."""
    h, w = size
    top = left = flips = cy = cx = None
    if crop_padding:
        top = torch.randint(0, 2 * crop_padding + 1, (n,), generator=generator)
        left = torch.randint(0, 2 * crop_padding + 1, (n,), generator=generator)
    if flip:
        flips = torch.rand(n, generator=generator) < 0.5
    if cutout:
        cy = torch.randint(0, h, (n,), generator=generator)
        cx = torch.randint(0, w, (n,), generator=generator)
    return Draws(top=top, left=left, flips=flips, cy=cy, cx=cx)


def crop_flip(x: torch.Tensor, draws: Draws, crop_padding: int) -> torch.Tensor:
    """Random crops (zero padding ``crop_padding``) and flips of images (N, C, H, W) as
    ``draws`` say, batched on their device."""
    n, c, h, w = x.shape
    if draws.top is not None and draws.left is not None:
        p = crop_padding
        padded = F.pad(x, (p, p, p, p))
        rows = draws.top.view(n, 1, 1, 1) + torch.arange(h, device=x.device).view(1, 1, h, 1)
        cols = draws.left.view(n, 1, 1, 1) + torch.arange(w, device=x.device).view(1, 1, 1, w)
        batch = torch.arange(n, device=x.device).view(n, 1, 1, 1)
        x = padded[batch, torch.arange(c, device=x.device).view(1, c, 1, 1), rows, cols]
    if draws.flips is not None:
        x = torch.where(draws.flips.view(-1, 1, 1, 1), x.flip(3), x)
    return x


def cut(x: torch.Tensor, draws: Draws, size: int) -> torch.Tensor:
    """Zero a ``size``-sided square of each image at the centre ``draws`` say."""
    if draws.cy is None or draws.cx is None:
        return x
    n, _, h, w = x.shape
    rows = torch.arange(h, device=x.device).view(1, h, 1)
    cols = torch.arange(w, device=x.device).view(1, 1, w)
    hole = ((rows - draws.cy.view(n, 1, 1)).abs() <= size // 2) & (
        (cols - draws.cx.view(n, 1, 1)).abs() <= size // 2
    )
    return x * (~hole).unsqueeze(1)


def augment(
    x: torch.Tensor, *, crop_padding: int, flip: bool, generator: torch.Generator
) -> torch.Tensor:
    """Batched random crop (with ``crop_padding`` zero padding; 0: none) and, with
    ``flip``, random horizontal flips of uint8 images (N, C, H, W), on their device."""
    size = (x.shape[-2], x.shape[-1])
    draws = draw(len(x), size, crop_padding=crop_padding, flip=flip, generator=generator)
    return crop_flip(x, draws.to(x.device), crop_padding)


def cutout(x: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """Zero a ``size``-sided square at a random centre of each normalised image (DeVries
    & Taylor 2017); the square may hang over the border."""
    if not size:
        return x
    draws = draw(
        len(x),
        (x.shape[-2], x.shape[-1]),
        crop_padding=0,
        flip=False,
        cutout=size,
        generator=generator,
    )
    return cut(x, draws.to(x.device), size)
