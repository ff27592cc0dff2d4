"""A supernet's weights as a file of their own: ``study.supernet.save(path)`` writes
them (safetensors, with the supernet's fingerprint and content hash), and another study
of the same supernet imports them (``SupernetConfig(weights=path)``) instead of
training: one supernet serves studies of several budgets.

An imported file is data from outside: a folder, a device, another supernet's
weights, tensors of other shapes or weights that are not finite are each refused in one
line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import load_file

from autosearch._files import save_tensors
from autosearch.errors import ConfigError, PlatformError

__all__ = ["FILE_NAME", "fit", "load", "save"]

FILE_NAME = "supernet.safetensors"  # the file written into a folder given as the target


def fit(net: nn.Module, weights: dict[str, torch.Tensor]) -> str | None:
    """Load ``weights`` into ``net``; what is wrong with them (None: they fit)."""
    bad = [k for k, v in weights.items() if v.is_floating_point() and not v.isfinite().all()]
    if bad:
        return f"{len(bad)} tensors hold NaN or infinite values, {bad[0]} first"
    try:
        net.load_state_dict(weights)
    except RuntimeError as exc:  # names or shapes of another network
        return (str(exc).strip().splitlines() or [""])[-1].strip()
    return None


def load(net: nn.Module, path: str, fingerprint: str) -> dict[str, Any]:
    """Load the weights file at ``path`` into ``net`` (a supernet of ``fingerprint``);
    what the job stores of it.

    Raises:
        ConfigError: the path is not a weights file of this supernet, or its tensors
            do not fit or are not finite.
    """
    where = Path(path)
    if where.is_dir():
        raise ConfigError(
            f"supernet weights {path} is a folder; name the weights file in it "
            f"({where / FILE_NAME}, as study.supernet.save(folder) writes)"
        )
    if not where.exists():
        raise ConfigError(f"supernet weights {path} do not exist; check the path")
    if not where.is_file():
        raise ConfigError(f"supernet weights {path} is not a regular file; name a weights file")
    try:
        with safe_open(str(where), framework="pt") as f:  # type: ignore[no-untyped-call]
            metadata = f.metadata() or {}
        state = load_file(str(where))
    except Exception as exc:  # safetensors' own errors: not a weights file
        raise ConfigError(f"supernet weights {path} cannot be read: {exc}") from None
    if metadata.get("fingerprint") != fingerprint:
        raise ConfigError(
            f"supernet weights {path} are of another supernet (fingerprint "
            f"{metadata.get('fingerprint')!r}, this study's is {fingerprint!r}): its space, "
            "elastic and fixed genes, and its images must be the same"
        )
    problem = fit(net, state)
    if problem:
        raise ConfigError(f"supernet weights {path} cannot be used: {problem}")
    return {"imported_from": str(path)}


def save(net: nn.Module, path: str | Path, *, fingerprint: str, digest: str) -> Path:
    """Write ``net``'s weights to ``path`` (a file; or, for a folder, ``FILE_NAME`` in
    it) with its fingerprint and digest; the file written.

    Raises:
        ConfigError: ``path`` names something that is not a file or a folder (a device).
        PlatformError: it cannot be written.
    """
    out = Path(path)
    if out.is_dir():
        out = out / FILE_NAME
    if out.exists() and not out.is_file():
        raise ConfigError(f"{out} is not a regular file or a folder; name a file to write")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        save_tensors(net.state_dict(), out, metadata={"fingerprint": fingerprint, "digest": digest})
    except OSError as exc:
        raise PlatformError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out
