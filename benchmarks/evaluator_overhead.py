"""What the evaluator seam costs: a tiny study trained by autosearch's own trainer,
against the same study whose evaluator calls that same trainer (so both do the same
work, and the difference is the seam: the candidate handed over, the figures checked,
the epochs reported through it). Prints JSON.

Each repeat runs both settings in a fresh process each, in alternating order, on the
same architectures (the same controller and seed); seconds per trial are the whole
``optimize``. The target: the seam's median ratio under 1.05.

    python benchmarks/evaluator_overhead.py [--trials 6] [--repeats 5] [--epochs 2] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from autosearch.training.train import evaluate, train

TARGET = 1.05


def trainer_as_evaluator(candidate):
    """autosearch's trainer, called through the seam as a user's evaluator."""
    model, data = candidate.model, candidate.data
    checkpoint = candidate.work / "own.pt" if candidate.work else None

    def on_epoch(epoch):
        candidate.report(epoch.epoch, epoch.val_accuracy, loss=epoch.val_loss)

    result = train(
        model, data, candidate.config, seed=candidate.seed, on_epoch=on_epoch, checkpoint=checkpoint
    )
    return {
        "accuracy": result.val_accuracy,
        "test_accuracy": evaluate(model, data.test, data)[0],
    }


def run(setting: str, trials: int, epochs: int, device: str = "cpu") -> float:
    """Seconds per trial of one fresh study (this process)."""
    import autosearch
    from controllers import RandomSearch
    from search_spaces import ResNetSpace

    space = ResNetSpace(min_stages=2, max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8,))
    folder = Path(tempfile.mkdtemp())
    options = {"evaluator": trainer_as_evaluator} if setting == "evaluator" else {}
    study = autosearch.create_study(
        f"overhead-{setting}",
        controller=RandomSearch(space, seed=0),
        data="digits",
        train=autosearch.TrainConfig(epochs=epochs, batch_size=64, device=device),
        storage=f"sqlite:///{folder}/study.db",
        **options,
    )
    study.optimize(1, show_progress_bar=False)  # untimed: imports, data, caches
    start = time.perf_counter()
    study.optimize(trials, show_progress_bar=False)
    return (time.perf_counter() - start) / trials


def machine() -> str:
    """The CPU as /proc/cpuinfo names it (family and model where it says them)."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    fields = {}
    for line in info:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    cores = sum(line.startswith("processor") for line in info)
    name = fields.get("model name", platform.machine())
    return f"{name} (family {fields.get('cpu family')}, model {fields.get('model')}), {cores} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="where the trials train: cpu, cuda")
    parser.add_argument("--one", choices=("trainer", "evaluator"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # one measurement, in this fresh process
        print(json.dumps(run(args.one, args.trials, args.epochs, args.device)))
        return
    seconds: dict[str, list[float]] = {"trainer": [], "evaluator": []}
    for repeat in range(args.repeats):
        order = ("trainer", "evaluator") if repeat % 2 == 0 else ("evaluator", "trainer")
        for setting in order:
            command = [sys.executable, __file__, "--one", setting]
            command += ["--trials", str(args.trials), "--epochs", str(args.epochs)]
            command += ["--device", args.device]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            seconds[setting].append(float(done.stdout.strip().splitlines()[-1]))
    ratios = [e / t for e, t in zip(seconds["evaluator"], seconds["trainer"], strict=True)]
    ratio = statistics.median(ratios)
    print(
        json.dumps(
            {
                "machine": machine(),
                "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                "torch": torch.__version__,
                "trials": args.trials,
                "epochs": args.epochs,
                "repeats": args.repeats,
                "seconds_per_trial": seconds,
                "ratios": ratios,
                "median_ratio": ratio,
                "target": TARGET,
                "met": ratio <= TARGET,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
