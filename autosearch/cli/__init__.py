"""The ``autosearch`` command line: :func:`main` runs one command.

Run as the process's own command (the ``autosearch`` script, ``python -m
autosearch.cli`` under torchrun), it loads what the command needs with Python's
collector paused and then freezes it (autosearch/workers/_collection.py): that is
this process's to decide. Called from a program (``main([...])``), it leaves the
program's collector as it is.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``autosearch ARGV`` (default: this process's own arguments); its exit status."""
    if argv is not None:  # a program's call: its process, its collector
        from autosearch.cli._main import run

        return run(argv, owned=False)
    gc.disable()  # settled (frozen, the collector on again) once the command is read
    from autosearch.cli._main import run

    return run(sys.argv[1:], owned=True)
