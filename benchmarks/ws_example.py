"""The weight-sharing guide's example, whole, timed phase by phase (issue 45).

docs/guide/weight-sharing.md: a ResNet supernet on digits (30 epochs, sandwich 2), then
``optimize(1000, n_workers=2)`` with int8 and latency on, ``confirm(3)``,
``best(max_flops=2e6)`` and ``export``. Prints JSON: each phase's seconds, subnets a
minute, and with ``--workers 1`` (the search in this process) where a subnet's time
goes (wall time inside the functions that own it, timed by wrappers: the claim and
storage, the controller, the evaluation on the supernet, the int8 estimate and its
evaluation, the costs and latency prediction, the front measured for real at the
end). Target on the 2-core CPU: the whole example in <= 6 minutes; on one GPU:
``optimize(1000)`` in <= 60 s. Run it with nothing else on the machine.

    python benchmarks/ws_example.py [--device cpu|cuda] [--trials 1000] [--profile N]
        [--workers N] [--then-workers N] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import autosearch
from autosearch import SupernetConfig, TrainConfig
from controllers import RegularizedEvolution
from search_spaces import ResNetSpace

# Where a trial's time goes: wall time inside each of these calls (timed by wrappers, a
# few calls a trial: no profiler's overhead), by what they do.
PARTS = {
    "claim (storage reads, the controller's ask)": ("autosearch.study.claims", "Claims", "claim"),
    "store the result (storage writes)": ("autosearch.study.loop", "SearchLoop", "_store"),
    "tell the controller (and save its state)": ("autosearch.study.loop", "SearchLoop", "_tell"),
    "evaluate on the supernet (recalibrate, validate, test)": (
        "autosearch.weight_sharing.supernet",
        "SubnetEvaluator",
        "evaluate",
    ),
    "derive the int8 variant (the estimate)": (
        "autosearch.evaluation.runner",
        None,
        "derive_variant",
    ),
    "evaluate the int8 variant (val, test)": ("autosearch.evaluation.runner", None, "evaluate"),
    "costs and latency prediction": ("autosearch.evaluation.runner", None, "profile"),
    "the front measured for real (once, at the end)": (
        "autosearch.study.measure",
        "FrontMeasurer",
        "measure",
    ),
}


@contextlib.contextmanager
def timed_parts() -> Iterator[dict[str, list[float]]]:
    """Wall seconds of every call of each part while the block runs."""
    spent: dict[str, list[float]] = {name: [] for name in PARTS}
    undo = []
    for name, (module_name, owner_name, attr) in PARTS.items():
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        if not hasattr(owner, attr):
            continue  # another version of the package: this part is not timed
        real = getattr(owner, attr)

        def wrapper(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                spent[_name].append(time.perf_counter() - start)

        setattr(owner, attr, wrapper)
        undo.append((owner, attr, real))
    try:
        yield spent
    finally:
        for owner, attr, real in undo:
            setattr(owner, attr, real)


def study(
    root: Path, device: str, *, name: str = "digits-ws", weights: Path | None = None
) -> autosearch.Study:
    """The guide's study (``weights``: a trained supernet's file, loaded, not trained)."""
    space = ResNetSpace(max_stages=3, depths=(1, 2, 3), widths=(8, 16, 24, 32)).supernet(
        fixed={"stages": 3, "block": "basic"}
    )
    return autosearch.create_study(
        name,
        controller=RegularizedEvolution(space, seed=0),
        data="digits",
        supernet=SupernetConfig(
            train=TrainConfig(epochs=30, device=device),
            sandwich=2,
            weights=str(weights) if weights else None,
        ),
        variants=("base", "int8"),
        storage=f"sqlite:///{root}/{name}.db",
        load_if_exists=True,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not args.warm_latency_table:  # as a new user: this machine's table measured anew
            os.environ["AUTOSEARCH_LATENCY_TABLES"] = str(root / "latency")
        start = time.perf_counter()
        s = study(root, args.device)
        times["create_study"] = time.perf_counter() - start
        t = time.perf_counter()
        s.supernet.train(show_progress_bar=False)
        times["train_supernet"] = time.perf_counter() - t
        t = time.perf_counter()
        with timed_parts() as spent:  # in this process: with --workers, in theirs (not timed)
            s.optimize(args.trials, show_progress_bar=False, n_workers=args.workers)
        times["optimize"] = time.perf_counter() - t
        t = time.perf_counter()  # extras, not the guide's example: kept out of "whole"
        if args.then_workers:  # the same supernet searched again, by a pool of workers
            s.optimize(args.trials, show_progress_bar=False, n_workers=args.then_workers)
            times["optimize_then_workers"] = time.perf_counter() - t
        profile = profiled(s, args.profile, args.device) if args.profile else None
        extras = time.perf_counter() - t
        t = time.perf_counter()
        s.supernet.confirm(3)
        times["confirm_3"] = time.perf_counter() - t
        t = time.perf_counter()
        best = s.best(max_flops=2e6)
        times["best"] = time.perf_counter() - t
        t = time.perf_counter()
        s.export(best, root / "best")
        times["export"] = time.perf_counter() - t
        times["whole"] = time.perf_counter() - start - extras
    out: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(),
        "device": args.device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "trials": args.trials,
        "workers": args.workers,
        "latency_table": "kept from earlier runs" if args.warm_latency_table else "new",
        "seconds": {k: round(v, 1) for k, v in times.items()},
        "subnets_a_minute": round(60 * args.trials / times["optimize"], 1),
        **(
            {
                "then_workers": args.then_workers,
                "then_workers_subnets_a_minute": round(
                    60 * args.trials / times["optimize_then_workers"], 1
                ),
            }
            if args.then_workers
            else {}
        ),
        "targets": {"whole_cpu_seconds": 360, "optimize_1000_gpu_seconds": 60},
        "best": {"trial": best.trial, "accuracy": best.metrics["accuracy"]},
    }
    if args.workers == 1:  # a worker process's parts are its own, not timed here
        out["ms_a_trial"] = {
            name: round(1000 * sum(calls) / args.trials, 2)
            for name, calls in spent.items()
            if calls
        }
        out["ms_a_trial"]["the rest (the loop, the trial's plan, Optuna)"] = round(
            1000 * times["optimize"] / args.trials - sum(out["ms_a_trial"].values()), 2
        )
    if profile:
        out["profile"] = profile
    return out


# What the host asks of the driver: how often a trial launches work, copies and waits.
DRIVER = ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize")


def profiled(s: autosearch.Study, trials: int, device: str) -> dict[str, Any]:
    """``trials`` more subnets under torch.profiler (outside the timed phases): the
    operators that take the most of a trial's host time and, on a GPU, of its device
    time, a trial's driver calls, and the profiled trial's wall time (the profiler's own
    overhead in it). The front is not measured for real at the end of these (a trial's
    own costs are profiled, not the int8 lowering's: ``best`` measures what it needs)."""
    from torch.profiler import ProfilerActivity, profile

    from autosearch.study.measure import FrontMeasurer

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    real = FrontMeasurer.measure
    FrontMeasurer.measure = lambda self, points: None  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        with profile(activities=activities) as prof:
            s.optimize(trials, show_progress_bar=False)
        wall = time.perf_counter() - start
    finally:
        FrontMeasurer.measure = real  # type: ignore[method-assign]
    events = prof.key_averages()

    def top(field: str) -> list[dict[str, Any]]:
        rows = sorted(events, key=lambda e: getattr(e, field), reverse=True)[:15]
        return [
            {
                "op": e.key,
                "calls_a_trial": round(e.count / trials, 1),
                "ms_a_trial": round(getattr(e, field) / 1000 / trials, 3),
            }
            for e in rows
        ]

    out: dict[str, Any] = {
        "trials": trials,
        "ms_a_trial_profiled": round(1000 * wall / trials, 1),
        "by_self_host_time": top("self_cpu_time_total"),
    }
    if cuda:
        out["by_self_device_time"] = top("self_device_time_total")
        out["device_ms_a_trial"] = round(
            sum(e.self_device_time_total for e in events) / 1000 / trials, 3
        )
        out["driver_calls_a_trial"] = {
            e.key: round(e.count / trials, 1) for e in events if e.key in DRIVER
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument(
        "--profile", type=int, default=0, help="this many more subnets under torch.profiler"
    )
    parser.add_argument(
        "--warm-latency-table",
        action="store_true",
        help="predict with this machine's kept latency table (default: a new one, as a new user)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="optimize(trials, n_workers=N): N processes share the subnets (the guide's: 2, "
        "a core each on a 2-core CPU); 1: in this process, with the per-trial breakdown",
    )
    parser.add_argument(
        "--then-workers",
        type=int,
        default=0,
        help="after optimize(trials), optimize(trials, n_workers=N) on the same supernet, "
        "timed apart (several workers sharing one GPU, without training it twice)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.workers < 1 or args.then_workers < 0:
        parser.error("--workers: give 1 or more worker processes; --then-workers: 0 or more")
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
