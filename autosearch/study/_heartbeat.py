"""Heartbeats for running trials on any Optuna storage.

Optuna's own heartbeat works only with RDB storages; this one writes a trial system
attribute, which every storage (SQLite, journal file, PostgreSQL) keeps. While a trial
runs, a daemon thread stamps it every ``interval`` seconds; a trial whose stamp is
older than ``grace`` seconds belongs to a worker that died (killed, crashed, or its
machine gone), and another worker resumes it from its checkpoint.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

__all__ = ["HEARTBEAT", "WORKER", "Watch", "beating", "first_stamp", "last_beat", "worker_id"]

HEARTBEAT = "autosearch:heartbeat"
WORKER = "autosearch:worker"

logger = logging.getLogger(__name__)


def worker_id() -> str:
    """host:pid of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


@contextmanager
def beating(
    storage: BaseStorage, trial_id: int, interval: float, *, stamped: bool = False
) -> Iterator[None]:
    """Stamp ``trial_id`` now and every ``interval`` seconds until the block ends.
    ``stamped``: the trial was created with its first stamp (:func:`first_stamp`)."""
    if not stamped:
        storage.set_trial_system_attr(trial_id, WORKER, worker_id())
        storage.set_trial_system_attr(trial_id, HEARTBEAT, time.time())
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            try:
                storage.set_trial_system_attr(trial_id, HEARTBEAT, time.time())
            except Exception as exc:  # the trial may have finished meanwhile; keep trying
                logger.debug("heartbeat of trial id %d not written: %s", trial_id, exc)

    thread = threading.Thread(target=beat, name=f"heartbeat-trial-id-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=interval + 5)


def first_stamp() -> dict[str, Any]:
    """The system attribute of a trial's first heartbeat (a trial created with it names
    its worker in its ``worker`` user attribute)."""
    return {HEARTBEAT: time.time()}


def last_beat(trial: FrozenTrial) -> float:
    """When the trial was last stamped (its start when never, or when its stamp is not
    a finite number: a worker that died before its first stamp, or a damaged one)."""
    stamp = trial.system_attrs.get(HEARTBEAT)
    if isinstance(stamp, int | float) and not isinstance(stamp, bool) and math.isfinite(stamp):
        return float(stamp)
    return trial.datetime_start.timestamp() if trial.datetime_start else 0.0


class Watch:
    """How long running trials (claims) have been silent, as one watcher sees them."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[str, float]] = {}  # trial id -> (stamp, first seen)

    def silent(self, trial: FrozenTrial) -> float:
        """Seconds ``trial`` has been silent: since its last stamp by the wall clock, or,
        when longer, since this watcher first saw that same stamp (its own monotonic
        clock: a stamp in the future goes silent too once it stops changing)."""
        stamp = repr(trial.system_attrs.get(HEARTBEAT))  # NaN, lists: compared as written
        now = time.monotonic()
        seen = self._seen.get(trial._trial_id)
        if seen is None or seen[0] != stamp:
            self._seen[trial._trial_id] = seen = (stamp, now)
        return max(time.time() - last_beat(trial), now - seen[1])
