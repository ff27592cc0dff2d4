"""Where ``optimize(n, n_workers=K, executor=...)`` starts its K workers.

Each worker is one call of the same function (open the study from its storage, run
a share of the trials); the executor only places the calls and waits for them. The
study's storage coordinates the trials whatever the executor, so a worker lost with
its machine is started again by the engine and its trial resumes from its checkpoint
through the heartbeat protocol (a bucket or a shared folder holds the checkpoints).

``"process"`` (default)   processes on this machine (forked from a fork server)
``RayExecutor(...)``      Ray tasks on a Ray cluster (``"ray"``: the cluster at
                          ``RAY_ADDRESS``, or a local one); ``pip install 'autosearch-nas[ray]'``
``SlurmExecutor(...)``    a Slurm job array through submitit (``cluster="local"`` runs
                          the jobs as local processes); ``pip install 'autosearch-nas[slurm]'``

Storage and artifacts must be reachable from every worker: a PostgreSQL URL (or a
file on a shared file system, by absolute path) and an absolute folder or a bucket.
More workers than GPUs share them: autosearch.training.placement's rule (a trial's
size against a GPU's free memory) says how many fit on one and refuses more; the local
pool spreads its workers over the GPUs and runs those sharing one under CUDA MPS where
it can start, and ``RayExecutor(num_gpus="auto")`` asks Ray for the rule's fraction.
``per_gpu=`` on either overrides the rule.
"""

from __future__ import annotations

from collections.abc import Callable

from autosearch.errors import ConfigError
from autosearch.workers._executor import Executor
from autosearch.workers.local import ProcessExecutor
from autosearch.workers.ray_tasks import RayExecutor
from autosearch.workers.slurm import SlurmExecutor

__all__ = ["Executor", "ProcessExecutor", "RayExecutor", "SlurmExecutor", "resolve_executor"]


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
