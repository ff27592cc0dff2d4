"""One ``autosearch`` command: its options read (autosearch.cli.parser), the command run
(a module of autosearch.cli per verb), any error printed in one line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence

import optuna

from autosearch.cli.parser import build_parser
from autosearch.errors import AutosearchError
from autosearch.study.loop import PLATFORM_FAILURES, platform_error
from autosearch.workers._collection import TRAINING, settle, skip_final_collection

__all__ = ["run"]

# The commands that train networks in this process (or in torchrun's ranks, which run
# the command too).
_TRAINING_COMMANDS = frozenset(
    {"run", "worker", "search", "supernet", "confirm", "population", "train"}
)


def run(argv: Sequence[str], *, owned: bool) -> int:
    """Run the command ``argv``; ``owned``: the process is the command's own (the script,
    torchrun's ranks), not a program's that called :func:`autosearch.cli.main`."""
    argv = list(argv)
    skip_final_collection()
    args = build_parser().parse_args(argv)
    if owned:  # what the command loads, frozen before it starts (workers/_collection.py)
        settle(*(TRAINING if _trains_here(args) else ()))
    args.argv = argv
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # Trial lines (INFO) show where no progress bar does; -v adds the detail (DEBUG).
    logging.getLogger("autosearch").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    optuna.logging.set_verbosity(optuna.logging.INFO if args.verbose else optuna.logging.WARNING)
    try:
        return int(args.func(args))
    except KeyboardInterrupt as exc:  # outside a trial, or a second Ctrl-C / SIGTERM
        name = getattr(exc, "signal", "SIGINT")
        print(f"autosearch: interrupted ({name})", file=sys.stderr)
        return 128 + signal.Signals[name].value
    except BrokenPipeError:  # `autosearch status | head`: the reader has gone; so do we
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141  # 128 + SIGPIPE, as a shell reports a pipe's writer
    except AutosearchError as exc:
        print(f"autosearch: error: {exc}", file=sys.stderr)
        return 2
    except PLATFORM_FAILURES as exc:  # the storage failed while the command used it
        print(f"autosearch: error: {platform_error(exc, _storage_of(args))}", file=sys.stderr)
        return 2


def _trains_here(args: argparse.Namespace) -> bool:
    """Whether the command trains in this process: not where it hands the training to
    torchrun's ranks (each of which runs the command and trains)."""
    launches = getattr(args, "nproc_per_node", 1) > 1 and "LOCAL_RANK" not in os.environ
    return args.command in _TRAINING_COMMANDS and not launches


def _storage_of(args: argparse.Namespace) -> str:
    if getattr(args, "storage", None):
        return str(args.storage)
    file = getattr(args, "study_file", None)
    return f"of study file {file}" if file else "?"
