"""What the commands share: an output folder made or refused, the executor named on the
command line, the tracking options, a supernet trained before trials, a command run again
as torchrun's processes, a stored study opened to read, and the plain-text table of
records they print."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from autosearch.errors import ConfigError, ExportError, StudyError
from autosearch.evaluation.trial import Interrupted
from autosearch.scoring.metrics import metric
from autosearch.study import (
    ProcessExecutor,
    RayExecutor,
    Record,
    Study,
    default_storage,
    load_study,
)
from autosearch.study.overlays import figures
from autosearch.studyfile import load_spec
from autosearch.training.runtime import world
from autosearch.workers.executors import Executor


@contextlib.contextmanager
def out_dir(args: argparse.Namespace, name: str) -> Iterator[Path]:
    """Where the report and the export go; refused before any training if not writable.
    The folders it makes are removed again (while empty) when the command fails, so a
    bad name given with it leaves nothing behind."""
    out = Path(args.out) if args.out else Path("runs") / name
    missing = [p for p in (out, *out.parents) if not p.exists()]  # deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as exc:
        raise ExportError(
            f"cannot write the report and export to {out} ({exc.strerror or exc}); choose "
            "a writable folder with --out"
        ) from None
    try:
        yield out
    except BaseException:
        for folder in missing:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only while empty
        raise


def executor_of(args: argparse.Namespace | None) -> str | Executor:
    """``--executor``, with ``--ray-address`` for Ray and ``--per-gpu`` for the placement
    of workers on GPUs (Ray: the placement rule's GPU fraction, ``num_gpus="auto"``)."""
    name = getattr(args, "executor", None) or "process"
    per_gpu = getattr(args, "per_gpu", None)
    if getattr(args, "ray_address", None) and name != "ray":
        raise ConfigError("--ray-address names a Ray cluster: use it with --executor ray")
    if name == "ray":
        return RayExecutor(
            address=getattr(args, "ray_address", None), num_gpus="auto", per_gpu=per_gpu
        )
    if name == "process":
        return ProcessExecutor(per_gpu=per_gpu)
    if per_gpu is not None:
        raise ConfigError(
            f"--per-gpu places workers on GPUs of this machine or a Ray cluster; with "
            f"--executor {name} each job gets the GPUs of its task (drop --per-gpu)"
        )
    return str(name)


def import_evaluator(path: str) -> Any:
    """The evaluator ``MODULE:NAME`` names (``--evaluator``), imported with the working
    folder on the import path, as ``python -m`` has it.

    Raises:
        ConfigError: not MODULE:NAME, or a module or name that cannot be imported, in one
            line.
    """
    module, sep, name = path.partition(":")
    if not (sep and module and name):
        raise ConfigError(f"--evaluator {path!r}: expected MODULE:NAME, e.g. my_training:evaluate")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module)
    except Exception as exc:
        raise ConfigError(
            f"--evaluator {path}: cannot import {module} ({type(exc).__name__}: {exc}); run "
            "the worker where it imports (its folder, or PYTHONPATH)"
        ) from None
    for part in name.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"--evaluator {path}: {module} has no {name}")
        found = getattr(found, part)
    return found


def tracking_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--mlflow`` and ``--tensorboard``, where the command has them."""
    return {k: getattr(args, k, None) for k in ("mlflow", "tensorboard")}


def supernet_first(study: Study, *, retrain: bool = False, as_json: bool = False) -> int:
    """A study that evaluates on a supernet trains it first (a no-op once trained, a
    wait while another worker trains it); 0, or the exit status of an interrupted run."""
    if study.supernet is None:
        return 0
    try:
        info = study.supernet.train(retrain=retrain)
    except Interrupted as exc:
        signal_name = str(exc) or "SIGTERM"
        if world()[0] == 0:
            print(
                f"supernet training of study {study.name} interrupted ({signal_name}); run the "
                "same command again to go on: it resumes from its last epoch's checkpoint"
            )
        return 128 + signal.Signals[signal_name].value  # as a shell reports the signal
    if not info or world()[0] != 0:
        return 0
    if as_json:
        print(json.dumps({k: v for k, v in info.items() if k != "history"}, indent=2))
    elif "imported_from" in info:
        print(f"supernet of study {study.name}: imported from {info['imported_from']}")
    else:
        print(
            f"supernet of study {study.name}: trained {info['epochs']} epochs "
            f"({info['seconds']:.1f} s), weights {info['digest'] or info['weights']}"
        )
    return 0


def torchrun(nproc: int, argv: list[str]) -> int:
    """The same command line again, as ``nproc`` processes under torchrun (which sets
    LOCAL_RANK, so the processes do not relaunch). torchrun's launcher runs in this
    process, as the ``torchrun`` command would in its own: the ranks start without a
    third interpreter importing torch first. Where a rank fails:
    the first failed rank's status (a refusal's 2, as one process would
    give); 128 + the signal's number when this process is signalled (the ranks are
    stopped first)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(["--standalone", f"--nproc-per-node={nproc}", "-m", "autosearch.cli", *argv])
    except ChildFailedError as exc:  # torchrun has said which rank failed and how
        return max(1, exc.get_first_failure()[1].exitcode)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


_COLUMNS = ("accuracy", "test_accuracy", "flops", "params", "latency", "bytes")


def table(records: Sequence[Record]) -> str:
    """A plain-text table of records, in the units of autosearch.scoring.metrics (FLOPs are
    2 × MACs per image; latency ms per image at batch 1 on one CPU thread)."""
    head = ("trial", "architecture", "variant", *(metric(n).header for n in _COLUMNS), "figures")
    rows = [head]
    for r in records:
        cells = (metric(n).cell(r.metrics) for n in _COLUMNS)
        rows.append((str(r.trial), r.description, r.variant, *cells, figures(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i in (1, len(row) - 1) else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


def open_stored(args: argparse.Namespace) -> Study:
    """The study named by a study file or by --study (and --storage), opened to read:
    nothing in its storage is created or changed."""
    if args.study_file:
        spec = load_spec(args.study_file)
        url = args.storage or spec.storage or default_storage(spec.name)
        return load_study(spec.name, storage=url, read_only=True)
    if not args.study:
        raise StudyError("name the study: a study file (studies/digits_quick.py) or --study NAME")
    url = args.storage or default_storage(args.study)
    return load_study(args.study, storage=url, read_only=True)


def accuracies(figures: dict[str, float | None]) -> str:
    return " ".join(
        f"{name} {figures[key]:.6f}"
        for key, name in (("accuracy", "val"), ("test_accuracy", "test"))
        if figures.get(key) is not None
    )
