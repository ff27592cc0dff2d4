"""What an executor is (:class:`Executor`: it places a run's worker calls and waits
for them) and what the engines share."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from autosearch.errors import ConfigError
from autosearch.training.placement import Need

logger = logging.getLogger(__name__)


Call = dict[str, Any]

POLL_SECONDS = 1.0


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


def require_extra(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"this executor needs {module}: pip install 'autosearch-nas[{extra}]'"
        ) from None
