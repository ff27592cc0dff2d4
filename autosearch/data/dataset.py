"""What a loaded dataset is: three splits (held in memory as :class:`Split` s, or
streamed from files as ``FileSplit`` s), its classes, the train split's statistics and
what cleaning dropped."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from autosearch.data._clean import CleaningReport, image_keys
from autosearch.data._stream import (
    FileSplit,
)


@dataclass(frozen=True, kw_only=True, eq=False)
class Split:
    """Images in memory as uint8 ``(N, C, H, W)`` and int64 labels ``(N,)``."""

    x: torch.Tensor
    y: torch.Tensor
    in_memory: ClassVar[bool] = True

    def __len__(self) -> int:
        return len(self.y)

    @property
    def shape(self) -> tuple[int, int, int]:
        c, h, w = self.x.shape[1:]
        return (int(c), int(h), int(w))

    def take(self, index: torch.Tensor) -> torch.Tensor:
        """The uint8 images at ``index``."""
        return self.x[index]

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(images, labels)`` in order, ``batch_size`` at a time."""
        return zip(self.x.split(batch_size), self.y.split(batch_size), strict=True)

    def keys(self) -> list[str]:
        """A content hash per image."""
        return [str(k) for k in image_keys(self.x.numpy())]


@dataclass(frozen=True, kw_only=True, eq=False)
class Dataset:
    """A cleaned dataset split three ways, with the train split's per-channel statistics."""

    name: str
    train: Split | FileSplit
    val: Split | FileSplit
    test: Split | FileSplit
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...] = ()
    report: CleaningReport = field(default_factory=CleaningReport)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return self.train.shape

    @property
    def streamed(self) -> bool:
        """Whether images are read from files while training (see the module docs)."""
        return not self.train.in_memory

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 images to float, standardised with the train split's statistics."""
        mean, std = _statistics(self.mean, self.std, x.device)
        return (x.float() / 255.0 - mean) / std

    def content_hash(self) -> str:
        """A hash of every image and label in every split, in order: the same whether
        the images are held in memory or streamed from files."""
        digest = hashlib.sha256()
        for split in (self.train, self.val, self.test):
            digest.update("".join(split.keys()).encode())
            digest.update(split.y.numpy().tobytes())
        return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=64)
def _statistics(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel statistics as (1, C, 1, 1) tensors on ``device``, made once: copying
    them to a GPU at every batch would make the host wait for it each time."""
    as_tensor = lambda v: torch.tensor(v, device=device).view(1, -1, 1, 1)  # noqa: E731
    return as_tensor(mean), as_tensor(std)
