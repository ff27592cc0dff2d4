"""Calls to a tracker made in a thread of their own, in the order they were sent, so
that a tracker that is down or slow never holds up or fails a trial: the first
failure is one warning line, and the tracker is left alone for the rest of the run."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Sender"]

logger = logging.getLogger("autosearch.study.tracking")

_STOP = object()


class Sender:
    """A queue of calls to ``what`` (``"MLflow at http://…"``, for messages), made
    by one daemon thread, started at the first call."""

    def __init__(self, what: str, *, setup: float = 0.0) -> None:
        self.what = what
        # Seconds the first call may take before the tracker counts as stalled: it makes
        # the client (imports the tool; a new store's tables), slow on a loaded machine.
        self.setup = setup
        self.down: str | None = None  # why the tracker is left alone, once it failed
        self.sent = 0
        self.busy = 0.0  # CPU seconds this process spent in the calls (their thread's)
        self._calls: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

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
            started = time.thread_time()
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
        """Wait for what was queued to be sent, as long as the tracker takes a call
        every ``timeout`` seconds (its first call: ``setup`` seconds, if longer); whether
        all was sent. What is left once it stalls is dropped, said in one line (the
        thread is a daemon: it does not keep the process alive)."""
        thread = self._thread
        if thread is None:
            return True
        self._calls.put(_STOP)
        if self._calls.qsize() > 100:
            logger.info("waiting for %s to take %d queued updates", self.what, self._calls.qsize())
        waited = timeout
        while thread.is_alive():
            before = self.sent
            waited = timeout if before else max(timeout, self.setup)
            thread.join(waited)
            if self.sent == before:  # no call taken in that time: stalled
                break
        with self._lock:
            self._thread = None
        if thread.is_alive():
            # The call in flight, and those queued behind it (less the stop mark).
            dropped = self._calls.qsize()
            logger.warning(
                "%s did not answer within %g s; %d update(s) of this process are dropped",
                self.what,
                waited,
                dropped,
            )
            self.down = self.down or f"no answer within {waited:g} s"
            return False
        return self.down is None
