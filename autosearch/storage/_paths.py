"""Paths built from names that came from outside (an object storage's keys, a stored
study's artifact ids): confined to their folder by construction."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["inside", "plain_name"]

NAME_MAX = 255  # bytes in one file name (Linux, macOS and Windows file systems)
PATH_MAX = 4096  # bytes in a whole path (Linux)


def inside(root: Path, relative: str) -> Path | None:
    """``root / relative`` when ``relative`` is a plain relative path (``/``-separated
    names: no absolute part, no ``..``, ``.`` or empty part, no backslash or NUL, none
    longer than a file system takes) that, with every link resolved, stays inside
    ``root``; otherwise None."""
    if not isinstance(relative, str) or not relative or "\\" in relative or "\x00" in relative:
        return None
    parts = relative.split("/")
    if any(part in ("", ".", "..") or not _fits(part, NAME_MAX) for part in parts):
        return None
    candidate = Path(root).joinpath(*parts)
    if not _fits(str(candidate.absolute()), PATH_MAX - 1):
        return None
    try:
        resolved, base = candidate.resolve(), Path(root).resolve()
    except (OSError, RuntimeError):  # a link loop
        return None
    return candidate if resolved.is_relative_to(base) and resolved != base else None


def _fits(name: str, limit: int) -> bool:
    """Whether ``name`` encodes for the file system in at most ``limit`` bytes."""
    try:
        return len(os.fsencode(name)) <= limit
    except UnicodeError:  # a lone surrogate: no file system name
        return False


def plain_name(name: object) -> bool:
    """Whether ``name`` is one plain file name (an artifact id): no separator, not ``.``
    or ``..``, no NUL, at most 255 bytes (what file systems hold, in UTF-8)."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and len(name.encode("utf-8", "surrogatepass")) <= 255
        and not any(c in name for c in "/\\\x00")
    )
