"""A supernet's training shown as it goes, wherever it is started: an epoch bar on a
terminal, else a log line per epoch (rank 0 only). Each epoch shows what it trained on
(the training loss) and what the largest subnet scores evaluated as the search evaluates
a subnet (batch norm recalibrated): the supernet's own statistics, averaged over every
subnet it trained, would understate it."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm import tqdm

from autosearch.training.runtime import world
from autosearch.training.train import EpochResult

__all__ = ["shown"]

logger = logging.getLogger(__name__)


@contextmanager
def shown(epochs: int, show: bool | None) -> Iterator[Callable[[EpochResult], None]]:
    """An epoch bar on a terminal (or when asked), else a log line per epoch."""
    if not (sys.stderr.isatty() if show is None else show):

        def log(epoch: EpochResult) -> None:
            if world()[0] == 0:
                logger.info(
                    "supernet epoch %d/%d: %s (%.1f s)",
                    epoch.epoch,
                    epochs,
                    _said(epoch),
                    epoch.seconds,
                )

        yield log
        return
    bar = tqdm(total=epochs, unit="epoch", desc="supernet")

    def update(epoch: EpochResult) -> None:
        bar.set_postfix_str(_said(epoch))
        bar.update()

    try:
        yield update
    finally:
        bar.close()


def _said(epoch: EpochResult) -> str:
    """What an epoch shows: what was trained on, and what a subnet evaluated as the
    search evaluates it scores (the supernet's own batch-norm statistics, mixed over
    every subnet it trained, would understate it)."""
    loss = epoch.train_loss if math.isfinite(epoch.train_loss) else float("nan")
    return (
        f"training loss {loss:.4f}, largest subnet with batch norm recalibrated: "
        f"val accuracy {epoch.val_accuracy:.4f}"
    )
