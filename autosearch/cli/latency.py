"""``autosearch latency-table``: measure a latency lookup table on the device it runs
on, for a study that searches for that device from another machine.

Run it on the device (a Raspberry Pi, a phone's Linux, a GPU host's CPU) with the same
torch version as the study's machine: it draws ``--samples`` architectures of the
study file's space, runs each once at batch 1 and 32, and times every part the table
lacks where it runs (autosearch.scoring.latency). Copy the file to the study's machine and
pass ``Compression(latency="table.json")``: a part the table lacks is then an error
naming it, never a measurement of the wrong machine.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from autosearch.data import load_data
from autosearch.errors import StudyError
from autosearch.scoring.latency import LatencyTable, LatencyTableError, host_device, read
from autosearch.study.definition import resolve_components
from autosearch.studyfile import load_spec

__all__ = ["cmd_latency_table"]

BATCHES = (1, 32)


def cmd_latency_table(args: argparse.Namespace) -> int:
    spec = load_spec(args.study_file)
    if args.samples < 1:
        raise StudyError(f"--samples must be >= 1, got {args.samples}")
    space, _ = resolve_components(spec.space, spec.controller, spec.seed)  # names too
    data = load_data(spec.data, seed=spec.seed)
    table = _table(args.out)
    table.save(args.out)  # an unwritable file is said now, not after the measuring
    rng = np.random.default_rng(args.seed)
    start, before = time.perf_counter(), len(table.entries)
    for _ in range(args.samples):
        arch = space.sample(rng)
        model = space.build(arch, input_shape=data.input_shape, num_classes=data.num_classes)
        for batch in BATCHES:
            table.predict(model.eval(), data.input_shape, batch=batch)
    table.save(args.out)
    summary = {
        "table": args.out,
        "device": table.device,
        "torch": table.torch,
        "architectures": args.samples,
        "entries": len(table.entries),
        "added": len(table.entries) - before,
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(summary) if args.json else "\n".join(f"{k}: {v}" for k, v in summary.items()))
    return 0


def _table(out: str) -> LatencyTable:
    """The table in ``out`` to add to (this device's, same torch), else a new one."""
    try:
        table = read(out, fill=True)
    except LatencyTableError as exc:
        if "does not exist" not in str(exc):
            raise
        from pathlib import Path

        import torch

        return LatencyTable(
            device=host_device(), torch=torch.__version__.split("+")[0], path=Path(out)
        )
    if table.device != host_device():
        raise StudyError(
            f"{out} holds the table of {table.device}, not of this device ({host_device()}); "
            "write this device's table to another file"
        )
    return table
