"""Where and how a trial runs: device, precision, and the torchrun process group."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from autosearch.errors import AutosearchError, ConfigError

__all__ = [
    "Runtime",
    "autocast",
    "backend_for",
    "broadcast_object",
    "init_distributed",
    "leave_distributed",
    "resolve",
    "world",
]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True, kw_only=True)
class Runtime:
    device: torch.device
    precision: str  # "fp32", "bf16" or "fp16", never "auto"
    rank: int = 0
    world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", 0))
            return torch.device("cuda", local % torch.cuda.device_count())
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AutosearchError(
            f"device {name!r} asked for, but CUDA is not available here; use device='auto' or 'cpu'"
        )
    return device


def _precision(name: str, device: torch.device) -> str:
    """ "auto" is bf16 on GPUs that have it, else fp16 with loss scaling on CUDA, and fp32
    elsewhere: on CPUs without native bf16, autocast trains several times slower."""
    if name not in PRECISIONS:
        raise AutosearchError(f"precision must be one of {PRECISIONS}, got {name!r}")
    if name != "auto":
        return name
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def resolve(*, device: str = "auto", precision: str = "auto") -> Runtime:
    """The runtime for this process: device and precision chosen, torchrun's rank read."""
    dev = _device(device)
    if dev.type == "cuda":
        # TF32 matmuls and convolutions: ~fp32 accuracy at tensor-core speed (Ampere on).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        # cuDNN's autotuner: a new architecture's first epoch comes closer to a steady
        # one with it (benchmarks/gpu.py measures both; a trial's batch shapes are few:
        # the full batch, the last, evaluation).
        # AUTOSEARCH_CUDNN_BENCHMARK=0 turns it off.
        torch.backends.cudnn.benchmark = os.environ.get("AUTOSEARCH_CUDNN_BENCHMARK", "1") != "0"
    rank, world_size = world()
    return Runtime(
        device=dev, precision=_precision(precision, dev), rank=rank, world_size=world_size
    )


def world() -> tuple[int, int]:
    """(rank, world size): from the process group, else torchrun's environment."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def backend_for(device: torch.device, local_ranks: int, gpus: int) -> str:
    """The process-group backend for ranks training on ``device``: nccl for CUDA, gloo
    otherwise (a CPU run on a machine with GPUs included). ``local_ranks`` processes on
    this machine need as many of its ``gpus``: two ranks never share one GPU."""
    if device.type != "cuda":
        return "gloo"
    if local_ranks > gpus:
        raise ConfigError(
            f"{local_ranks} processes per machine train on CUDA, but this machine has "
            f"{gpus} GPU(s): use --nproc-per-node {gpus} or fewer (one process per GPU), "
            "or device='cpu' to train on the CPU"
        )
    return "nccl"


def init_distributed(device: str = "auto") -> bool:
    """Join torchrun's process group, with the backend of the run's ``device`` (nccl for
    CUDA, gloo for the CPU even where CUDA exists); False when not under torchrun. Safe
    to call twice."""
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1 or not dist.is_available():
        return False
    if not dist.is_initialized():
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        backend = backend_for(_device(device), local_ranks, gpus)
        dist.init_process_group(backend=backend)
        if backend == "gloo":
            # One thread per process: on a shared CPU, ranks must not oversubscribe cores.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.get_world_size()))
    return True


def leave_distributed() -> None:
    """Leave torchrun's process group, every rank together. DDP wrappers of the run are
    collected first: a wrapper left to the interpreter's exit destroys its process group
    after torch's own teardown, and a rank aborted there ("terminate called without an
    active exception") after a run that had succeeded."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def broadcast_object(value: Any) -> Any:
    """Rank 0's ``value`` on every rank of the process group (the value itself when
    not distributed)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank of the process group (``flag`` itself when not
    distributed): a stop asked of one rank (a signal) is every rank's."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    flags: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(flag))
    return any(flags)


@contextlib.contextmanager
def autocast(runtime: Runtime, *, cache: bool = True) -> Iterator[None]:
    """Mixed-precision autocast for bf16 / fp16, nothing for fp32 (``cache``: autocast's
    cache of cast weights, which a CUDA graph's capture must do without)."""
    if runtime.precision == "fp32":
        yield
        return
    dtype = torch.bfloat16 if runtime.precision == "bf16" else torch.float16
    with torch.autocast(device_type=runtime.device.type, dtype=dtype, cache_enabled=cache):
        yield
