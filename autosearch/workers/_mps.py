"""CUDA MPS for workers that share a GPU, started and stopped by the platform.

Processes on one GPU without MPS take turns: the GPU runs one context's kernels at a
time. Under MPS (NVIDIA's Multi-Process Service) their kernels run side by side, which
is what small candidates need to fill a GPU. :func:`daemon` starts a daemon of this
run's own (its pipe and log in a private folder, so a daemon the machine already runs,
or another study's, is neither used nor stopped) and gives the environment that makes a
worker its client; where MPS cannot start (no ``nvidia-cuda-mps-control``, a container
that forbids it) it says why in one line and the workers share the GPU without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

from autosearch.errors import ConfigError

__all__ = ["CONTROL", "daemon"]

logger = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
_PIPE, _LOG = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"


@contextlib.contextmanager
def daemon(*, required: bool = False, control: str = CONTROL) -> Iterator[dict[str, str]]:
    """An MPS daemon for the duration: the environment a worker needs to be its client
    (empty where none could start; ``required`` raises ConfigError instead). A daemon
    already named by this process's environment (``CUDA_MPS_PIPE_DIRECTORY``) is used,
    not started or stopped."""
    if os.environ.get(_PIPE):
        yield {name: os.environ[name] for name in (_PIPE, _LOG) if os.environ.get(name)}
        return
    why = _start_problem(control)
    if why is not None:
        yield _without(why, required)
        return
    with tempfile.TemporaryDirectory(prefix="autosearch-mps-") as folder:
        env = {_PIPE: os.path.join(folder, "pipe"), _LOG: os.path.join(folder, "log")}
        for path in env.values():
            os.mkdir(path)
        started = subprocess.run(
            [control, "-d"], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
        )
        if started.returncode != 0:
            said = (started.stderr or started.stdout).strip().splitlines()
            why = f"{control} -d exited {started.returncode}: {said[-1] if said else 'no message'}"
            yield _without(why, required)
            return
        logger.info("CUDA MPS started for the workers sharing a GPU (pipe %s)", env[_PIPE])
        try:
            yield env
        finally:
            stopped = subprocess.run(
                [control],
                input="quit\n",
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=60,
            )
            if stopped.returncode != 0:
                logger.warning("CUDA MPS did not stop cleanly: %s", stopped.stderr.strip())


def _without(why: str, required: bool) -> dict[str, str]:
    """No daemon: refused where MPS was ``required``, else said in one line."""
    if required:
        raise ConfigError(f"CUDA MPS asked for, but {why}; use mps=None or False")
    logger.info("workers share their GPU without CUDA MPS: %s", why)
    return {}


def _start_problem(control: str) -> str | None:
    """Why MPS cannot start here, or None."""
    if shutil.which(control) is None:
        return f"{control} is not on PATH (NVIDIA's driver utilities)"
    return None
