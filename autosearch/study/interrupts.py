"""Graceful interrupts: the first Ctrl-C or SIGTERM asks the running work (a trial, the
supernet's training) to stop after its epoch's checkpoint; a second Ctrl-C stops at
once. Shared by the search loop and the supernet job, so both stop the same way and
say the same thing."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Interrupts"]

logger = logging.getLogger(__name__)


class Interrupts:
    """Whether the user asked to stop, and with which signal (``"SIGINT"``,
    ``"SIGTERM"``); set while :meth:`handled` is active in the main thread."""

    def __init__(self) -> None:
        self.requested = False
        self.signal: str | None = None

    @contextmanager
    def handled(self) -> Iterator[Interrupts]:
        """Catch SIGINT and SIGTERM for the block (in the main thread; elsewhere the
        process's own handlers stay)."""
        self.requested, self.signal = False, None
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handle(signum: int, frame: Any) -> None:
            if self.requested and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.requested, self.signal = True, signal.Signals(signum).name
            logger.warning(
                "%s: finishing this epoch's checkpoint, then stopping (Ctrl-C again to stop "
                "at once)",
                signal.Signals(signum).name,
            )

        saved = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
