"""Dataset readers: each decodes a source into uint8 ``(N, C, H, W)`` images and labels.

Readers never unpickle arbitrary objects: CIFAR's python batches go through a restricted
unpickler that builds only numpy arrays, lists, dicts, strings and numbers.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import logging
import pickle
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from autosearch._files import NotReadable, open_regular, read_bounded
from autosearch.errors import DataError

_MAX_FILE = 4 << 30  # bytes read of one data file (a compressed IDX, a CIFAR batch)

__all__ = [
    "DEFAULT_PATHS",
    "READERS",
    "Raw",
    "common_shape",
    "decode_image",
    "folder_files",
    "log_converted",
    "most_common_shape",
]

logger = logging.getLogger(__name__)

DEFAULT_PATHS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist"}


@dataclass(kw_only=True)
class Raw:
    """Decoded samples; ``test_*`` set when the dataset ships an official test split.
    ``problems`` lists files that could not be read (for the cleaning report)."""

    images: np.ndarray
    labels: np.ndarray
    test_images: np.ndarray | None = None
    test_labels: np.ndarray | None = None
    classes: list[str] | None = None
    problems: list[str] = field(default_factory=list)


def _digits(path: str | None) -> Raw:
    """scikit-learn's bundled digits, read from the file it ships as its ``load_digits``
    reads it, without importing scikit-learn (slow to import, in every process that
    loads digits; the split is kept on disk: data/_cache.py)."""
    pixels, labels = _digits_file()
    # Pixel values are 0..16; spread them over the uint8 range.
    images = np.clip(np.rint(pixels * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    return Raw(images=images[:, None], labels=labels.astype(np.int64))


def _digits_file() -> tuple[np.ndarray, np.ndarray]:
    spec = importlib.util.find_spec("sklearn")  # found, not imported
    origin = spec.origin if spec else None
    shipped = Path(origin).parent / "datasets" / "data" / "digits.csv.gz" if origin else None
    if shipped is None or not shipped.is_file():  # another layout: scikit-learn's own reader
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    with gzip.open(shipped, mode="rt", encoding="utf-8") as rows:
        data = np.loadtxt(rows, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


# IDX (MNIST, Fashion-MNIST) --------------------------------------------------------------
_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _find(folder: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    raise DataError(
        f"{folder} has no {stem}.gz (or {stem}); expected the four MNIST-format "
        "IDX files (train-images-idx3-ubyte.gz, ...)"
    )


def _read_idx(path: Path, dims: int) -> np.ndarray:
    try:
        data = read_bounded(path, limit=_MAX_FILE)
        data = gzip.decompress(data) if path.suffix == ".gz" else data
    except (OSError, EOFError, gzip.BadGzipFile, NotReadable) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    if len(data) < 4 + 4 * dims or data[:2] != b"\0\0" or data[2] != 0x08 or data[3] != dims:
        raise DataError(
            f"{path} is not an IDX file of {dims} dimension(s) of uint8 "
            f"(magic {data[:4].hex() if len(data) >= 4 else 'missing'})"
        )
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    body = data[4 + 4 * dims :]
    if len(body) != int(np.prod(shape)):
        raise DataError(
            f"{path} is truncated or corrupt: header says {shape}, {len(body)} bytes of data follow"
        )
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def _idx(path: str | None, name: str) -> Raw:
    folder = Path(path or DEFAULT_PATHS.get(name, ""))
    if not folder.is_dir():
        hint = (
            " (apt-get install dataset-fashion-mnist installs it there)"
            if name == "fashion-mnist"
            else ""
        )
        raise DataError(
            f"{name} folder {folder} does not exist{hint}; give it as '{name}:/path/to/folder'"
        )
    splits = {}
    for split, (images, labels) in _IDX_FILES.items():
        x = _read_idx(_find(folder, images), 3)
        y = _read_idx(_find(folder, labels), 1)
        if len(x) != len(y):
            raise DataError(f"{folder}: {len(x)} {split} images but {len(y)} labels")
        splits[split] = (x[:, None], y.astype(np.int64))
    return Raw(
        images=splits["train"][0],
        labels=splits["train"][1],
        test_images=splits["test"][0],
        test_labels=splits["test"][1],
    )


# CIFAR python batches --------------------------------------------------------------------
class _SafeUnpickler(pickle.Unpickler):
    """Rebuilds numpy arrays and plain containers only; anything else is refused."""

    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def _unpickle(path: Path) -> dict:
    try:
        with io.BytesIO(read_bounded(path, limit=_MAX_FILE)) as f:
            data = _SafeUnpickler(f, encoding="bytes").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as exc:
        raise DataError(f"cannot read CIFAR batch {path}: {exc}") from None  # NotReadable too
    if not isinstance(data, dict):
        raise DataError(f"CIFAR batch {path} holds {type(data).__name__}, not a dict")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in data.items()}


def _cifar_batches(folder: Path, names: list[str], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for name in names:
        batch = _unpickle(folder / name)
        if "data" not in batch or label_key not in batch:
            raise DataError(f"CIFAR batch {folder / name} lacks 'data' or {label_key!r}")
        data = np.asarray(batch["data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3072:
            raise DataError(
                f"CIFAR batch {folder / name}: data is {data.shape}, expected (N, 3072)"
            )
        images.append(data.reshape(-1, 3, 32, 32))
        labels.append(np.asarray(batch[label_key], dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels)


def _cifar(path: str | None, name: str) -> Raw:
    folder = Path(path or "")
    if not path or not folder.is_dir():
        raise DataError(
            f"{name} needs the folder of its python batches: '{name}:/path/to/"
            f"{'cifar-10-batches-py' if name == 'cifar10' else 'cifar-100-python'}'"
        )
    if name == "cifar10":
        train = [f"data_batch_{i}" for i in range(1, 6)]
        test, label_key = ["test_batch"], "labels"
    else:
        train, test, label_key = ["train"], ["test"], "fine_labels"
    missing = [n for n in train + test if not (folder / n).is_file()]
    if missing:
        raise DataError(f"{folder} lacks the {name} batches {', '.join(missing)}")
    x, y = _cifar_batches(folder, train, label_key)
    tx, ty = _cifar_batches(folder, test, label_key)
    return Raw(images=x, labels=y, test_images=tx, test_labels=ty)


# Image folders ---------------------------------------------------------------------------
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


_MODES = {1: "L", 3: "RGB"}


def decode_image(file: Path, *, channels: int | None = None) -> np.ndarray:
    """One image file as uint8 ``(C, H, W)``: grey stays one channel, the rest become
    RGB; or, with ``channels``, converted to that many (grey repeated into RGB, RGB to
    grey by Pillow's luma). Only a regular file is opened (a FIFO named ``x.jpg`` would
    block the reader), and its size is checked from its header before it is decoded.

    Raises:
        DataError: the file is not a readable image (the reason in the message).
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise DataError("image folders need Pillow: pip install Pillow") from None
    try:
        with open_regular(file) as f, warnings.catch_warnings():
            # Pillow warns past its pixel limit: such an image is refused here instead.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(f) as img:
                _check_pixels(file, img.width, img.height, Image.MAX_IMAGE_PIXELS)
                img.load()
                native = 1 if img.mode in ("1", "L", "I;16") else 3
                array = np.asarray(img.convert(_MODES[channels or native]))
    except NotReadable as exc:
        raise DataError(f"unreadable: {file} {exc.reason}") from None
    except Image.DecompressionBombError as exc:  # past twice the limit: refused in open()
        raise DataError(f"unreadable: {file} ({exc}); resize it") from None
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise DataError(f"unreadable: {file} ({type(exc).__name__})") from None
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _check_pixels(file: Path, width: int, height: int, limit: int | None) -> None:
    if limit and width * height > limit:
        raise DataError(
            f"unreadable: {file} is {width} x {height} pixels, more than Pillow's limit of "
            f"{limit:,} (PIL.Image.MAX_IMAGE_PIXELS): not decoded; resize it"
        )


