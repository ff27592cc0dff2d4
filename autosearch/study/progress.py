"""Progress of a search, wherever it is started: on a terminal a bar for the trials and
one for the current trial's epochs (as Optuna's ``show_progress_bar``); elsewhere (a
log file, a notebook's captured output, CI) one INFO log line per finished trial."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

from autosearch.scoring.metrics import metric
from autosearch.study.loop import EpochCallback, RecordCallback
from autosearch.study.records import Record
from autosearch.training.train import EpochResult

__all__ = ["bars"]

logger = logging.getLogger(__name__)

_SHOWN = ("accuracy", "flops", "params")


def _log_line(record: Record) -> None:
    if record.state == "failed":
        logger.info("trial %d failed: %s", record.trial, record.reason)
        return
    shown = ", ".join(f"{metric(n).header} {metric(n).cell(record.metrics)}" for n in _SHOWN)
    logger.info("trial %d %s: %s (%s)", record.trial, record.state, record.description, shown)


@contextmanager
def bars(
    total: int, epochs: int | None, *, show: bool | None, bounded: bool = True
) -> Iterator[tuple[list[RecordCallback], list[EpochCallback]]]:
    """Trial and epoch callbacks that draw the bars: none when ``show`` is False, or is
    None and standard error is not a terminal; no epoch bar when ``epochs`` is None
    (trials trained in other processes); a trial bar without an end where the count is
    not ``bounded`` (a time budget alone)."""
    if not total:
        yield [], []
        return
    if not (sys.stderr.isatty() if show is None else show):
        yield [_log_line], []
        return
    trials = tqdm(total=total if bounded else None, unit="trial", position=0)
    current = tqdm(total=epochs, unit="epoch", position=1, leave=False, disable=epochs is None)

    def trial_done(record: Record) -> None:
        accuracy = record.metrics.get("accuracy")
        trials.set_postfix_str(
            f"last {record.state}" + (f" acc {accuracy:.3f}" if accuracy else "")
        )
        trials.update()
        current.reset()

    def epoch_done(trial: int, epoch: EpochResult) -> None:
        current.set_description(f"trial {trial}")
        current.set_postfix_str(f"val {epoch.val_accuracy:.3f}")
        current.update()

    try:
        yield [trial_done], [epoch_done]
    finally:
        current.close()
        trials.close()
