"""A disk cache of decoded datasets, keyed by a hash of the source files' contents."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from autosearch.data._readers import Raw

__all__ = ["cache_dir", "cached_split", "load_cached", "source_hash", "store"]

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """``$AUTOSEARCH_CACHE``, else ``~/.cache/autosearch``."""
    return Path(os.environ.get("AUTOSEARCH_CACHE", Path.home() / ".cache" / "autosearch"))


def source_hash(name: str, path: Path) -> str:
    """sha256 over the names and bytes of every file under ``path``."""
    digest = hashlib.sha256(name.encode())
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with file.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:24]


def load_cached(key: str) -> Raw | None:
    file = cache_dir() / f"{key}.safetensors"
    if not file.is_file():
        return None
    try:
        tensors = load_file(str(file))
        meta = json.loads(file.with_suffix(".json").read_text())
    except Exception:  # a broken cache entry is only a cache miss
        logger.warning("ignoring unreadable cache entry %s", file)
        return None
    arrays = {k: v.numpy() for k, v in tensors.items()}
    return Raw(
        images=arrays["images"],
        labels=arrays["labels"],
        test_images=arrays.get("test_images"),
        test_labels=arrays.get("test_labels"),
        classes=meta["classes"],
        problems=meta["problems"],
    )


def store(key: str, raw: Raw) -> None:
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"images": raw.images, "labels": raw.labels}
        if raw.test_images is not None and raw.test_labels is not None:
            arrays |= {"test_images": raw.test_images, "test_labels": raw.test_labels}
        writer = f"{os.getpid()}.{threading.get_ident()}"  # ranks may write the entry at once
        tmp = folder / f"{key}.{writer}.tmp"
        save_file(
            {k: torch.from_numpy(np.array(v, order="C", copy=True)) for k, v in arrays.items()},
            str(tmp),
        )
        meta = folder / f"{key}.{writer}.json.tmp"
        meta.write_text(json.dumps({"classes": raw.classes, "problems": raw.problems}))
        # Each file renamed whole, the metadata first: a reader (another rank reading the
        # entry this one rewrites) never sees half of either.
        meta.replace(folder / f"{key}.json")
        tmp.replace(folder / f"{key}.safetensors")
    except OSError as exc:  # a read-only home is no reason to fail
        logger.warning("could not write the dataset cache in %s: %s", folder, exc)


Split = tuple[np.ndarray, np.ndarray]


def cached_split(
    labels: np.ndarray, fraction: float, seed: int, draw: Callable[[], Split]
) -> Split:
    """``draw()``'s stratified split of ``labels`` (kept and drawn indices), kept on disk
    by a hash of what decides it: the labels, the fraction, the seed and the version of
    scikit-learn that draws it. A process that finds it there does not import
    scikit-learn (slow to import: every worker and command that loads a dataset paid
    it). An entry that does not read back as a split
    of these labels is drawn again and rewritten."""
    try:
        version = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    digest = hashlib.sha256(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    digest.update(f"{fraction!r}:{seed}:{version}".encode())
    file = cache_dir() / "splits" / f"{digest.hexdigest()[:32]}.npz"
    try:
        with np.load(file, allow_pickle=False) as stored:
            kept, drawn = stored["kept"], stored["drawn"]
        every = np.concatenate([kept, drawn])
        if every.dtype.kind == "i" and np.array_equal(np.sort(every), np.arange(len(labels))):
            return kept, drawn
    except (OSError, ValueError, KeyError):  # absent or damaged: drawn again
        pass
    kept, drawn = draw()
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f"{file.stem}.{os.getpid()}.{threading.get_ident()}.tmp.npz")
        np.savez(tmp, kept=kept, drawn=drawn)
        tmp.replace(file)
    except OSError as exc:
        logger.debug("could not keep the split in %s: %s", file.parent, exc)
    return kept, drawn
