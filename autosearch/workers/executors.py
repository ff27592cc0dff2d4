"""Where ``optimize(n, n_workers=K, executor=...)`` starts its K workers.

Each worker is one call of the same function (open the study from its storage, run
a share of the trials); the executor only places the calls and waits for them. The
study's storage coordinates the trials whatever the executor, so a worker lost with
its machine is started again by the engine and its trial resumes from its checkpoint
through the heartbeat protocol (a bucket or a shared folder holds the checkpoints).

``"process"`` (default)   processes on this machine (forked from a fork server)
``RayExecutor(...)``      Ray tasks on a Ray cluster (``"ray"``: the cluster at
                          ``RAY_ADDRESS``, or a local one); ``pip install 'autosearch[ray]'``
``SlurmExecutor(...)``    a Slurm job array through submitit (``cluster="local"`` runs
                          the jobs as local processes); ``pip install 'autosearch[slurm]'``

Storage and artifacts must be reachable from every worker: a PostgreSQL URL (or a
file on a shared file system, by absolute path) and an absolute folder or a bucket.
More workers than GPUs share them: autosearch.training.placement's rule (a trial's
size against a GPU's free memory) says how many fit on one and refuses more; the local
pool spreads its workers over the GPUs and runs those sharing one under CUDA MPS where
it can start, and ``RayExecutor(num_gpus="auto")`` asks Ray for the rule's fraction.
``per_gpu=`` on either overrides the rule.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from autosearch._checks import check_fields, flag, real, whole
from autosearch.data import _stream
from autosearch.errors import ConfigError, PlatformError
from autosearch.training import placement
from autosearch.training.placement import Need
from autosearch.workers import _mps, _ray_connect
from autosearch.workers._collection import settle, skip_final_collection

__all__ = ["Executor", "ProcessExecutor", "RayExecutor", "SlurmExecutor", "resolve_executor"]

logger = logging.getLogger(__name__)

_POLL_SECONDS = 1.0
Call = dict[str, Any]


class Executor(Protocol):
    """Runs ``worker(**call)`` for each call, somewhere; calls ``poll()`` about once a
    second while they run; returns their results in call order."""

    def map(
        self, worker: Callable[..., Any], calls: Sequence[Call], poll: Callable[[], None]
    ) -> list[Any]: ...

    def resources(self, n_workers: int, need: Callable[[], Need]) -> tuple[int, list[int | None]]:
        """(CPU threads per worker, each worker's GPU where this side assigns GPUs, else
        None each). ``need``: what one trial holds on a GPU, for the placement rule."""
        ...


@dataclass(frozen=True)
class ProcessExecutor:
    """Processes on this machine: CPU threads shared evenly, workers spread
    over the GPUs evenly, as many on one as the placement rule fits (``per_gpu``:
    that many instead). Workers sharing a GPU run under a CUDA MPS daemon of the run's
    own where one can start (``mps``: None, where it can; True, or refuse; False,
    never). A worker process that dies (killed, out of memory) is started again, as
    Ray starts a lost task again, at most ``max_retries`` times each: it runs what its
    share still owes, and the trial it held resumes from its checkpoint. A worker whose
    parent dies is sent SIGTERM (Linux): it stops after its epoch's checkpoint."""

    per_gpu: int | None = None
    mps: bool | None = None
    max_retries: int = 3

    def __post_init__(self) -> None:
        check_fields(
            "ProcessExecutor",
            self,
            [
                ("per_gpu", lambda v: v is None or whole(1)(v), "None or a whole number >= 1"),
                ("mps", lambda v: v is None or flag(v), "None (where it can start), True or False"),
                ("max_retries", whole(0), "a whole number >= 0"),
            ],
        )

    def map(
        self, worker: Callable[..., Any], calls: Sequence[Call], poll: Callable[[], None]
    ) -> list[Any]:
        context = _stream.worker_context(*_POOL_PRELOAD)
        with self._sharing(calls) as env:
            runs = [_Retried(worker, {**call, "env": env}, context) for call in calls]
            try:
                while not all(run.done(self.max_retries) for run in runs):
                    pending = [r.future for r in runs if not r.future.done()]
                    wait(pending, timeout=_POLL_SECONDS, return_when=FIRST_COMPLETED)
                    poll()
                return [run.result() for run in runs]
            finally:
                for run in runs:
                    run.pool.shutdown(wait=True, cancel_futures=True)

    def resources(self, n_workers: int, need: Callable[[], Need]) -> tuple[int, list[int | None]]:
        # The threads this process may use (torch's count: the cores, or what
        # OMP_NUM_THREADS or torch.set_num_threads made it), shared evenly.
        threads = max(1, torch.get_num_threads() // n_workers)
        gpus = placement.assign(n_workers, _free_memory(), need, per_gpu_override=self.per_gpu)
        return threads, gpus

    def _sharing(self, calls: Sequence[Call]) -> contextlib.AbstractContextManager[dict[str, str]]:
        """The environment of the run's MPS daemon where workers share a GPU (see ``mps``)."""
        gpus = [c.get("gpu") for c in calls if c.get("gpu") is not None]
        shared = len(gpus) > len(set(gpus))
        if self.mps is False or not (shared or self.mps):
            return contextlib.nullcontext({})
        return _mps.daemon(required=bool(self.mps))


class _Retried:
    """One worker call in a process of its own, started again when that process dies."""

    def __init__(self, worker: Callable[..., Any], call: Call, context: Any) -> None:
        self.worker, self.call, self.context = worker, call, context
        self.retries = 0
        self.start()

    def start(self) -> None:
        parent = os.getpid()
        self.pool = ProcessPoolExecutor(
            1, mp_context=self.context, initializer=_follow_parent, initargs=(parent,)
        )
        self.lost = "ended abruptly: killed, or out of memory?"  # if it is lost
        # The environment this process has now, as a spawned process would get it (a
        # fork server's children start with the server's, from its own start).
        try:
            self.future: Future[Any] = self.pool.submit(
                _run_then_leave_if_orphaned, self.worker, parent, dict(os.environ), **self.call
            )
        except (EOFError, OSError, BrokenProcessPool) as exc:
            # The fork server died as it was asked (found alive just before), or the
            # machine refused a process: as a death (started again, the server too).
            self.lost = f"could not start ({type(exc).__name__}: {exc})"
            self.future = Future()
            self.future.set_exception(BrokenProcessPool(self.lost))

    def result(self) -> Any:
        """The call's result; a worker that kept dying is one line, not a traceback."""
        try:
            return self.future.result()
        except BrokenProcessPool:
            raise PlatformError(
                f"worker {self.call.get('worker')} died {self.retries + 1} times (its process "
                f"{self.lost}); the run stops, and its trial resumes from its checkpoint on "
                "the next run"
            ) from None

    def done(self, max_retries: int) -> bool:
        """Whether the call has ended (started again first if its process died and
        retries are left)."""
        if not self.future.done():
            return False
        if not isinstance(self.future.exception(), BrokenProcessPool):
            return True
        if self.retries >= max_retries:
            return True  # its result() says so
        self.retries += 1
        logger.warning(
            "worker %s died (its process %s); started again (%d of %d); its trial resumes "
            "from its checkpoint",
            self.call.get("worker"),
            self.lost,
            self.retries,
            max_retries,
        )
        self.pool.shutdown(wait=True)
        self.start()
        return False


# What a pool's fork server loads once for all of its workers, beyond torch: the
# worker's code, and torch's compiler, which every optimizer's first step imports
# (torch._dynamo: 1.4 to 1.8 s of each process on a 2-core Zen 3).
_POOL_PRELOAD = ("torch._dynamo", "autosearch.workers.pool")

_orphaned = threading.Event()  # set in a worker whose pool's process has died


def _run_then_leave_if_orphaned(
    target: Callable[..., Any], parent: int, environ: dict[str, str], /, **call: Any
) -> Any:
    """``target(**call)`` in the pool's environment ``environ``; then, if the parent died
    meanwhile (its SIGTERM stopped the work), exit: a pool's worker would otherwise wait
    for its next call for ever."""
    os.environ.clear()
    os.environ.update(environ)
    try:
        return target(**call)
    finally:
        if _orphaned.is_set() or not _alive(parent):
            logging.shutdown()
            os._exit(0)


def _alive(pid: int) -> bool:
    """Whether the pool's process ``pid`` still runs (a pid now another user's is not
    it: that process ended, and its pid was given again)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _follow_parent(parent: int) -> None:
    """In a worker process: SIGTERM when the pool's process ``parent`` dies (Linux), so
    that no worker outlives the run that started it; it stops after its epoch's
    checkpoint. A thread waits on the parent's pidfd: the worker's own parent is the
    fork server, which lives on while any of its children does. What the fork server
    loaded is frozen first (the worker holds nothing else yet: _collection.py)."""
    settle()
    skip_final_collection()
    try:
        handle = os.pidfd_open(parent)
    except ProcessLookupError:  # the parent died before the call
        _orphaned.set()
        os.kill(os.getpid(), signal.SIGTERM)
        return
    except (AttributeError, OSError):  # no pidfd here: checked after the call only
        return
    threading.Thread(target=_term_when_gone, args=(handle,), daemon=True).start()


def _term_when_gone(handle: int) -> None:
    select.select([handle], [], [])  # readable once the process has ended
    _orphaned.set()
    os.kill(os.getpid(), signal.SIGTERM)


_FREE_PROBE = (
    "import json, torch; "
    "print(json.dumps([torch.cuda.mem_get_info(g)[0] for g in range(torch.cuda.device_count())]))"
)


def _free_memory() -> list[int]:
    """The free memory of each GPU this process sees, in bytes (none on a CPU machine).
    Reading it takes a CUDA context on every GPU, which a pool's parent would then hold
    for the whole run (about 0.5 GiB of each): where this process has none yet, a
    short-lived process reads it."""
    gpus = torch.cuda.device_count()
    if gpus == 0:
        return []
    if torch.cuda.is_initialized():
        return [torch.cuda.mem_get_info(g)[0] for g in range(gpus)]
    read = subprocess.run(
        [sys.executable, "-c", _FREE_PROBE], capture_output=True, text=True, timeout=300
    )
    if read.returncode != 0:
        said = (read.stderr.strip().splitlines() or ["no message"])[-1]
        raise PlatformError(f"could not read the GPUs' free memory: {said}")
    return [int(free) for free in json.loads(read.stdout)]


@dataclass(frozen=True)
class RayExecutor:
    """Each worker a Ray task with these resources; Ray places the tasks on the
    cluster's nodes and runs a task again (``max_retries``) when its worker process or
    node dies. ``num_gpus`` may be fractional, so that several small candidates share
    one GPU. ``address``: the cluster (None: ``RAY_ADDRESS``, else a local one);
    ``env_vars``: environment variables the workers get (object-store credentials,
    ``AUTOSEARCH_HEARTBEAT_GRACE``; a Ray node otherwise has its own environment);
    ``init`` is passed on to ``ray.init`` when this process has not joined a cluster
    yet (``_node_ip_address``, ``runtime_env``, ...).

    ``num_gpus="auto"``: the placement rule's fraction, ``1 / per_gpu``, with
    ``per_gpu`` given or from a trial's size and the free memory of a GPU of the cluster
    (read by one task on a GPU node); 0 on a cluster without GPUs."""

    address: str | None = None
    num_cpus: float = 1
    num_gpus: float | Literal["auto"] = 0
    max_retries: int = 3
    env_vars: dict[str, str] = field(default_factory=dict)
    init: dict[str, Any] = field(default_factory=dict)
    per_gpu: int | None = None
    _resolved: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        auto = self.num_gpus == "auto"
        check_fields(
            "RayExecutor",
            self,
            [
                ("num_gpus", lambda v: v == "auto" or real(0)(v), "a number >= 0, or 'auto'"),
                ("per_gpu", lambda v: v is None or whole(1)(v), "None or a whole number >= 1"),
            ],
        )
        if self.per_gpu is not None and not auto:
            raise ConfigError(
                f"per_gpu={self.per_gpu} sets the GPU fraction only with num_gpus='auto'; "
                f"drop one (num_gpus={self.num_gpus!r} is what each worker asks for)"
            )

    @property
    def gpus_per_worker(self) -> float:
        """What each worker asks Ray for: ``num_gpus``, or the rule's fraction once
        :meth:`resources` resolved ``"auto"``."""
        if self.num_gpus != "auto":
            return float(self.num_gpus)
        if "num_gpus" not in self._resolved:
            raise ConfigError("num_gpus='auto' is resolved by resources() before map()")
        return self._resolved["num_gpus"]

    def map(
        self, worker: Callable[..., Any], calls: Sequence[Call], poll: Callable[[], None]
    ) -> list[Any]:
        ray = self._connect()
        self._check_fits(ray)
        task = ray.remote(
            num_cpus=self.num_cpus,
            num_gpus=self.gpus_per_worker,
            max_retries=self.max_retries,
            runtime_env={"env_vars": dict(self.env_vars)} if self.env_vars else None,
        )(worker)
        refs = [task.remote(**call) for call in calls]
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL_SECONDS)
            poll()
        return list(ray.get(refs))

    def resources(self, n_workers: int, need: Callable[[], Need]) -> tuple[int, list[int | None]]:
        if self.num_gpus == "auto":
            self._resolved["num_gpus"] = self._fraction(self._connect(), need)
        return max(1, int(self.num_cpus)), [None] * n_workers  # Ray sets each task's GPUs

    def _connect(self) -> Any:
        ray = _require("ray", "ray")
        # Where a Ray worker dies, the driver prints the cluster's message through Ray's
        # progress-bar manager, which replaces ``builtins.print`` for the rest of this
        # process (the user's): Ray's own switch keeps the user's print, unless the user
        # set it.
        os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS")
            _ray_connect.check_head(address)
            _ray_connect.check_token(address)
            try:
                ray.init(address=self.address, **{"log_to_driver": False, **self.init})
            except Exception as exc:
                if not _ray_connect.token_refused(exc):
                    raise
                advice = _ray_connect.token_advice(address or "the local cluster")
                raise PlatformError(advice) from None
        return ray

    def _fraction(self, ray: Any, need: Callable[[], Need]) -> float:
        """The placement rule's GPU fraction on this cluster (0 where it has no GPU)."""
        if ray.cluster_resources().get("GPU", 0) < 1:
            return 0.0
        if self.per_gpu is not None:
            return 1 / self.per_gpu
        free = ray.get(ray.remote(num_gpus=1, num_cpus=0)(_free_gpu_memory).remote())
        return 1 / placement.per_gpu(need(), free)

    def _check_fits(self, ray: Any) -> None:
        """Refuse workers no node of the cluster can run (Ray would wait for such a node
        forever, silently)."""
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        gpus = self.gpus_per_worker
        if any(n.get("CPU", 0) >= self.num_cpus and n.get("GPU", 0) >= gpus for n in nodes):
            return
        largest = (
            ", ".join(f"{n.get('CPU', 0):g} CPUs and {n.get('GPU', 0):g} GPUs" for n in nodes)
            or "no live node"
        )
        raise ConfigError(
            f"each worker asks Ray for {self.num_cpus:g} CPUs and {gpus:g} GPUs, but "
            f"no node of the cluster has that (its nodes: {largest}); lower num_cpus / "
            "num_gpus of the RayExecutor, or add a node that has them"
        )


@dataclass(frozen=True)
class SlurmExecutor:
    """Workers as a Slurm job array, submitted with submitit; each job's output and
    pickled result in ``folder``. ``cluster="local"`` runs the jobs as processes here
    (submitit's local executor), ``None`` picks Slurm where ``sbatch`` exists. The
    ``slurm_*`` fields are Slurm's: partition, time limit (minutes), CPUs and GPUs per
    task; ``options`` adds any other of submitit's parameters."""

    folder: str = "runs/slurm"
    cluster: str | None = None
    slurm_partition: str | None = None
    timeout_min: int = 60
    cpus_per_task: int = 1
    gpus_per_task: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def map(
        self, worker: Callable[..., Any], calls: Sequence[Call], poll: Callable[[], None]
    ) -> list[Any]:
        submitit = _require("submitit", "slurm")
        executor = submitit.AutoExecutor(folder=str(Path(self.folder)), cluster=self.cluster)
        parameters: dict[str, Any] = {
            "timeout_min": self.timeout_min,
            "cpus_per_task": self.cpus_per_task,
            **self.options,
        }
        if executor.cluster == "slurm":
            parameters["slurm_partition"] = self.slurm_partition
            parameters["slurm_gpus_per_task"] = self.gpus_per_task
        executor.update_parameters(**{k: v for k, v in parameters.items() if v is not None})
        jobs = executor.map_array(_Call(worker), list(calls))
        while not all(job.done() for job in jobs):
            poll()
            time.sleep(_POLL_SECONDS)
        poll()
        return [job.result() for job in jobs]

    def resources(self, n_workers: int, need: Callable[[], Need]) -> tuple[int, list[int | None]]:
        return self.cpus_per_task, [None] * n_workers  # Slurm sets each job's visible GPUs


def _free_gpu_memory() -> int:
    """On a Ray GPU node, in a task given one GPU: its free memory, in bytes."""
    import torch

    return int(torch.cuda.mem_get_info()[0])


@dataclass(frozen=True)
class _Call:
    """``worker(**call)``, for submitit's positional map."""

    worker: Callable[..., Any]

    def __call__(self, call: Call) -> Any:
        return self.worker(**call)


_NAMED: dict[str, Callable[[], Executor]] = {
    "process": ProcessExecutor,
    "ray": RayExecutor,
    "slurm": SlurmExecutor,
}


def resolve_executor(executor: str | Executor) -> Executor:
    """An executor object, or its name."""
    if isinstance(executor, str):
        if executor not in _NAMED:
            raise ConfigError(
                f"unknown executor {executor!r}; use one of {', '.join(_NAMED)} "
                "(or a RayExecutor / SlurmExecutor with options)"
            )
        return _NAMED[executor]()
    if not callable(getattr(executor, "map", None)):
        raise ConfigError(f"executor {executor!r} has no map(); use one of {', '.join(_NAMED)}")
    return executor


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"this executor needs {module}: pip install 'autosearch[{extra}]'"
        ) from None
