"""Workers as processes on this machine (:class:`ProcessExecutor`): forked from a fork
server that loaded torch once, CPU threads shared evenly, GPUs shared by the placement
rule (under a CUDA MPS daemon of the run's own where one can start), a dead worker
started again, a worker whose parent died stopped after its epoch."""

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
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import torch

from autosearch._checks import check_fields, flag, whole
from autosearch.data import _stream
from autosearch.errors import PlatformError
from autosearch.training import placement
from autosearch.training.placement import Need
from autosearch.workers import _mps
from autosearch.workers._collection import settle, skip_final_collection
from autosearch.workers._executor import POLL_SECONDS, Call

logger = logging.getLogger(__name__)


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
                    wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
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
# worker's code, and torch's compiler (torch._dynamo), which every optimizer's first
# step imports: a large part of a process's start.
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
