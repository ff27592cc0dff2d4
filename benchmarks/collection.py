"""The garbage collector's share of a training process's start and of a short trial.
Prints JSON; each ratio is measured within this run.

Fresh processes, alternated, each timing the collector (``gc.callbacks``) and its own CPU:

- ``settled``: as an autosearch command starts (autosearch/workers/_collection.py):
  ``import autosearch`` (the collector paused while it loads), then torch's compiler
  loaded and everything frozen, before the trial;
- ``plain``: the same libraries imported first with the collector left to Python, as a
  process that is not autosearch's own does, and nothing frozen.

Then both run the same short trial: a network of the tests' tiny ResNet space trained
for ``--epochs`` on the bundled digits and evaluated (a CLI worker's trial, minus the
storage).

    python benchmarks/collection.py [--repeats 5] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What autosearch loads, imported before it in the plain process (so that autosearch's
# own pause covers nothing heavy).
_LIBRARIES = ("torch", "torch._dynamo", "numpy", "optuna", "sqlalchemy")


def child(kind: str, epochs: int) -> dict[str, float]:
    import gc
    import importlib
    import resource

    spent = {"start": 0.0}

    def timed(phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            spent["start"] = now
        else:
            spent[str(info["generation"])] = spent.get(str(info["generation"]), 0.0) + (
                now - spent["start"]
            )

    gc.callbacks.append(timed)

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    if kind == "plain":
        for name in _LIBRARIES:
            importlib.import_module(name)
    import autosearch  # noqa: F401

    if kind == "settled":
        from autosearch.workers._collection import TRAINING, settle

        settle(*TRAINING)
    import numpy as np
    import torch

    from autosearch import TrainConfig
    from autosearch.data import load_data
    from autosearch.training.train import train
    from search_spaces import ResNetSpace

    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same network in every process
    loaded_cpu = cpu()
    collected_loading = sum(v for k, v in spent.items() if k != "start")
    space = ResNetSpace(max_stages=2, depths=(1,), widths=(8, 16), stem_widths=(8,))
    model = space.build(
        space.sample(np.random.default_rng(0)), input_shape=(1, 8, 8), num_classes=10
    )
    result = train(
        model, load_data("digits", seed=0), TrainConfig(epochs=epochs, batch_size=32), seed=0
    )
    collected = sum(v for k, v in spent.items() if k != "start")
    return {
        "start_cpu_s": loaded_cpu,
        "start_collector_s": collected_loading,
        "trial_cpu_s": cpu() - loaded_cpu,
        "trial_collector_s": collected - collected_loading,
        "frozen_objects": gc.get_freeze_count(),
        "val_accuracy": result.val_accuracy,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--child", choices=["settled", "plain"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.epochs)))
        return
    runs: dict[str, list[dict[str, float]]] = {"settled": [], "plain": []}
    for _ in range(args.repeats):
        for kind in runs:  # alternated: the machine's drift falls on both alike
            done = subprocess.run(
                [sys.executable, __file__, "--child", kind, "--epochs", str(args.epochs)],
                capture_output=True, text=True, check=True, cwd=ROOT,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )  # fmt: skip
            runs[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    medians = {
        kind: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for kind, rows in runs.items()
    }
    settled, plain = medians["settled"], medians["plain"]
    total = {k: m["start_cpu_s"] + m["trial_cpu_s"] for k, m in medians.items()}
    accuracies = {r["val_accuracy"] for rows in runs.values() for r in rows}
    print(json.dumps({
        "repeats": args.repeats,
        "epochs": args.epochs,
        "median": medians,
        "same_accuracy": len(accuracies) == 1,  # the collector changes no result
        "start_cpu_ratio": settled["start_cpu_s"] / plain["start_cpu_s"],
        "trial_collector_ratio": settled["trial_collector_s"] / plain["trial_collector_s"],
        "process_cpu_ratio": total["settled"] / total["plain"],
        "process_cpu_saved_s": total["plain"] - total["settled"],
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
