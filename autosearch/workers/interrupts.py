"""Graceful interrupts: the first Ctrl-C or SIGTERM asks the running work (a trial, the
supernet's training) to stop after its epoch's checkpoint; a second one, Ctrl-C or
SIGTERM, stops at once. Shared by the search loop and the supernet job, so both stop the
same way and say the same thing.

Two signals that arrive while the main thread is inside one long native call (a large
convolution, a blocking read) reach Python's handler once: the kernel and CPython keep
one "pending" flag per signal. Each delivery is also written, one byte each, to the
process's wakeup file descriptor (``signal.set_wakeup_fd``): the handler counts those,
so a second Ctrl-C a moment after the first is not lost.

A handler's exception is raised wherever the main thread is, and where that is a
finalizer or a garbage collector's callback (SQLAlchemy has some), Python prints it as
"Exception ignored" and goes on: a second signal would be lost. While the block is
active, such a lost stop is sent again (the same signal, to the main thread), to land
outside the callback. A finalizer that swallows every exception itself (a bare
``except:``) takes the second stop with it: then the first one's request stands, and
the work stops after its epoch's checkpoint. (Sending it again until the block is left
would interrupt the code that records the stop itself.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Interrupts", "StopNow"]

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopNow(KeyboardInterrupt):
    """A second Ctrl-C or SIGTERM: stop at once (the work resumes from its last
    checkpoint). ``signal`` names the signal that asked for it."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal = signal_name


class Interrupts:
    """Whether the user asked to stop, and with which signal (``"SIGINT"``,
    ``"SIGTERM"``); set while :meth:`handled` is active in the main thread. ``announce``:
    say so in a warning (a torchrun rank other than 0 leaves that to rank 0)."""

    def __init__(self, *, announce: bool = True) -> None:
        self.requested = False
        self.signal: str | None = None
        self.announce = announce

    @contextlib.contextmanager
    def handled(self) -> Iterator[Interrupts]:
        """Catch SIGINT and SIGTERM for the block (in the main thread; elsewhere the
        process's own handlers stay)."""
        self.requested, self.signal = False, None
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        with _deliveries() as delivered:

            def handle(signum: int, frame: Any) -> None:
                arrived = delivered() or [signum]
                name = signal.Signals(arrived[-1]).name  # the last one asks
                if self.requested or len(arrived) >= 2:  # again, or twice at once
                    raise StopNow(name)
                self.requested, self.signal = True, name
                logger.log(
                    logging.WARNING if self.announce else logging.DEBUG,
                    "%s: finishing this epoch's checkpoint, then stopping (Ctrl-C again to "
                    "stop at once)",
                    name,
                )

            saved = {sig: signal.signal(sig, handle) for sig in _SIGNALS}
            with _stops_not_lost():
                try:
                    yield self
                finally:
                    for sig, handler in saved.items():
                        signal.signal(sig, handler)


@contextlib.contextmanager
def _stops_not_lost() -> Iterator[None]:
    """While active: a StopNow that Python could not raise (it came in a finalizer or a
    garbage collector's callback) is asked for again by its signal."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, StopNow):
            # Sent from a thread a moment later: a handler run inside this hook would be
            # lost for good; by then the main thread is out of the callback (if not, the
            # stop comes back here and is sent again). Sent to the main thread itself,
            # where Python runs handlers: a signal sent to the process may be taken by
            # another thread (a library's, waiting on it) and never reach the handler.
            sig = signal.Signals[unraisable.exc_value.signal]
            again = threading.Timer(0.05, _to_main_thread, (sig,))
            again.daemon = True
            again.start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def _to_main_thread(sig: signal.Signals) -> None:
    main = threading.main_thread().ident
    if hasattr(signal, "pthread_kill") and main is not None:
        signal.pthread_kill(main, sig)
    else:  # no pthreads (Windows)
        os.kill(os.getpid(), sig)


@contextlib.contextmanager
def _deliveries() -> Iterator[Any]:
    """A function that gives the SIGINT / SIGTERM deliveries that arrived since it was
    last called, in order (empty where that cannot be told: then each handler call is
    one), read from a wakeup file descriptor of the block's own; a wakeup descriptor set
    before (an event loop's) gets every byte too."""
    try:
        read, write = os.pipe()
    except OSError:  # no descriptors left
        yield list
        return
    for fd in (read, write):
        os.set_blocking(fd, False)
    try:
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError):  # not the main thread, or not allowed here
        os.close(read)
        os.close(write)
        yield list
        return

    def delivered() -> list[int]:
        arrived = b""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while chunk := os.read(read, 512):
                arrived += chunk
        if previous >= 0 and arrived:
            with contextlib.suppress(OSError):
                os.write(previous, arrived)
        return [byte for byte in arrived if byte in _SIGNALS]

    try:
        yield delivered
    finally:
        signal.set_wakeup_fd(previous, warn_on_full_buffer=False)
        os.close(read)
        os.close(write)
