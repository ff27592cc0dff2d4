"""Heartbeats for running trials on any Optuna storage.

Optuna's own heartbeat works only with RDB storages; this one writes a trial system
attribute, which every storage (SQLite, journal file, PostgreSQL) keeps. While a trial
runs, a daemon thread stamps it every ``interval`` seconds; a trial whose stamp is
older than ``grace`` seconds belongs to a worker that died (killed, crashed, or its
machine gone), and another worker resumes it from its checkpoint.

A worker on the same machine need not wait for the grace: each claim also records its
process (the kernel's boot, the pid namespace, the pid and the process's start time),
and a watcher on that machine that finds the process gone (or its pid taken by another
process) knows the worker died. Elsewhere, or where /proc cannot tell, only the grace
decides; a worker that is alive but slow (a loaded machine) is never declared dead by
its process, only by a silence longer than the grace.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

from autosearch.errors import ConfigError

__all__ = [
    "HEARTBEAT",
    "PROCESS",
    "WORKER",
    "Watch",
    "beating",
    "first_stamp",
    "gone",
    "heartbeat_settings",
    "last_beat",
    "process_gone",
    "this_process",
    "worker_id",
]

HEARTBEAT = "autosearch:heartbeat"
WORKER = "autosearch:worker"
PROCESS = "autosearch:process"  # boot id / pid namespace / pid / start time

logger = logging.getLogger(__name__)


def heartbeat_settings() -> tuple[float, float]:
    """(interval, grace) in seconds: ``$AUTOSEARCH_HEARTBEAT_INTERVAL`` (default 10) and
    ``$AUTOSEARCH_HEARTBEAT_GRACE`` (default 60: a trial silent that long is dead)."""
    values = []
    for name, default in (("INTERVAL", 10.0), ("GRACE", 60.0)):
        raw = os.environ.get(f"AUTOSEARCH_HEARTBEAT_{name}", "")
        try:
            values.append(float(raw) if raw else default)
        except ValueError:
            raise ConfigError(
                f"AUTOSEARCH_HEARTBEAT_{name}={raw!r} must be a number of seconds"
            ) from None
    interval, grace = values
    if not 0 < interval < grace:
        raise ConfigError(
            f"heartbeat interval {interval} s must be positive and below the grace {grace} s"
        )
    return interval, grace


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
        if (process := this_process()) is not None:
            storage.set_trial_system_attr(trial_id, PROCESS, process)
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
    """The system attributes of a trial's first heartbeat and of the process that holds
    it (a trial created with them names its worker in its ``worker`` user attribute)."""
    process = this_process()
    return {HEARTBEAT: time.time(), **({PROCESS: process} if process is not None else {})}


def this_process() -> str | None:
    """This process, as a watcher on the same machine can check it: the kernel's boot
    id, the pid namespace, the pid and its start time (so that a pid used again by
    another process is not taken for this one); None where /proc does not say."""
    pid = os.getpid()
    try:
        start = _stat(pid)[1]
        return f"{_machine()}/{pid}/{start}"
    except (OSError, ValueError, IndexError):
        return None


def process_gone(trial: FrozenTrial) -> bool:
    """Whether the process that holds ``trial`` is known to have ended: it ran on this
    machine (same boot, same pid namespace) and its pid is gone, a zombie, or another
    process's. False whenever that cannot be told (another machine, no /proc)."""
    return gone(trial.system_attrs.get(PROCESS))


def gone(recorded: object) -> bool:
    """Whether the process :func:`this_process` described as ``recorded`` is known to
    have ended (False whenever that cannot be told)."""
    if not isinstance(recorded, str):
        return False
    machine, pid, start = (*recorded.rsplit("/", 2), "", "")[:3]
    try:
        if not pid.isdigit() or machine != _machine():
            return False
    except OSError:
        return False
    try:
        state, started = _stat(int(pid))
    except FileNotFoundError:
        return True
    except (OSError, ValueError, IndexError):
        return False
    return started != start or state in ("Z", "X", "x")


@functools.cache
def _machine() -> str:
    """This kernel boot and pid namespace (processes of another container, or of
    another boot of the machine, cannot be checked by pid)."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}/{os.readlink('/proc/self/ns/pid')}"


def _stat(pid: int) -> tuple[str, str]:
    """A process's state letter and start time (clock ticks since boot), from
    /proc/PID/stat (its name, in parentheses, may hold spaces and parentheses)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return fields[0], fields[19]


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

    def dead(self, trial: FrozenTrial, grace: float) -> str | None:
        """Why ``trial``'s worker counts as dead (its process is gone, or it has been
        silent longer than ``grace`` seconds), or None while it may be alive."""
        silent = self.silent(trial)
        if process_gone(trial):
            return "its process is gone"
        return f"no heartbeat for {silent:.0f} s" if silent > grace else None
