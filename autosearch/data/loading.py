"""``load_data``: a source (a named dataset, a folder, arrays) read, cleaned, split and
held in memory or streamed (the sources: :mod:`autosearch.data`)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autosearch.data._cache import load_cached, source_hash, store
from autosearch.data._clean import CleaningReport, drop_duplicates, image_keys
from autosearch.data._readers import DEFAULT_PATHS, READERS, Raw, split_folders
from autosearch.data._stream import (
    FileSplit,
    Scan,
    estimated_bytes,
    memory_budget,
    scan_folder,
)
from autosearch.data.dataset import Dataset, Split
from autosearch.data.splits import draw_splits
from autosearch.errors import DataError, UnknownNameError

_NUM_CLASSES = {"digits": 10, "mnist": 10, "fashion-mnist": 10, "cifar10": 10, "cifar100": 100}


def dataset_names() -> list[str]:
    return sorted(READERS)


def spec_of(data: Any) -> str:
    """The string a study stores for ``data``: the spec itself, or ``arrays:HASH``."""
    if isinstance(data, str):
        return data
    images, labels = _as_arrays(data)
    digest = hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()[:16]
    return f"arrays:{digest}"


def load_data(
    data: str | tuple[Any, Any],
    *,
    seed: int = 0,
    val_fraction: float = 0.2,
    test_fraction: float = 0.2,
    num_classes: int | None = None,
    stream: bool | None = None,
) -> Dataset:
    """Load, clean and split a dataset (see the module docstring for the sources).

    Args:
        data: A source spec, or ``(images, labels)``: images uint8 in 0..255 or float in
            [0, 1], shaped (N, H, W), (N, C, H, W) or (N, H, W, C); integer labels.
        seed: Seed of the split; the same seed gives the same split.
        val_fraction: Share of the samples used for validation (search decisions).
        test_fraction: Share held out for the final report (when the source has no
            test split of its own).
        num_classes: Labels must lie in 0..num_classes-1 (default: known for named
            datasets, else the largest label + 1).
        stream: For ``folder:`` sources, read images from their files while training
            instead of holding them in memory (default: only when they would not fit
            in :func:`memory_budget`).
    """
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise DataError(
            f"val_fraction={val_fraction} and test_fraction={test_fraction} must be in (0, 1) "
            "and leave samples for training"
        )
    if stream and not (isinstance(data, str) and data.startswith("folder:")):
        raise DataError(
            f"only image folders ('folder:PATH') can be streamed from files, not {spec_of(data)}"
        )
    if isinstance(data, str):
        return load_named(data, seed, val_fraction, test_fraction, num_classes, stream)
    images, labels = _as_arrays(data)
    raw = Raw(images=images, labels=labels)
    return _prepare("arrays", raw, seed, val_fraction, test_fraction, num_classes)


@functools.lru_cache(maxsize=8)
def load_named(
    spec: str,
    seed: int,
    val_fraction: float,
    test_fraction: float,
    num_classes: int | None,
    stream: bool | None = None,
) -> Dataset:
    name, _, path = spec.partition(":")
    reader = READERS.get(name)
    if reader is None:
        raise UnknownNameError("dataset", name, READERS)
    if name == "folder" and (
        stream or (stream is None and estimated_bytes(Path(path)) > memory_budget())
    ):
        parts = split_folders(Path(path))
        scans = [scan_folder(part) for part in parts] if parts else [scan_folder(Path(path))]
        return _prepare_streamed(spec, scans[0], seed, val_fraction, test_fraction, *scans[1:])
    if name == "digits":
        raw = reader(None)
    else:
        location = Path(path or DEFAULT_PATHS.get(name, ""))
        key = source_hash(name, location) if location.exists() else None
        raw = (load_cached(key) if key else None) or reader(path or None)
        if key:
            store(key, raw)
    return _prepare(
        spec, raw, seed, val_fraction, test_fraction, num_classes or _NUM_CLASSES.get(name)
    )


def _as_arrays(data: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` from Python as uint8 (N, C, H, W) and int64 (N,)."""
    try:
        images, labels = data
    except (TypeError, ValueError):
        raise DataError(
            f"data must be a dataset spec ({', '.join(dataset_names())}) or (images, labels), "
            f"got {type(data).__name__}"
        ) from None
    images = images.numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    labels = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4 and images.shape[1] not in (1, 3) and images.shape[-1] in (1, 3):
        images = images.transpose(0, 3, 1, 2)
    if images.ndim != 4:
        raise DataError(
            f"images must be (N, H, W), (N, C, H, W) or (N, H, W, C), got {images.shape}"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(f"labels must be ({len(images)},) to match the images, got {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"labels must be integers 0..K-1, got dtype {labels.dtype}")
    return images, labels.astype(np.int64)


def _to_uint8(images: np.ndarray, report: CleaningReport) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images and the indices of usable samples (float input: NaN or values
    outside [0, 1] make a sample unusable)."""
    if images.dtype == np.uint8:
        return images, np.arange(len(images))
    flat = images.reshape(len(images), -1).astype(np.float64)
    ok = np.isfinite(flat).all(axis=1) & (flat >= 0).all(axis=1) & (flat <= 1).all(axis=1)
    report.bad_values += int((~ok).sum())
    pixels = np.clip(np.rint(np.nan_to_num(images) * 255.0), 0, 255).astype(np.uint8)
    return pixels, np.flatnonzero(ok)


def _prepare(
    name: str,
    raw: Raw,
    seed: int,
    val_fraction: float,
    test_fraction: float,
    num_classes: int | None,
) -> Dataset:
    report = CleaningReport(
        read=len(raw.labels) + (len(raw.test_labels) if raw.test_labels is not None else 0),
        unreadable=list(raw.problems),
    )
    classes = _class_count(name, raw, num_classes)

    def clean(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        images, usable = _to_uint8(images, report)
        in_range = (labels[usable] >= 0) & (labels[usable] < classes)
        report.bad_labels += int((~in_range).sum())
        usable = usable[in_range]
        keys = image_keys(images[usable])
        keep = drop_duplicates(keys, labels[usable], report)
        return images[usable][keep], labels[usable][keep], keys[keep]

    x, y, keys = clean(raw.images, raw.labels)
    if not len(y):
        raise DataError(
            f"no usable samples in {name}: of {len(raw.labels)}, {report.bad_labels} have "
            f"labels outside 0..{classes - 1} and {report.bad_values} NaN or out-of-range "
            "pixels; check the labels (or num_classes) and the pixel scale (uint8, or floats "
            "in [0, 1])"
        )
    official = None
    if raw.test_images is not None and raw.test_labels is not None:
        official = clean(raw.test_images, raw.test_labels)
    train, val, test = draw_splits(
        y, keys, seed, val_fraction, test_fraction, report, official[2] if official else None
    )
    tx, ty = (official[0], official[1]) if official else (x, y)
    splits = {
        "train": Split(x=torch.from_numpy(x[train]), y=torch.from_numpy(y[train])),
        "val": Split(x=torch.from_numpy(x[val]), y=torch.from_numpy(y[val])),
        "test": Split(
            x=torch.from_numpy(np.ascontiguousarray(tx[test])),
            y=torch.from_numpy(np.ascontiguousarray(ty[test])),
        ),
    }
    report.kept = {k: len(v) for k, v in splits.items()}
    report.class_counts = np.bincount(y[train], minlength=classes).tolist()
    pixels = x[train].astype(np.float64) / 255.0
    return Dataset(
        name=name,
        **splits,
        num_classes=classes,
        mean=tuple(float(m) for m in pixels.mean(axis=(0, 2, 3))),
        std=tuple(float(max(s, 1e-6)) for s in pixels.std(axis=(0, 2, 3))),
        classes=tuple(raw.classes or ()),
        report=report,
    )


def _class_count(name: str, raw: Raw, given: int | None) -> int:
    """How many classes ``raw`` has: as given, else from its class names, else from its
    labels, which must then be 0..K-1 with every class present (a stray label must not
    silently make a K-way problem a 100-way one)."""
    labels = np.concatenate([raw.labels, raw.test_labels if raw.test_labels is not None else []])
    if not len(raw.labels):
        raise DataError(f"{name} has no images: give it at least two classes of images")
    if given is not None:
        return given
    found = np.unique(labels).astype(np.int64)
    count = len(raw.classes) if raw.classes else int(found.max()) + 1
    if count < 2 or len(found) < 2:
        what = f"class names {raw.classes}" if raw.classes else f"labels {found.tolist()}"
        raise DataError(
            f"{name} has one class ({what}); classification needs at least two: add images "
            "of another class (an image folder has one sub-folder per class)"
        )
    if raw.classes is None and (found.min() < 0 or len(found) < count):
        stray = [int(v) for v in found if v < 0 or v >= len(found)]
        rare = {v: int((labels == v).sum()) for v in stray[:5]}
        raise DataError(
            f"labels of {name} must be 0..K-1 with every class present, but they run "
            f"{int(found.min())}..{int(found.max())} with only {len(found)} distinct values "
            f"(samples per suspicious label: {rare}); relabel them "
            "(numpy.unique(labels, return_inverse=True)), or give the class count "
            "(load_data(..., num_classes=K))"
        )
    return count


def _prepare_streamed(
    name: str,
    scan: Scan,
    seed: int,
    val_fraction: float,
    test_fraction: float,
    test_scan: Scan | None = None,
) -> Dataset:
    """A scanned folder cleaned and split like an in-memory dataset, its splits left as
    files (their per-image pixel sums give the train split's statistics); with
    ``test_scan`` (a folder's ``test/``), that is the test split."""
    report = CleaningReport(read=len(scan.files), unreadable=list(scan.problems))
    if len(scan.classes) < 2:
        raise DataError(
            f"{name} has {len(scan.classes)} class folder(s) {list(scan.classes)}; "
            "classification needs at least two: add a sub-folder of images per class"
        )
    labels = np.asarray(scan.labels, dtype=np.int64)
    keys = np.asarray(scan.keys)
    keep = drop_duplicates(keys, labels, report)
    files, labels, keys = [scan.files[i] for i in keep], labels[keep], keys[keep]
    sums, squares = scan.sums[keep], scan.squares[keep]
    official = _official_test(name, scan, test_scan)
    train, val, test = draw_splits(
        labels, keys, seed, val_fraction, test_fraction, report, official[2] if official else None
    )
    parts = {"train": (files, labels, keys, train), "val": (files, labels, keys, val)}
    parts["test"] = (*official, test) if official else (files, labels, keys, test)
    splits = {
        part: FileSplit(
            files=tuple(names[i] for i in index),
            y=torch.from_numpy(ys[index]),
            image_keys=tuple(str(ks[i]) for i in index),
            shape=scan.shape,
        )
        for part, (names, ys, ks, index) in parts.items()
    }
    report.kept = {k: len(v) for k, v in splits.items()}
    report.class_counts = np.bincount(labels[train], minlength=len(scan.classes)).tolist()
    pixels = len(train) * scan.shape[1] * scan.shape[2]
    mean = sums[train].sum(axis=0) / pixels
    std = np.sqrt(np.maximum(squares[train].sum(axis=0) / pixels - mean**2, 0.0))
    return Dataset(
        name=name,
        **splits,
        num_classes=len(scan.classes),
        mean=tuple(float(m) for m in mean),
        std=tuple(float(max(s, 1e-6)) for s in std),
        classes=tuple(scan.classes),
        report=report,
    )


def _official_test(
    name: str, scan: Scan, test_scan: Scan | None
) -> tuple[list[str], np.ndarray, np.ndarray] | None:
    """A streamed folder's own test split (files, labels, keys), checked against its
    training part."""
    if test_scan is None:
        return None
    if test_scan.classes != scan.classes or test_scan.shape != scan.shape:
        raise DataError(
            f"{name}: test/ holds classes {test_scan.classes} of {test_scan.shape} images, "
            f"train/ holds {scan.classes} of {scan.shape}; they must be the same"
        )
    labels = np.asarray(test_scan.labels, dtype=np.int64)
    return list(test_scan.files), labels, np.asarray(test_scan.keys)
