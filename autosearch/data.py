"""Datasets held in memory as uint8 image tensors with a stratified split.

The test split is held out of every search decision: trials are ranked on the
validation split, and test accuracy only appears in reports.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.model_selection import train_test_split

from autosearch.errors import DataError, UnknownNameError

__all__ = ["Dataset", "Split", "dataset_names", "load_data"]


@dataclass(frozen=True, kw_only=True, eq=False)
class Split:
    """Images as uint8 ``(N, C, H, W)`` and int64 labels ``(N,)``."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True, kw_only=True, eq=False)
class Dataset:
    """A dataset split three ways, with the train split's per-channel statistics."""

    name: str
    train: Split
    val: Split
    test: Split
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        c, h, w = self.train.x.shape[1:]
        return (int(c), int(h), int(w))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 images to float, standardised with the train split's statistics."""
        mean = torch.tensor(self.mean, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, -1, 1, 1)
        return (x.float() / 255.0 - mean) / std

    def content_hash(self) -> str:
        """A hash of every image and label in every split, in order."""
        digest = hashlib.sha256()
        for split in (self.train, self.val, self.test):
            digest.update(split.x.numpy().tobytes())
            digest.update(split.y.numpy().tobytes())
        return digest.hexdigest()[:16]


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # Pixel values are 0..16; spread them over the uint8 range.
    images = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    return images[:, None, :, :], bunch.target.astype(np.int64)


_READERS: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {"digits": _digits}


def dataset_names() -> list[str]:
    return sorted(_READERS)


def load_data(
    spec: str, *, seed: int = 0, val_fraction: float = 0.2, test_fraction: float = 0.2
) -> Dataset:
    """Load a dataset by name and split it, stratified by class, with ``seed``.

    Args:
        spec: A dataset name (``"digits"``).
        seed: Seed of the split; the same seed gives the same split.
        val_fraction: Share of all samples used for validation (search decisions).
        test_fraction: Share held out for the final report.
    """
    reader = _READERS.get(spec)
    if reader is None:
        raise UnknownNameError("dataset", spec, _READERS)
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise DataError(
            f"val_fraction={val_fraction} and test_fraction={test_fraction} must be in (0, 1) "
            "and leave samples for training"
        )
    images, labels = reader()
    return split_arrays(
        spec, images, labels, seed=seed, val_fraction=val_fraction, test_fraction=test_fraction
    )


def split_arrays(
    name: str,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    seed: int,
    val_fraction: float,
    test_fraction: float,
) -> Dataset:
    """Stratified train / validation / test split of uint8 ``(N, C, H, W)`` images."""
    if images.dtype != np.uint8 or images.ndim != 4:
        raise DataError(f"images must be uint8 (N, C, H, W), got {images.dtype} {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(f"labels must be (N,) = ({len(images)},), got {labels.shape}")
    index = np.arange(len(labels))
    rest, test = train_test_split(
        index, test_size=test_fraction, stratify=labels, random_state=seed
    )
    train, val = train_test_split(
        rest,
        test_size=val_fraction / (1 - test_fraction),
        stratify=labels[rest],
        random_state=seed,
    )

    def take(ix: np.ndarray) -> Split:
        ix = np.sort(ix)
        return Split(x=torch.from_numpy(images[ix]), y=torch.from_numpy(labels[ix]))

    train_x = images[train].astype(np.float64) / 255.0
    mean = train_x.mean(axis=(0, 2, 3))
    std = np.maximum(train_x.std(axis=(0, 2, 3)), 1e-6)
    return Dataset(
        name=name,
        train=take(train),
        val=take(val),
        test=take(test),
        num_classes=int(labels.max()) + 1,
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
    )
