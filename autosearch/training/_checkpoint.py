"""A training run's checkpoint: its whole state after an epoch (model, optimizer,
schedule, loss scaler, random states, history), written whole, and resumed only by a
run of the same settings; one that cannot be read is moved aside, never loaded as code
(``weights_only``)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn

from autosearch._files import state_digest
from autosearch.errors import PlatformError

__all__ = ["Resumable", "describe", "read", "read_or_set_aside", "restore", "save", "write_state"]

# The key under which a checkpoint holds the digest of the rest of its state.
DIGEST = "sha256"

logger = logging.getLogger(__name__)


class Resumable(Protocol):
    """What a checkpoint holds of a training run (autosearch.training.train's loop)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Any
    scaler: torch.amp.GradScaler
    generator: torch.Generator


def save(
    path: Path,
    epoch: int,
    history: list[dict[str, Any]],
    loop: Resumable,
    settings: dict[str, Any],
    *,
    shards: str | None = None,
    shard_digests: dict[str, str] | None = None,
) -> None:
    """Write the run's state after ``epoch``: to a temporary file of this process, then
    renamed, so a crash mid-write leaves the previous checkpoint whole. A file that
    cannot be written is the platform's failure (a read-only or full disk), not the
    candidate's. ``shards``: the folder beside it where a sharded run's ranks wrote the
    model and optimizer (:mod:`autosearch.training.sharding`); the file names it, with
    the digest of each of its files. The file holds the digest of its whole state."""
    weights: dict[str, Any] = (
        {"shards": shards, "shard_digests": dict(shard_digests or {})}
        if shards is not None
        else {"model": loop.model.state_dict(), "optimizer": loop.optimizer.state_dict()}
    )
    state = {
        "settings": json.dumps(settings, sort_keys=True),
        "epoch": epoch,
        "history": list(history),
        **weights,
        "schedule": loop.schedule.state_dict(),
        "scaler": loop.scaler.state_dict(),
        "generator": loop.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }
    write_state(path, state)


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (tensors and plain values) whole, with the digest :func:`read`
    checks: to a temporary name, then renamed over ``path``."""
    state = {**state, DIGEST: state_digest(state)}
    # Serialised in memory, then written by Python: a failed write then says why (torch's
    # own writer reports a full disk as "unexpected pos").
    buffer = io.BytesIO()
    torch.save(state, buffer)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(buffer.getbuffer())
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise PlatformError(f"cannot write checkpoint {path}: {exc.strerror or exc}") from None


def read_or_set_aside(path: Path) -> dict[str, Any] | None:
    """The state written at ``path`` (:func:`write_state`); None where there is none, or
    where it cannot be read whole: then it is moved aside (``NAME.unreadable``), said in
    one line, and the caller starts from scratch."""
    if not path.is_file():
        return None
    try:
        return read(path)
    except Exception as exc:
        aside = path.with_name(f"{path.name}.unreadable")
        _set_aside(path, aside)
        logger.warning("checkpoint %s cannot be read (%s); moved to %s", path, describe(exc), aside)
        return None


def restore(
    path: Path,
    loop: Resumable,
    settings: dict[str, Any],
    *,
    load_shards: Callable[[str, dict[str, str]], None] | None = None,
    first_rank: bool = True,
) -> tuple[int, list[dict[str, Any]]]:
    """Resume from the checkpoint at ``path``: (next epoch, history so far). One that
    cannot be read (corrupt, truncated, or holding anything but tensors and plain
    values) is moved aside and the run starts from scratch; one of a run with other
    ``settings`` is not resumed (it is overwritten after the first epoch).
    ``load_shards``: this run keeps its model and optimizer in shards (FSDP); it reads
    them from the folder the file names (at this run's number of ranks). Only the
    ``first_rank`` of a run moves an unreadable checkpoint aside (every rank finds it
    unreadable alike)."""
    fresh = (copy.deepcopy(loop.model.state_dict()), copy.deepcopy(loop.optimizer.state_dict()))
    shards: str | None = None
    try:
        state = read(path)
        differ = _differences(state.get("settings"), settings)
        if not differ and (load_shards is not None) != ("shards" in state):
            differ = "parallel: " + ("sharded -> not" if "shards" in state else "not -> sharded")
        if differ:
            logger.warning(
                "checkpoint %s is of a run with other settings (%s); training from scratch",
                path,
                differ,
            )
            return 1, []
        if load_shards is not None:
            shards = _folder_name(state["shards"])
            load_shards(shards, dict(state.get("shard_digests") or {}))
        else:
            loop.model.load_state_dict(state["model"])
            loop.optimizer.load_state_dict(state["optimizer"])
        loop.schedule.load_state_dict(state["schedule"])
        loop.scaler.load_state_dict(state["scaler"])
        loop.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        return int(state["epoch"]) + 1, list(state["history"])
    except Exception as exc:
        loop.model.load_state_dict(fresh[0])
        loop.optimizer.load_state_dict(fresh[1])
        aside = path.with_name(f"{path.name}.unreadable")
        if first_rank:
            _set_aside(path, aside)
            if shards is not None:  # the rest of the same state, out of the way
                _set_aside(path.with_name(shards), path.with_name(f"{shards}.unreadable"))
        logger.warning(
            "checkpoint %s cannot be read (%s); moved to %s, training from scratch",
            path,
            describe(exc),
            aside,
        )
        return 1, []


def read(path: Path) -> dict[str, Any]:
    """The state a checkpoint file holds, checked against the digest it was written
    with (a file with a bit changed is as unreadable as a cut one).

    Raises:
        ValueError: the file does not hold what it was written with.
        Exception: torch's own, for a file that is not a checkpoint at all.
    """
    # weights_only: a checkpoint holds tensors and plain values, never objects.
    state = torch.load(path, weights_only=True, map_location="cpu")
    if not isinstance(state, dict):
        raise ValueError(f"it holds a {type(state).__name__}, not a checkpoint's state")
    stored = state.pop(DIGEST, None)
    if stored is not None and stored != state_digest(state):
        raise ValueError("its contents differ from what was written (digest mismatch)")
    return state


def _folder_name(name: Any) -> str:
    """The shard folder a checkpoint names: a plain name beside it, nothing else."""
    if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
        raise ValueError(f"the checkpoint names shards at {name!r}, not a folder beside it")
    return name


def _set_aside(path: Path, aside: Path) -> None:
    """Move ``path`` (a file or a folder) to ``aside``, replacing an older one there."""
    try:
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside)
        path.replace(aside)
    except FileNotFoundError:
        pass  # a folder the checkpoint named and that is not there
    except OSError as err:
        raise PlatformError(
            f"checkpoint {path} cannot be read and cannot be moved aside: {err.strerror}"
        ) from None


def describe(exc: BaseException) -> str:
    """What went wrong reading a checkpoint, in one line. torch's refusal of an object
    comes with advice to load it as code: only the line that names the object is kept."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if lines and lines[0].startswith("Weights only load failed"):
        named = [line for line in lines[1:] if "weights_only" not in line]
        named = [line for line in named if not line.startswith("Check the documentation")]
        return f"not tensors and plain values only: {named[0][:200] if named else 'objects'}"
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def _differences(stored: Any, settings: dict[str, Any]) -> str:
    """The settings a checkpoint's run differs in (``lr 0.05 -> 0.9``), or "". A
    checkpoint that records none (written before settings were recorded) is resumed."""
    if stored is None:
        return ""
    then = json.loads(stored) if isinstance(stored, str) else {}
    return ", ".join(
        f"{key} {then.get(key)!r} -> {value!r}"
        for key, value in settings.items()
        if json.loads(json.dumps(value)) != then.get(key)
    )
