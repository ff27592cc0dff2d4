"""Files written whole: to a temporary name beside the target, then renamed, so a
reader never sees half a file and a crash leaves the previous one. Written by Python,
so a new file gets the mode every other file of the process gets (0644 under the usual
umask; safetensors' own writer makes 0600 files)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save

__all__ = ["save_tensors", "write_whole"]


def write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole.

    Raises:
        IsADirectoryError, OSError: ``path`` is not a regular file (a folder, a device,
            a pipe: never replaced), or it cannot be written.
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        kind = IsADirectoryError if path.is_dir() else OSError
        raise kind(f"{path} is not a regular file; name a file to write")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def save_tensors(
    state: Mapping[str, torch.Tensor], path: Path, *, metadata: dict[str, str] | None = None
) -> None:
    """``state`` as a safetensors file at ``path``, written whole."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    write_whole(path, save(tensors, metadata=metadata))
