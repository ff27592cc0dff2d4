"""Image folders too large for memory: scanned once, then read from their files.

The scan decodes every file once (in DataLoader worker processes), keeping only what
cleaning and normalisation need: a content hash, the per-channel pixel sums and the
shape. It is cached on disk, keyed by the folder's file listing (names, sizes and
modification times), so a second load only lists the folder. Training then reads
each batch's files through a ``DataLoader`` with workers and a ``DistributedSampler``.

Every loader here with workers starts them from a fork server (``worker_context``), never
by forking the training process: a training process has threads (DataLoader queue
feeders, pin-memory, gloo), and a fork taken while another thread holds one of
CPython's locks leaves the child waiting on it forever. Seen in CI: a DDP rank's
evaluation worker hung inside ``PyOS_AfterFork_Child`` and both ranks waited 30 minutes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import multiprocessing
import os
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from torch.utils.data import DataLoader, DistributedSampler

from autosearch._script import unguarded_line
from autosearch.data._cache import cache_dir
from autosearch.data._clean import image_keys
from autosearch.data._readers import (
    common_shape,
    decode_image,
    folder_files,
    log_converted,
    split_folders,
)
from autosearch.errors import DataError

__all__ = [
    "FileImages",
    "FileSplit",
    "Scan",
    "estimated_bytes",
    "loader_workers",
    "memory_budget",
    "scan_folder",
    "worker_context",
]

logger = logging.getLogger(__name__)

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def memory_budget() -> int:
    """Bytes of decoded images a dataset may hold in memory: ``$AUTOSEARCH_DATA_MEMORY``
    (a number of bytes, optionally with K, M, G or T), else a quarter of the machine's
    memory."""
    value = os.environ.get("AUTOSEARCH_DATA_MEMORY", "").strip().upper().removesuffix("B")
    if value:
        number, unit = (value[:-1], value[-1]) if value[-1] in _UNITS else (value, "")
        try:
            return int(float(number) * _UNITS[unit])
        except ValueError:
            raise DataError(
                f"AUTOSEARCH_DATA_MEMORY={os.environ['AUTOSEARCH_DATA_MEMORY']!r} is not a "
                "size; write it as bytes, e.g. 2000000000 or 2G"
            ) from None
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


def estimated_bytes(root: Path) -> int:
    """Decoded size of an image folder, guessed from its file count and the first
    readable image's shape (without decoding the rest); of both parts of a folder split
    into ``train/`` and ``test/``."""
    parts = split_folders(root)
    if parts is not None:
        return sum(estimated_bytes(part) for part in parts)
    _, files = folder_files(root)
    for file, _ in files:
        try:
            return len(files) * decode_image(file).size
        except DataError:
            continue
    return 0


def loader_workers() -> int:
    """Worker processes reading files, per training process: ``$AUTOSEARCH_LOADER_WORKERS``,
    else up to 4, leaving two CPUs to the training process (none on a 2-core machine,
    where workers measured 0.7x the speed of decoding in the training process). The
    count never changes results: the sampler alone decides the order."""
    value = os.environ.get("AUTOSEARCH_LOADER_WORKERS", "").strip()
    if value:
        if not value.isdigit():
            raise DataError(
                f"AUTOSEARCH_LOADER_WORKERS={value!r} must be a whole number (0: read in "
                "the training process)"
            )
        return int(value)
    return max(0, min(4, (os.cpu_count() or 1) - 2))


# What a fork server loads once, so that each worker it forks starts at once: torch and
# the dataset classes its workers unpickle. Not ``__main__`` (multiprocessing's default):
# a user's unguarded script would run again in the server.
_SERVER_PRELOAD = ["torch", __name__]


def worker_context(*preload: str) -> BaseContext:
    """How loader workers (and a local pool's workers) start: forked from a
    single-threaded fork server (spawned on first use, once per process), so no worker
    inherits a lock held by another thread of the training process. Spawned where fork
    servers do not exist (Windows). ``preload``: more modules the server loads, where
    this call starts it (one server serves every caller of a process)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*_SERVER_PRELOAD, *preload])
    return context


