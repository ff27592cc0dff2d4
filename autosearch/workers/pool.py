"""Processes that run a study's trials: a local pool of workers, and torchrun ranks.

``optimize(n, n_workers=K)`` starts K worker processes (forked from a fork server that
has loaded torch once for all of them), each opening the study from
its storage and running its share of the trials with a search loop of its own (and
its controller on a random stream of its own). The parent watches the storage while
they run and calls the user's trial callbacks as trials finish. Under torchrun, rank 0
runs the search loop and broadcasts each claimed architecture; the other ranks
:func:`follow`, training what they are sent.
"""

from __future__ import annotations

import logging
import os
import pickle
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autosearch._script import unguarded_line
from autosearch.architecture import Architecture
from autosearch.data import Dataset, Split
from autosearch.errors import ConfigError
from autosearch.evaluation.runner import TrialContext, run_trial
from autosearch.space import SearchSpace
from autosearch.storage._urls import StorageTarget
from autosearch.study import records
from autosearch.study.dataset import StudyData
from autosearch.study.loop import RecordCallback
from autosearch.study.plans import Planner
from autosearch.study.records import Record
from autosearch.study.replay import ControllerReplay, worker_stream
from autosearch.study.trials import StoredTrials
from autosearch.training._batch import MAX_GROWTH
from autosearch.training.placement import Need, step_need
from autosearch.training.runtime import broadcast_object
from autosearch.training.train import TrainConfig
from autosearch.workers.executors import Executor, ProcessExecutor, resolve_executor
from autosearch.workers.interrupts import Interrupts

__all__ = ["check_main_guard", "follow", "in_pool", "run_pool", "start_worker", "trial_need"]

logger = logging.getLogger(__name__)

_RUN = "run"  # trial user attribute: the pool run that made the trial
_SLOT = "pool_slot"  # and which of its workers


WorkerMain = Callable[..., list[int]]


