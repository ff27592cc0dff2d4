"""Calls to a tracker made in a thread of their own, in the order they were sent, so
that a tracker that is down or slow never holds up or fails a trial: the first
failure is one warning line, and the tracker is left alone for the rest of the run.

At the end of a run the process waits for what it queued as long as the tracker makes
progress: a call taken, or CPU used by the call in flight (importing the tool, making a
local store: work that a busy machine only slows down). A call that waits on a peer
without using CPU (a server that does not answer) is stalled after ``timeout`` seconds;
one that keeps computing past ``RUNAWAY_CPU`` CPU seconds is given up too."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Sender"]

logger = logging.getLogger("autosearch.tracking")

_STOP = object()
# CPU seconds one call may use before it counts as a runaway (a store's tables are made
# in a few; nothing a tracker does takes minutes of CPU).
RUNAWAY_CPU = 600.0


class Sender:
    """A queue of calls to ``what`` (``"MLflow at http://…"``, for messages), made
    by one daemon thread, started at the first call."""

    def __init__(self, what: str, *, setup: float = 0.0, runaway: float = RUNAWAY_CPU) -> None:
        self.what = what
        # Seconds the first call may wait without using CPU before the tracker counts as
        # stalled: it makes the client (a new store's lock, held by another worker).
        self.setup = setup
        self.runaway = runaway
        self.down: str | None = None  # why the tracker is left alone, once it failed
        self.sent = 0
        self.busy = 0.0  # CPU seconds this process spent in the calls (their thread's)
        self._calls: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._call_started = 0.0  # the thread's CPU clock when its call in flight began

    def send(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue ``call(*args, **kwargs)``; returns at once (nothing, once down)."""
        if self.down is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"autosearch-tracking {self.what}", daemon=True
                )
                self._thread.start()
        self._calls.put((call, args, kwargs))

    def _run(self) -> None:
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            if self.down is not None:
                continue
            call, args, kwargs = item
            started = self._call_started = time.thread_time()
            try:
                call(*args, **kwargs)
                self.sent += 1
            except Exception as exc:  # any failure of the tracker: never the trial's
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                self.down = f"{type(exc).__name__}: {first}"
                logger.warning(
                    "%s failed (%s); nothing more is sent to it from this process, and "
                    "the study goes on",
                    self.what,
                    self.down,
                )
            finally:
                self.busy += time.thread_time() - started

    def close(self, timeout: float) -> bool:
        """Wait for what was queued to be sent, as long as the tracker makes progress
        (module docstring): a window of ``timeout`` seconds (the first call's: ``setup``,
        if longer) with no call taken and no CPU used by the thread ends the wait; so
        does a call past ``runaway`` CPU seconds. Whether all was sent. What is left then
        is dropped, said in one line (the thread is a daemon: it does not keep the
        process alive)."""
        thread = self._thread
        if thread is None:
            return True
        self._calls.put(_STOP)
        if self._calls.qsize() > 100:
            logger.info("waiting for %s to take %d queued updates", self.what, self._calls.qsize())
        clock = _cpu_clock(thread)
        why = ""
        while thread.is_alive():
            before, used = self.sent, _cpu(clock)
            window = timeout if before else max(timeout, self.setup)
            thread.join(window)
            if not thread.is_alive() or self.sent != before:
                continue
            now = _cpu(clock)
            if now is None or now == used:  # nothing taken, no CPU used: stalled
                why = f"did not answer within {window:g} s"
                break
            if now - self._call_started > self.runaway:
                why = f"used over {self.runaway:g} CPU seconds on one call"
                break
        with self._lock:
            self._thread = None
        if thread.is_alive():
            # The call in flight, and those queued behind it (less the stop mark).
            dropped = self._calls.qsize()
            logger.warning(
                "%s %s; %d update(s) of this process are dropped", self.what, why, dropped
            )
            self.down = self.down or why
            return False
        return self.down is None


def _cpu_clock(thread: threading.Thread) -> int | None:
    """The CPU clock of ``thread`` (POSIX), None where the platform has none."""
    try:
        return time.pthread_getcpuclockid(thread.ident)  # type: ignore[arg-type]
    except (AttributeError, OSError, TypeError, OverflowError):
        return None


def _cpu(clock: int | None) -> float | None:
    """The CPU seconds on ``clock`` (None: no clock, or its thread has ended)."""
    if clock is None:
        return None
    try:
        return time.clock_gettime(clock)
    except OSError:
        return None
