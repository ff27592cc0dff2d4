"""Workers as a Slurm job array through submitit (:class:`SlurmExecutor`; ``pip
install 'autosearch-nas[slurm]'``; ``cluster="local"`` runs the jobs as local
processes)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autosearch.training.placement import Need
from autosearch.workers._executor import POLL_SECONDS, Call, require_extra

logger = logging.getLogger(__name__)


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
        submitit = require_extra("submitit", "slurm")
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
            time.sleep(POLL_SECONDS)
        poll()
        return [job.result() for job in jobs]

    def resources(self, n_workers: int, need: Callable[[], Need]) -> tuple[int, list[int | None]]:
        return self.cpus_per_task, [None] * n_workers  # Slurm sets each job's visible GPUs


@dataclass(frozen=True)
class _Call:
    """``worker(**call)``, for submitit's positional map."""

    worker: Callable[..., Any]

    def __call__(self, call: Call) -> Any:
        return self.worker(**call)