def _loader(dataset: torch.utils.data.Dataset, *, workers: int, **options: Any) -> DataLoader:
    """A DataLoader whose workers (if any) start from ``worker_context``. Each worker
    imports the main script; from a script's unguarded top level that would run the
    script again, so there it reads in this process instead (and says so, once)."""
    if workers > 0:
        where = unguarded_line()
        if where is not None:
            _warn_unguarded(*where)
            workers = 0
    if workers == 0:
        options.pop("persistent_workers", None)  # only for workers
        return _Loader(dataset, num_workers=0, **options)
    return _Loader(
        dataset, num_workers=workers, multiprocessing_context=worker_context(), **options
    )


class _Loader(DataLoader):
    """A DataLoader whose workers' DataErrors reach the caller as they were raised, in
    one line (the DataLoader raises them again with the worker's whole traceback as
    their message, which would become a trial's failure reason)."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator of batches
        batches = super().__iter__()
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except DataError as exc:
                raise DataError(_raised_in_worker(exc)) from None
            yield batch


def _raised_in_worker(exc: DataError) -> str:
    """The message a worker's DataError was raised with."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if len(lines) < 2 or not lines[0].startswith("Caught "):
        return str(exc)
    return lines[-1].removeprefix(f"{type(exc).__module__}.{type(exc).__qualname__}: ")


@functools.cache
def _warn_unguarded(script: str, line: int) -> None:
    logger.warning(
        "%s line %d reads image files from the top level of the script, so they are read "
        "in this process, without loader workers (each worker would run the script "
        'again); put the code under `if __name__ == "__main__":` to read in workers',
        script,
        line,
    )


@dataclass(frozen=True, kw_only=True)
class Scan:
    """What one pass over a folder learned. Lists are per readable, well-shaped file."""

    classes: list[str]
    files: list[str]
    labels: list[int]
    keys: list[str]  # content hash of each decoded image
    sums: np.ndarray  # (N, C) pixel sums, in [0, 1] units
    squares: np.ndarray  # (N, C) sums of squared pixels
    shape: tuple[int, int, int]
    problems: list[str]  # unreadable or wrongly shaped files, with the reason

    @property
    def decoded_bytes(self) -> int:
        return len(self.files) * int(np.prod(self.shape))


class _ScanItems(torch.utils.data.Dataset):
    def __init__(self, files: list[tuple[Path, int]]):
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _scan_item(*self.files[i])


def _scan_item(file: Path, label: int, channels: int | None = None) -> dict[str, Any]:
    """What the scan keeps of one file (decoded to ``channels``, where given)."""
    try:
        image = decode_image(file, channels=channels)
    except DataError as exc:
        return {"file": str(file), "problem": str(exc)}
    pixels = image.reshape(image.shape[0], -1).astype(np.float64) / 255.0
    return {
        "file": str(file),
        "label": label,
        "shape": image.shape,
        "key": str(image_keys(image[None])[0]),  # as for images held in memory
        "sum": pixels.sum(axis=1),
        "square": (pixels**2).sum(axis=1),
    }


