"""Files written whole, and files from outside read with bounds.

Written whole: to a temporary name beside the target, then renamed, so a reader never
sees half a file and a crash leaves the previous one. Written by Python, so a new file
gets the mode every other file of the process gets (0644 under the usual umask;
safetensors' own writer makes 0600 files).

Read from outside (a file a user passed: a latency table, a benchmark table, an export's
card, a journal, a dataset file): only a regular file is opened (a folder, a device such
as ``/dev/zero``, a FIFO or a socket is refused before anything blocks or reads without
end), never more than its bound is read, and JSON nested past what Python's parser can
take is refused in one line. Every message is one line that names the path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors.torch import save

__all__ = [
    "NotReadable",
    "check_regular",
    "file_digest",
    "open_regular",
    "read_bounded",
    "read_json",
    "save_tensors",
    "state_digest",
    "tensors_digest",
    "write_whole",
]

MB = 1 << 20


class NotReadable(ValueError):
    """A file from outside that is not read: missing, not a regular file, too large,
    or (JSON) not parseable. ``reason`` completes "PATH ...": ``does not exist``, ``is
    a folder``, ``is not a regular file (a character device)``, ..."""

    def __init__(self, path: str | os.PathLike[str], reason: str, *, missing: bool = False):
        super().__init__(f"{path} {reason}")
        self.path, self.reason, self.missing = str(path), reason, missing


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_regular(path: str | os.PathLike[str]) -> os.stat_result:
    """``path``'s status, if it is a regular file (links followed).

    Raises:
        NotReadable: it does not exist, cannot be looked at, or is a folder, a device,
            a FIFO or a socket (``missing`` set for the first).
    """
    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise NotReadable(path, "does not exist", missing=True) from None
    except OSError as exc:
        raise NotReadable(path, f"cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(found.st_mode):
        kind = _kind(found.st_mode)
        raise NotReadable(path, f"is {kind}, not a regular file")
    return found


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """The regular file ``path``, open for reading (the caller closes it).

    Opened without blocking and checked on the open file itself, so a path swapped for
    a FIFO between a check and the open cannot block the caller.

    Raises:
        NotReadable: as :func:`check_regular`.
    """
    check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise NotReadable(path, f"cannot be read ({exc.strerror or exc})") from None
    f = os.fdopen(fd, "rb")
    found = os.fstat(f.fileno())
    if not stat.S_ISREG(found.st_mode):
        f.close()
        raise NotReadable(path, f"is {_kind(found.st_mode)}, not a regular file")
    return f


def read_bounded(path: str | os.PathLike[str], *, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (opened as
    :func:`open_regular` does).

    Raises:
        NotReadable: as :func:`check_regular`, or it holds more than ``limit`` bytes.
    """
    with open_regular(path) as f:
        found = os.fstat(f.fileno())
        if found.st_size > limit:
            raise NotReadable(path, f"holds {found.st_size:,} bytes, more than {_size(limit)}")
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew while it was read
        raise NotReadable(path, f"holds more than {_size(limit)}")
    return data


def read_json(path: str | os.PathLike[str], *, limit: int = 64 * MB) -> Any:
    """The JSON value in the regular file ``path`` (at most ``limit`` bytes).

    Raises:
        NotReadable: as :func:`read_bounded`, or it is not JSON (truncated, not UTF-8,
            nested deeper than the parser can go).
    """
    data = read_bounded(path, limit=limit)
    try:
        return json.loads(data)
    except RecursionError:
        raise NotReadable(path, "nests its JSON too deep to be read") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise NotReadable(path, f"cannot be read ({exc}): it is truncated or not JSON") from None


def _size(limit: int) -> str:
    return f"{limit // MB} MB" if limit >= MB else f"{limit:,} bytes"


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


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tensors_digest(state: Mapping[str, torch.Tensor]) -> str:
    """A content hash of named tensors (names, dtypes, shapes and values): what a
    weights file held when it was written, checked whenever it is read again."""
    digest = hashlib.sha256()
    for name in sorted(state):
        _update(digest, state[name], name)
    return digest.hexdigest()[:16]


def state_digest(state: Any) -> str:
    """A content hash of a nested state (a checkpoint's dicts, lists, tensors and plain
    values), the same for the same state however it was stored."""
    digest = hashlib.sha256()
    _update(digest, state, "")
    return digest.hexdigest()


def _update(digest: Any, value: Any, name: str) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        digest.update(f"{name}:{{{len(value)};".encode())
        for key in sorted(value, key=lambda k: (type(k).__name__, str(k))):
            _update(digest, value[key], f"{type(key).__name__}:{key}")
    elif isinstance(value, (list, tuple)):
        digest.update(f"{name}:[{len(value)};".encode())
        for i, item in enumerate(value):
            _update(digest, item, str(i))
    else:
        digest.update(f"{name}={type(value).__name__}:{value!r};".encode())
