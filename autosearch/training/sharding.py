"""Candidates larger than one device: parameters, gradients and optimizer state sharded
over torchrun's ranks with PyTorch's own FSDP (``torch.distributed.fsdp.fully_shard``).

``TrainConfig(parallel="fsdp")`` shards over every rank; ``parallel="hsdp"`` shards
within groups of ``shard_size`` ranks (a node's, by default) and replicates across the
groups, on a two-dimensional device mesh ``(replicate, shard)``. Each rank still reads
its own share of every batch, as under DDP, so the global batch and the losses are those
of one process.

The trainer shards a copy of the candidate and trains it; the candidate itself gets the
trained weights back, whole, at the end (every rank), on the CPU: downstream (variants,
export, weights) sees an ordinary module. Checkpoints go through
``torch.distributed.checkpoint``: each rank writes its shards into a folder beside the
run's checkpoint file, and the file (written last, by rank 0) names the folder, so a
checkpoint is whole or not there; a run resumes at the same or another number of ranks
(DCP reshards on load).

What FSDP needs that DDP does not is checked here: a model whose steps use different
parts of it (a supernet's sandwich) trains under DDP; batch-norm statistics, which are
per rank and not sharded, are averaged over the ranks before each evaluation and
checkpoint (DDP copies rank 0's instead).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
import torch.nn as nn

from autosearch.errors import ConfigError
from autosearch.training import _checkpoint

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["PARALLEL", "Parallel", "held_bytes", "make_mesh", "place", "shard_model", "sharded"]

logger = logging.getLogger(__name__)

Parallel = Literal["ddp", "fsdp", "hsdp"]
PARALLEL: tuple[str, ...] = ("ddp", "fsdp", "hsdp")

# A module becomes its own FSDP unit once the parameters it holds (not counting those of
# units below it) reach this share of the model's: a few units per model, each gathered
# whole for its forward and backward, then freed (FSDP1's size-based policy, scaled).
UNIT_SHARE = 1 / 8


def sharded(parallel: str) -> bool:
    """Whether ``parallel`` shards the model (FSDP or HSDP) rather than replicating it."""
    return parallel in ("fsdp", "hsdp")


def place(
    model: nn.Module,
    device: torch.device,
    *,
    distributed: bool,
    parallel: str,
    shard_size: int | None,
    channels_last: bool,
) -> tuple[nn.Module, nn.Module]:
    """(the model trained, the model as stepped) on the run's device and ranks: whole
    (DDP-wrapped under torchrun), or a sharded copy (FSDP / HSDP), which goes to the
    device in shards, never whole."""
    together = distributed and sharded(parallel)
    if not together:
        model.to(device)
    if channels_last:  # supported by Module.to, though missing from its type stubs
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if together:
        model = shard_model(model, make_mesh(parallel, device, shard_size), device)
        return model, model
    if not distributed:
        return model, model
    ids = [device.index] if device.type == "cuda" else None
    # A model whose steps use different parts of it (a supernet's sandwich) says so.
    unused = bool(getattr(model, "find_unused_parameters", False))
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=unused)
    return model, ddp


def make_mesh(parallel: str, device: torch.device, shard_size: int | None) -> DeviceMesh:
    """The device mesh of a sharded run: one dimension of every rank (FSDP), or
    ``(replicate, shard)`` with ``shard_size`` ranks a group (HSDP; default: the ranks
    of one node, torchrun's ``LOCAL_WORLD_SIZE``)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    kind = device.type
    if parallel == "fsdp":
        return init_device_mesh(kind, (world,), mesh_dim_names=("shard",))
    size = shard_size or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if size < 1 or world % size:
        raise ConfigError(
            f"parallel='hsdp' with shard_size={size} cannot split {world} ranks into equal "
            f"groups: use a shard_size that divides {world} (e.g. the ranks of one node)"
        )
    if size == world:
        logger.info("hsdp: one group of all %d ranks, the same as parallel='fsdp'", world)
    return init_device_mesh(kind, (world // size, size), mesh_dim_names=("replicate", "shard"))


def shard_model(model: nn.Module, mesh: DeviceMesh, device: torch.device) -> nn.Module:
    """A sharded copy of ``model`` on ``mesh`` (``model`` itself is left as it is): rank
    0's weights on every rank first (as DDP does), then FSDP units bottom-up, the root
    last."""
    from torch.distributed.fsdp import fully_shard

    if getattr(model, "find_unused_parameters", False):
        raise ConfigError(
            f"{type(model).__name__} uses different parts of itself in each step (a "
            "supernet's): it trains under DDP, not sharded; set parallel='ddp'"
        )
    net = copy.deepcopy(model)
    with torch.no_grad():
        for tensor in net.state_dict().values():  # one tensor on the device at a time
            moved = tensor.to(device)
            dist.broadcast(moved, src=0)
            tensor.copy_(moved)
    threshold = max(1, int(sum(p.numel() for p in net.parameters()) * UNIT_SHARE))

    def units(module: nn.Module) -> int:
        """Shard the units below ``module``; the parameters it holds outside them."""
        held = sum(p.numel() for p in module.parameters(recurse=False))
        for child in module.children():
            below = units(child)
            if below >= threshold:
                fully_shard(child, mesh=mesh)
            else:
                held += below
        return held

    units(net)
    fully_shard(net, mesh=mesh)
    return net


def average_buffers(net: nn.Module) -> None:
    """Average the floating-point buffers (batch-norm statistics) over every rank: FSDP
    leaves them per rank; evaluation and the checkpoint need one value."""
    world = dist.get_world_size()
    with torch.no_grad():
        for buffer in net.buffers():
            if buffer.is_floating_point():
                dist.all_reduce(buffer)
                buffer.div_(world)


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes of parameters and of optimizer state this rank holds, measured from the
    tensors (a sharded tensor counts its local shard only)."""

    def size(tensor: Any) -> int:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return int(local.numel() * local.element_size())

    held = {"parameters": sum(size(p) for p in model.parameters())}
    if optimizer is not None:
        held["optimizer"] = sum(
            size(value)
            for state in optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor) and value.dim() > 0
        )
    return held


def full_weights(net: nn.Module, model: nn.Module) -> None:
    """Copy the sharded ``net``'s trained weights, whole, into ``model`` on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True))
    model.load_state_dict({k: torch.as_tensor(v).detach().cpu() for k, v in state.items()})


# --- checkpoints -------------------------------------------------------------------------


def _together() -> bool:
    """Whether this process is one rank of several (a sharded run in one process writes
    and reads the same checkpoint format, alone)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextlib.contextmanager
def _quiet_alone() -> Iterator[None]:
    """DCP warns that it assumes one process each time one process uses it: it is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def shards_folder(path: Path, epoch: int) -> Path:
    return path.with_name(f"{path.name}.shards-{epoch}")


def save_shards(path: Path, epoch: int, net: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Every rank writes its shards of the model and optimizer after ``epoch``; the
    folder's name (for the checkpoint file, which rank 0 writes after)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = shards_folder(path, epoch)
    if (not _together() or dist.get_rank() == 0) and folder.exists():
        shutil.rmtree(folder)  # a half-written one of a run killed in this epoch's save
    if _together():
        dist.barrier()
    model_state, optim_state = get_state_dict(net, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    with _quiet_alone():
        dcp.save(state, checkpoint_id=folder, no_dist=not _together())
    return folder.name


def load_shards(
    path: Path,
    name: str,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    digests: dict[str, str] | None = None,
) -> None:
    """Load the shards a checkpoint file names into this run's sharded ``net`` and
    ``optimizer`` (resharded to this run's number of ranks). The folder is read as data
    only (:mod:`._shard_reader`) and checked whole before any rank loads from it (each
    rank its share of the files against the ``digests`` the checkpoint holds); every
    rank raises the same :class:`UnreadableShards` where any rank finds it damaged."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from autosearch.training import _shard_reader
    from autosearch.training._shard_reader import UnreadableShards

    folder = path.with_name(name)
    failure = None
    try:
        rank, world = (dist.get_rank(), dist.get_world_size()) if _together() else (0, 1)
        _shard_reader.check(folder, digests or {}, share=(rank, world))
    except UnreadableShards as exc:
        failure = str(exc)
    failure = _first_failure(failure)
    if failure is not None:
        raise UnreadableShards(failure)
    model_state, optim_state = get_state_dict(net, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    reader, planner = _shard_reader.SafeReader(folder), _shard_reader.SafeLoadPlanner()
    try:
        with _quiet_alone():
            dcp.load(
                state,
                storage_reader=reader,
                planner=planner,
                no_dist=not _together(),
            )
    except dcp.CheckpointException as exc:  # a BaseException: each rank's failure inside
        raise UnreadableShards(f"{folder}: {_rank_failure(exc)}") from None
    set_state_dict(
        net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def _first_failure(failure: str | None) -> str | None:
    """The first rank's failure, on every rank (each checked the folder on its own)."""
    if not _together():
        return failure
    failures: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(failures, failure)
    return next((f for f in failures if f is not None), None)


def _rank_failure(exc: BaseException) -> str:
    """One line of what went wrong on the first failing rank inside DCP."""
    for rank, (error, _trace) in sorted(getattr(exc, "failures", {}).items()):
        lines = str(error).strip().splitlines()
        return f"rank {rank}: {type(error).__name__}" + (f": {lines[0][:200]}" if lines else "")
    return type(exc).__name__


def drop_older_shards(path: Path, keep: str) -> None:
    """Rank 0, once the checkpoint file names ``keep``: the earlier epochs' shards go."""
    for folder in path.parent.glob(f"{path.name}.shards-*"):
        # Epochs' folders only: one moved aside as unreadable is kept for a look.
        if folder.name != keep and folder.name.rpartition("-")[2].isdigit():
            shutil.rmtree(folder, ignore_errors=True)


def _shard_digests(folder: Path) -> dict[str, str]:
    from autosearch.training import _shard_reader  # DCP's import: only where shards are

    return _shard_reader.digests(folder)


def save_checkpoint(
    path: Path,
    epoch: int,
    history: list[dict[str, Any]],
    loop: _checkpoint.Resumable,
    settings: dict[str, Any],
    split: bool,
    rank: int,
) -> None:
    """A run's checkpoint after ``epoch``: rank 0's file; when ``split`` (sharded),
    every rank's shards first, then the file that names them (whole or not there)."""
    shards = save_shards(path, epoch, loop.model, loop.optimizer) if split else None
    if rank == 0:
        digests = _shard_digests(path.with_name(shards)) if shards else None
        _checkpoint.save(path, epoch, history, loop, settings, shards=shards, shard_digests=digests)
        if shards is not None:
            drop_older_shards(path, keep=shards)