def scan_folder(root: Path, *, workers: int | None = None) -> Scan:
    """Decode every image under ``root`` (one sub-folder per class) once; see the module
    docstring. Raises DataError when the folder holds no readable image."""
    classes, files = folder_files(root)
    listing = hashlib.sha256()
    for file, _ in files:
        stat = file.stat()
        listing.update(f"{file.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    key = f"scan-{listing.hexdigest()[:24]}"
    cached = _load_scan(key)
    if cached is not None:
        return cached
    loader = _loader(
        _ScanItems(files),
        batch_size=64,
        workers=loader_workers() if workers is None else workers,
        collate_fn=list,
    )
    items = [item for batch in loader for item in batch]
    problems = [item["problem"] for item in items if "problem" in item]
    good = [item for item in items if "problem" not in item]
    if not good:
        raise DataError(f"image folder {root} holds no readable images")
    shape = common_shape([item["shape"] for item in good])
    problems += [
        f"wrong shape {item['shape']} (expected {shape}): {item['file']}"
        for item in good
        if item["shape"][1:] != shape[1:]
    ]
    good = [item for item in good if item["shape"][1:] == shape[1:]]
    other = [item for item in good if item["shape"] != shape]  # decoded again, converted
    log_converted(root, [Path(item["file"]) for item in other], shape[0])
    good = [
        item if item["shape"] == shape else _scan_item(Path(item["file"]), item["label"], shape[0])
        for item in good
    ]
    problems += [item["problem"] for item in good if "problem" in item]  # changed meanwhile
    good = [item for item in good if "problem" not in item]
    scan = Scan(
        classes=classes,
        files=[item["file"] for item in good],
        labels=[item["label"] for item in good],
        keys=[item["key"] for item in good],
        sums=np.stack([item["sum"] for item in good]),
        squares=np.stack([item["square"] for item in good]),
        shape=(int(shape[0]), int(shape[1]), int(shape[2])),
        problems=problems,
    )
    _store_scan(key, scan)
    return scan


def _load_scan(key: str) -> Scan | None:
    folder = cache_dir()
    try:
        meta = json.loads((folder / f"{key}.json").read_text())
        arrays = load_file(str(folder / f"{key}.safetensors"))
        c, h, w = (int(n) for n in meta.pop("shape"))
        shape = (c, h, w)
        return Scan(**meta, shape=shape, sums=arrays["sums"], squares=arrays["squares"])
    except FileNotFoundError:
        return None
    except Exception:  # a broken cache entry is only a cache miss
        logger.warning("ignoring unreadable scan cache entry %s", key)
        return None


def _store_scan(key: str, scan: Scan) -> None:
    folder = cache_dir()
    meta = {
        "classes": scan.classes,
        "files": scan.files,
        "labels": scan.labels,
        "keys": scan.keys,
        "shape": list(scan.shape),
        "problems": scan.problems,
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # Each file is written under a name of this process's, then renamed into place
        # (atomic): DDP ranks scanning the same folder at once never see half a file.
        arrays = folder / f"{key}.{os.getpid()}.tmp"
        save_file({"sums": scan.sums, "squares": scan.squares}, str(arrays))
        arrays.replace(folder / f"{key}.safetensors")
        tmp = folder / f"{key}.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(meta))
        tmp.replace(folder / f"{key}.json")  # written last: its presence means complete
    except OSError as exc:
        logger.warning("could not write the scan cache in %s: %s", folder, exc)


class FileImages(torch.utils.data.Dataset):
    """``(uint8 image (C, H, W), label)`` read from a file per item."""

    def __init__(self, split: FileSplit):
        self.files, self.labels, self.shape = split.files, split.y, split.shape

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        file = Path(self.files[i])
        try:
            image = decode_image(file, channels=self.shape[0])
        except DataError:
            if file.exists():
                raise
            raise DataError(
                f"{file} was removed since the folder was scanned; load the data again"
            ) from None
        if image.shape != self.shape:
            raise DataError(
                f"{self.files[i]} changed since the folder was scanned: it is now "
                f"{image.shape}, not {self.shape}; load the data again"
            )
        return torch.tensor(image), self.labels[i]  # a copy: PIL's buffer is read-only


@dataclass(frozen=True, kw_only=True, eq=False)
class FileSplit:
    """A split whose images stay in their files (a streamed folder)."""

    files: tuple[str, ...]
    y: torch.Tensor
    image_keys: tuple[str, ...]
    shape: tuple[int, int, int]
    in_memory: ClassVar[bool] = False

    def __len__(self) -> int:
        return len(self.y)

    def keys(self) -> list[str]:
        return list(self.image_keys)

    def take(self, index: torch.Tensor) -> torch.Tensor:
        """The uint8 images at ``index``, decoded now."""
        images = FileImages(self)
        return torch.stack([images[int(i)][0] for i in index.reshape(-1)])

    def batches(self, batch_size: int) -> DataLoader:
        """``(images, labels)`` in order, read by worker processes."""
        return _loader(FileImages(self), batch_size=batch_size, workers=loader_workers())

    def loader(
        self,
        batch_size: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        workers: int | None = None,
        pin_memory: bool = False,
    ) -> tuple[DataLoader, DistributedSampler[int]]:
        """A shuffling loader of this rank's share: ``sampler.set_epoch(e)`` before each
        epoch gives every rank a disjoint, seeded part of the same permutation."""
        images = FileImages(self)
        sampler: DistributedSampler[int] = DistributedSampler(
            images, num_replicas=world_size, rank=rank, shuffle=True, seed=seed
        )
        workers = loader_workers() if workers is None else workers
        loader = _loader(
            images,
            batch_size=batch_size,
            sampler=sampler,
            workers=workers,
            pin_memory=pin_memory,
            persistent_workers=True,  # when there are workers
        )
        return loader, sampler
