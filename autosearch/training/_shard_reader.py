"""Reading a sharded checkpoint's folder (``torch.distributed.checkpoint``, DCP) as data,
never as code.

DCP's own reader unpickles the folder's ``.metadata`` with :mod:`pickle`, and its load
planner reads every non-tensor value (an optimizer's learning rate, a step count) with
``torch.load(weights_only=False)``: a folder from a disk, a bucket or another machine
could run anything it names. Here the metadata goes through an unpickler that builds
only DCP's own metadata types (and the torch sizes, dtypes and layouts they hold), and
the values through ``torch.load(weights_only=True)``. Tensors DCP already reads with
``weights_only=True``.

:func:`check` reads a folder before any rank loads from it: the metadata, and every
shard file it names, whole (a file cut short is found here, with its name, rather than
as an ``EOFError`` deep in DCP). Every failure is :class:`UnreadableShards`, an ordinary
exception whose message is one line.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, Metadata

from autosearch._files import file_digest
from autosearch.training._checkpoint import describe

__all__ = [
    "SafeLoadPlanner",
    "SafeReader",
    "UnreadableShards",
    "check",
    "digests",
    "read_metadata",
]

# What a DCP ``.metadata`` of torch >= 2.4 refers to (checked against torch 2.11 and
# 2.13): DCP's metadata dataclasses, the file system reader's per-item record, and the
# torch values they hold. Anything else in the file is refused, unbuilt.
_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED: dict[str, frozenset[str]] = {
    _METADATA: frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}


class UnreadableShards(Exception):
    """A sharded checkpoint's folder that cannot be read as DCP data (missing, cut
    short, damaged, or naming anything but DCP's own types)."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def read_metadata(folder: Path) -> Metadata:
    """The ``.metadata`` of ``folder``, built from DCP's own types only."""
    path = folder / ".metadata"
    try:
        with path.open("rb") as file:
            metadata = _MetadataUnpickler(file).load()
    except FileNotFoundError:
        raise UnreadableShards(f"{path} is missing") from None
    except Exception as exc:  # a cut or damaged pickle raises any of a dozen types
        raise UnreadableShards(f"{path} is not DCP metadata ({describe(exc)})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise UnreadableShards(f"{path} is not DCP metadata ({type(metadata).__name__})")
    return metadata


def digests(folder: Path) -> dict[str, str]:
    """The sha256 of every file of a folder just written (the checkpoint file keeps them)."""
    return {p.name: file_digest(p) for p in sorted(folder.iterdir()) if p.is_file()}


def check(
    folder: Path, expected: dict[str, str] | None = None, *, share: tuple[int, int] = (0, 1)
) -> Metadata:
    """``folder``'s metadata, once every shard file it names is there and long enough
    for the items it holds, and the files of this rank's ``share`` (rank, world) of
    ``expected`` hold what was written; otherwise :class:`UnreadableShards` naming the
    file."""
    metadata = read_metadata(folder)
    ends: dict[str, int] = {}
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise UnreadableShards(f"{folder}/.metadata names a shard outside it: {name!r}")
        if getattr(info, "transform_descriptors", None):
            raise UnreadableShards(f"{folder}/{name}: transformed shards are not read")
        end = int(info.offset) + int(info.length)
        ends[name] = max(ends.get(name, 0), end)
    for name, end in sorted(ends.items()):
        try:
            size = (folder / name).stat().st_size
        except FileNotFoundError:
            raise UnreadableShards(f"{folder / name} is missing") from None
        if size < end:
            raise UnreadableShards(f"{folder / name} is cut short ({size} of {end} bytes)")
    rank, world = share
    for name, digest in sorted((expected or {}).items())[rank::world]:
        if Path(name).name != name or not (folder / name).is_file():
            raise UnreadableShards(f"{folder / name} is missing")
        if file_digest(folder / name) != digest:
            raise UnreadableShards(f"{folder / name} differs from what was written")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file system reader, its metadata read by :func:`read_metadata`. It takes no
    ``rank`` (no per-rank metadata fallback): a folder this project wrote has one
    ``.metadata``, and a missing one is a failure of its own."""

    def read_metadata(self) -> Metadata:  # type: ignore[override]
        metadata = read_metadata(Path(self.path))
        metadata.storage_meta = metadata.storage_meta or _storage_meta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, non-tensor values read with ``weights_only=True``
    (they are plain numbers, strings and containers) before DCP sees them."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            plain = torch.load(value, weights_only=True, map_location="cpu")
        except Exception as exc:
            raise UnreadableShards(
                f"value {read_item.dest_index.fqn!r} is not plain data ({describe(exc)})"
            ) from None
        checked = io.BytesIO()
        torch.save(plain, checked)  # re-serialised from values built above: nothing else
        checked.seek(0)
        super().load_bytes(read_item, checked)


def _storage_meta() -> Any:
    from torch.distributed.checkpoint.metadata import StorageMeta

    return StorageMeta()