def run_pool(
    trials: StoredTrials,
    replay: ControllerReplay,
    *,
    storage: StorageTarget,
    data_source: tuple[Any, Any] | None,
    n_trials: int,
    n_workers: int,
    worker_main: WorkerMain,
    callbacks: list[RecordCallback],
    max_failures_in_a_row: int,
    executor: str | Executor = "process",
    total: int | None = None,
    deadline: float | None = None,
    need: Callable[[], Need] | None = None,
    evaluator: Any = None,
) -> list[Record]:
    """Run ``n_trials`` of the study of ``trials`` (at ``storage``) in ``n_workers``
    workers that ``executor`` starts (local processes, Ray tasks, Slurm jobs);
    call ``callbacks`` here as their trials finish; the trials' records. ``replay``
    catches this process's controller up with them at the end.

    ``worker_main(name=, storage=, data=, n_trials=, worker=, run=, trials_before=,
    max_failures_in_a_row=, total=, deadline=)`` is each worker's entry point (it opens
    the study, calls :func:`start_worker` and runs its trials); ``threads`` and ``gpu``
    are set here. ``evaluator``: a user's evaluator, sent to every worker as an object
    (workers never import it from a name read from the storage). A
    worker the engine starts again (its node died) runs only what its share lacks.
    ``need``: what one trial holds on a GPU, asked for where workers share GPUs
    (autosearch.training.placement; default: a CUDA context only)."""
    engine = resolve_executor(executor)
    if storage.url.startswith("sqlite") and ":memory:" in storage.url:
        raise ConfigError("worker processes cannot share an in-memory storage; use a file")
    if isinstance(engine, ProcessExecutor):
        check_main_guard()
        check_sendable(evaluator)
    shares = [n_trials // n_workers + (i < n_trials % n_workers) for i in range(n_workers)]
    threads, gpus = engine.resources(n_workers, need or (lambda: Need(weights=0, activations=0)))
    run = uuid.uuid4().hex[:12]
    before = len(trials.all())
    common = {"worker_main": worker_main, "name": trials.name, "storage": storage}
    calls = [
        {
            **common,
            "n_trials": share,
            "worker": i,
            "run": run,
            "trials_before": before,
            "threads": threads,
            "gpu": gpus[i],
            "cwd": os.getcwd(),
            "data": data_source,
            "max_failures_in_a_row": max_failures_in_a_row,
            "total": total,
            "deadline": deadline,  # a time budget's end, the same for every worker
            "evaluator": evaluator,
        }
        for i, share in enumerate(shares)
        if share
    ]
    reported: set[int] = set()
    engine.map(_process, calls, lambda: _report(trials, run, callbacks, reported))
    replay.sync()
    _report(trials, run, callbacks, reported)
    return [trials.record(n) for n in _finished(trials, run)]


def in_pool(worker_attrs: dict[str, Any]) -> bool:
    """Whether this process is a worker of a pool run (its attributes say so)."""
    return _RUN in worker_attrs


def _finished(trials: StoredTrials, run: str, slot: int | None = None) -> list[int]:
    """The numbers of the pool run's finished trials (of one worker ``slot``)."""
    return [
        t.number
        for t in trials.all()
        if t.user_attrs.get(_RUN) == run
        and (slot is None or t.user_attrs.get(_SLOT) == slot)
        and t.state.is_finished()
        and not records.superseded(t)
    ]


def check_sendable(evaluator: Any) -> None:
    """Refuse an evaluator that worker processes cannot be sent (a lambda, a function
    defined inside another): said before any process starts."""
    if evaluator is None:
        return
    try:
        pickle.dumps(evaluator)
    except Exception as exc:
        name = getattr(evaluator, "__qualname__", type(evaluator).__qualname__)
        raise ConfigError(
            f"evaluator {name} cannot be sent to worker processes ({type(exc).__name__}: "
            f"{str(exc)[:200]}); define it at the top level of a module (or a script's), "
            "or run one worker"
        ) from None


def check_main_guard() -> None:
    """Refuse to spawn workers from the unguarded top level of a script: each spawned
    process runs the main script again (``autosearch._script``) and would create the
    study and start workers again. Found before any process starts."""
    where = unguarded_line()
    if where is not None:
        script, line = where
        raise ConfigError(
            f"{script} line {line} starts worker processes from the top level "
            "of the script; each worker runs the script again and would start the "
            'study again: put the study\'s code under `if __name__ == "__main__":`'
        )


def _report(
    trials: StoredTrials, run: str, callbacks: list[RecordCallback], reported: set[int]
) -> None:
    """Call the callbacks for the run's trials that finished since the last look."""
    if not callbacks:
        return
    for trial in trials.all():
        if trial.user_attrs.get(_RUN) != run or trial.number in reported:
            continue
        if not trial.state.is_finished():
            continue
        reported.add(trial.number)
        for record in trials.decode(trial)[:1]:
            for callback in callbacks:
                callback(record)


def start_worker(
    trials: StoredTrials,
    replay: ControllerReplay,
    attrs: dict[str, Any],
    *,
    seed: int,
    worker: str,
    run: str | None = None,
    share: int | None = None,
    trials_before: int | None = None,
) -> int | None:
    """Make this process one of several workers of the study of ``trials``: its
    controller (``replay``'s) on a random stream of its own, and its trials marked (in
    ``attrs``, which every trial it starts carries) with the pool run and worker slot
    that made them. With ``share`` (the slot's trials), the trials it still owes: fewer
    when the slot's worker was started again after dying.

    The stream follows the study's ``seed``, the worker's name and the study's trial
    count when the run began (``trials_before``; default: now): a pool's workers are
    seeded the same however their starts interleave, so the same seed gives the same
    search."""
    before = len(trials.all()) if trials_before is None else trials_before
    stream = worker_stream(seed, worker, before)
    replay.reseed(stream)
    attrs["controller_stream"] = stream
    if run is None:
        return share
    attrs[_RUN] = run
    attrs[_SLOT] = int(worker)
    if share is None:
        return None
    return max(0, share - len(_finished(trials, run, int(worker))))


def _process(
    worker_main: WorkerMain,
    *,
    threads: int,
    gpu: int | None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    **options: Any,
) -> list[int]:
    """A worker: the caller's working folder where this machine has it (so relative
    storage and artifact paths mean the same as for the caller: Ray and Slurm start
    workers elsewhere), its share of the CPU threads, its GPU and the environment its
    executor gives it (an MPS daemon's pipe), then the study's work. All of it is set
    before CUDA starts in this process."""
    if cwd is not None and Path(cwd).is_dir():
        os.chdir(cwd)
    os.environ.update(env or {})
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    torch.set_num_threads(threads)
    return worker_main(**options)


def trial_need(
    space: SearchSpace,
    config: TrainConfig,
    data: Dataset | None,
    *,
    samples: int = 16,
    seed: int = 0,
) -> Need:
    """What the largest of ``samples`` candidates of ``space`` (its default and draws
    with ``seed``) holds on a GPU while it trains with ``config`` on ``data``: the
    placement rule's size of a trial (autosearch.training.placement). With
    ``auto_batch_size``, at the largest batch the rule may grow to; ``"auto"``
    precision counted as fp32 (the larger). Without ``data`` (a table study's trials
    train nothing), a CUDA context only."""
    if data is None:
        return Need(weights=0, activations=0)
    rng = np.random.default_rng(seed)
    archs = [space.default(), *(space.sample(rng) for _ in range(samples - 1))]
    batch = config.batch_size * (MAX_GROWTH if config.auto_batch_size else 1)
    images = data.train.x.nbytes if isinstance(data.train, Split) else 0  # streamed: none
    needs = []
    with torch.random.fork_rng(devices=[]):
        for arch in archs:
            model = space.build(arch, input_shape=data.input_shape, num_classes=data.num_classes)
            needs.append(
                step_need(
                    model,
                    data.input_shape,
                    batch=batch,
                    optimizer=config.optimizer,
                    precision=config.precision,
                    data_bytes=int(images),
                )
            )
    return Need.largest(needs)


def follow(planner: Planner, data: StudyData) -> list[Record]:
    """A non-zero rank under torchrun: train what rank 0 broadcasts, until told to stop.
    Rank 0 records every result (and every failure); its decisions after each epoch
    (stop early, interrupted) reach this rank inside the runner. A Ctrl-C or SIGTERM
    here is told to rank 0 at the epoch's end, which stops every rank there (the trial
    resumes from that checkpoint); a second one stops this rank at once."""
    interrupts = Interrupts(announce=False)  # rank 0 says it
    with interrupts.handled():
        while (message := broadcast_object(None)) is not None:
            arch = Architecture.from_json(message["arch"])
            plan = planner.plan(arch, number=message["number"])
            try:
                run_trial(plan, data.training, _Following(interrupts))
            except Exception:  # rank 0 saw the same failure (or stop) and stores it
                logger.debug("trial failed on this rank too", exc_info=True)
    return []


class _Following(TrialContext):
    """A follower's trial: it asks to stop where this rank was signalled."""

    def __init__(self, interrupts: Interrupts) -> None:
        self.interrupts = interrupts

    def interrupted(self) -> bool:
        return self.interrupts.requested
