"""Python's garbage collector in the processes autosearch starts and owns: its commands
(and so torchrun's ranks, which run a command) and a local pool's workers.

What such a process loads (torch, its compiler, optuna, autosearch: about 340,000
objects on torch 2.13) lives as long as the process, yet the collector ran over and
over while it loaded (each full collection scanning everything loaded so far: a part
of each command's start, benchmarks/collection.py) and every full collection of a trial
scanned it all again. Loaded with the collector paused, then frozen (``gc.freeze``: left
out of every later collection), it costs nothing more; what trials allocate is collected
as before. A user's own process (a notebook, a script) is left as it is: whether to
freeze its objects is its owner's choice; ``import autosearch`` changes nothing of it.
"""

from __future__ import annotations

import atexit
import functools
import gc
import importlib

__all__ = ["settle", "skip_final_collection"]

# What a command that trains loads at its first optimizer step anyway: torch's compiler
# (``torch.optim`` imports it), loaded here with the rest, before any trial.
TRAINING = ("torch._dynamo",)


def settle(*modules: str) -> None:
    """Import ``modules`` with the collector paused, then freeze everything this process
    holds, and run with the collector on. Call it where the process holds only what it
    loaded (before its first trial): garbage frozen here would never be collected."""
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        gc.freeze()
        gc.enable()


@functools.cache  # once a process
def skip_final_collection() -> None:
    """At this process's exit, no garbage collection of everything it still holds.

    Python's shutdown collects every object the process holds: after a study, the
    graphs and caches of torch's compiler and exporter: seconds of every CLI command,
    worker and torchrun rank on a small CPU. Frozen objects
    (``gc.freeze``) are left to the operating system instead; what is still open is
    closed as before, by the exit handlers (registered earlier, so run after this one)
    and by reference counting."""
    atexit.register(gc.freeze)