def common_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The folder's image shape: the most common channel count and the most common
    height and width (an image of the other channel count is converted to it)."""
    channels = most_common_shape([s[:1] for s in shapes])
    return (*channels, *most_common_shape([s[1:] for s in shapes]))


def folder_files(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """The class names (sorted sub-folders) and every image file with its label."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not classes:
        raise DataError(f"image folder {root} needs one sub-folder of images per class")
    files = [
        (file, label)
        for label, cls in enumerate(classes)
        for file in sorted((root / cls).iterdir())
        if file.suffix.lower() in _IMAGE_SUFFIXES
    ]
    return classes, files


def most_common_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    counts: dict[tuple[int, ...], int] = {}
    for shape in shapes:
        counts[shape] = counts.get(shape, 0) + 1
    return max(counts, key=lambda s: counts[s])


def split_folders(root: Path) -> tuple[Path, Path] | None:
    """``(root/train, root/test)`` where ``root`` holds exactly those two folders, each
    with a sub-folder per class (CIFAR-10's JPEG layout): the test images are then the
    dataset's own test split. None for a plain folder of class sub-folders."""
    found = {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()
    if found != {"train", "test"}:
        return None
    train, test = root / "train", root / "test"
    if not all(any(p.is_dir() for p in part.iterdir()) for part in (train, test)):
        return None  # two classes called train and test
    return train, test


def _decode_folder(root: Path) -> tuple[list[str], np.ndarray, np.ndarray, list[str]]:
    """A folder of class sub-folders decoded: class names, images, labels, problems.
    Images of the other channel count (greyscale JPEGs among RGB ones) are converted to
    the folder's (:func:`common_shape`); unreadable files and images of another height
    and width are left out and reported."""
    classes, files = folder_files(root)
    decoded: list[tuple[np.ndarray, int, Path]] = []
    problems: list[str] = []
    for file, label in files:
        try:
            decoded.append((decode_image(file), label, file))
        except DataError as exc:
            problems.append(str(exc))
    if not decoded:
        raise DataError(f"image folder {root} holds no readable images")
    common = common_shape([a.shape for a, _, _ in decoded])
    problems += [
        f"wrong shape {a.shape} (expected {common}): {f}"
        for a, _, f in decoded
        if a.shape[1:] != common[1:]
    ]
    keep = [(a, y, f) for a, y, f in decoded if a.shape[1:] == common[1:]]
    converted = [f for a, _, f in keep if a.shape[0] != common[0]]
    log_converted(root, converted, common[0])
    images = np.stack(
        [a if a.shape[0] == common[0] else decode_image(f, channels=common[0]) for a, _, f in keep]
    ).astype(np.uint8)
    return classes, images, np.array([y for _, y, _ in keep], dtype=np.int64), problems


def log_converted(root: Path, files: list[Path], channels: int) -> None:
    """Say that images of the other channel count were converted (not left out)."""
    if files:
        logger.info(
            "image folder %s: %d image(s) converted to %s like the rest (e.g. %s)",
            root,
            len(files),
            "RGB" if channels == 3 else "greyscale",
            files[0],
        )


def _folder(path: str | None, name: str) -> Raw:
    """One sub-folder per class, decoded into memory; or ``train/`` and ``test/``
    folders of class sub-folders (:func:`split_folders`), the second the test split."""
    root = Path(path or "")
    parts = split_folders(root)
    if parts is None:
        classes, images, labels, problems = _decode_folder(root)
        return Raw(images=images, labels=labels, classes=classes, problems=problems)
    (classes, images, labels, problems), test = (_decode_folder(part) for part in parts)
    if test[0] != classes or test[1].shape[1:] != images.shape[1:]:
        raise DataError(
            f"image folder {root}: test/ holds classes {test[0]} of {test[1].shape[1:]} images, "
            f"train/ holds {classes} of {images.shape[1:]}; they must be the same"
        )
    return Raw(
        images=images,
        labels=labels,
        test_images=test[1],
        test_labels=test[2],
        classes=classes,
        problems=problems + test[3],
    )


READERS: dict[str, Callable[[str | None], Raw]] = {
    "digits": _digits,
    "mnist": lambda path: _idx(path, "mnist"),
    "fashion-mnist": lambda path: _idx(path, "fashion-mnist"),
    "cifar10": lambda path: _cifar(path, "cifar10"),
    "cifar100": lambda path: _cifar(path, "cifar100"),
    "folder": lambda path: _folder(path, "folder"),
}
