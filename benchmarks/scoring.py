"""Scoring at the speed of a supernet evaluation, measured against the real thing.

A search scores every candidate on estimates (latency from this machine's lookup table
of measured layers, int8 accuracy by fake quantization) and measures the front for
real. This script measures what that costs and how far the estimates are from the
measurements:

1. ``latency``: predicted against measured (autosearch.scoring.cost.latency) latency of
   subnets of two elastic spaces, ResNet and MobileNet, at batch 1 and 32, on one CPU
   thread; and each subnet measured a second time (the stopwatch's own agreement). A
   fresh table is filled by ``--fill`` subnets (its build time is reported);
   then ``--subnets`` other subnets are predicted (pure lookups where the table holds
   all their parts; their parts measured where they run otherwise) and timed.
2. ``int8``: on a trained supernet (README's weight-sharing example), the int8
   accuracy of ``--candidates`` subnets estimated by fake quantization against their
   real lowered int8 programs (and, as a baseline, the float accuracy as the estimate).
3. ``readme``: README's weight-sharing example as written (``optimize(1000)``, variants
   base and int8, latency on), after the supernet is trained: its time, and the
   per-trial cost against the base evaluation alone (variants base, latency off) and
   against full measurement (every int8 lowered, every latency timed).
4. ``front``: the front found with estimates (then measured) against the front found
   with full measurement, same controller and seed: hypervolume of the measured fronts.
5. ``trained``: a trained study's per-trial time on ``make run``'s settings
   (studies/digits_quick.py: int8 and pruned variants of front candidates), with
   estimates and with full measurement.

Prints JSON (and ``--markdown``). Run it with nothing else on the machine.

    python benchmarks/scoring.py --markdown scoring.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

import autosearch
from autosearch import Compression, SupernetConfig, TrainConfig
from autosearch.compress import derive
from autosearch.scoring.cost import latency as time_latency
from autosearch.scoring.latency import LatencyTable, host_device
from autosearch.scoring.pareto import hypervolume
from autosearch.training.train import evaluate
from controllers import RegularizedEvolution
from search_spaces import MobileNetSpace, ResNetSpace

TORCH = torch.__version__.split("+")[0]


def readme_space() -> Any:
    return ResNetSpace(max_stages=3, depths=(1, 2, 3), widths=(8, 16, 24, 32)).supernet(
        fixed={"stages": 3, "block": "basic"}
    )


def mobilenet_space() -> Any:
    return MobileNetSpace().supernet()


# 1. Latency ------------------------------------------------------------------------------
def latency(args: argparse.Namespace) -> dict[str, Any]:
    spaces = {
        "resnet": (readme_space(), (1, 8, 8)),
        "mobilenet": (mobilenet_space(), (1, 8, 8)),
    }
    out: dict[str, Any] = {}
    for name, (space, shape) in spaces.items():
        rng = np.random.default_rng(args.seed)
        table = LatencyTable(device=host_device(), torch=TORCH)

        def model(arch: Any, s: Any = space, sh: Any = shape) -> torch.nn.Module:
            return s.space.build(s.full(arch), input_shape=sh, num_classes=10).eval()

        fill = [space.sample(rng) for _ in range(args.fill)]
        start = time.perf_counter()
        for arch in fill:
            net = model(arch)
            for batch in (1, 32):
                table.predict(net, shape, batch=batch)
        built = time.perf_counter() - start
        for batch in (1, 32):
            predicted, measured, again, lookups, seconds = [], [], [], [], []
            rng_b = np.random.default_rng(args.seed + 1000 + batch)
            for _ in range(args.subnets):
                net = model(space.sample(rng_b))
                before = len(table.entries)
                t = time.perf_counter()
                predicted.append(table.predict(net, shape, batch=batch))
                seconds.append(time.perf_counter() - t)
                lookups.append(len(table.entries) == before)
                measured.append(time_latency(net, shape, batch=batch))
                again.append(time_latency(net, shape, batch=batch))
            p, m, m2 = np.array(predicted), np.array(measured), np.array(again)
            errors = np.abs(p - m) / m
            pure = np.array(lookups)
            out[f"{name}_batch{batch}"] = {
                "subnets": len(p),
                "spearman": float(stats.spearmanr(p, m)[0]),
                "median_abs_error_pct": float(100 * np.median(errors)),
                "mean_signed_error_pct": float(100 * np.mean((p - m) / m)),
                "pure_lookups": int(pure.sum()),
                "median_abs_error_pct_pure_lookups": (
                    float(100 * np.median(errors[pure])) if pure.any() else None
                ),
                "measured_ms_range": [float(m.min()), float(m.max())],
                # The stopwatch against itself: what any predictor is compared with.
                "measured_twice_spearman": float(stats.spearmanr(m2, m)[0]),
                "measured_twice_median_abs_diff_pct": float(100 * np.median(np.abs(m2 - m) / m)),
                "predict_ms_median": float(1e3 * np.median(seconds)),
            }
        out[f"{name}_table"] = {
            "fill_subnets": args.fill,
            "build_seconds": built,
            "entries": len(table.entries),
            "input_shape": list(shape),
        }
        print(json.dumps({name: {k: v for k, v in out.items() if k.startswith(name)}}), flush=True)
    return out


# The README study ---------------------------------------------------------------------------
def readme_study(root: Path, name: str, **options: Any) -> autosearch.Study:
    """README's weight-sharing example; the supernet trained once (in ``root/ws.db``),
    copied for each variant of the study."""
    trained = root / "trained.db"
    url = f"sqlite:///{root}/{name}.db"
    settings: dict[str, Any] = {
        "controller": RegularizedEvolution(readme_space(), seed=0),
        "data": "digits",
        "supernet": SupernetConfig(train=TrainConfig(epochs=30), sandwich=2),
        "variants": ("base", "int8"),
        "load_if_exists": True,
    }
    settings.update(options)
    weights = root / "supernet.safetensors"
    if not weights.exists():
        first = {**settings, "supernet": SupernetConfig(train=TrainConfig(epochs=30), sandwich=2)}
        study = autosearch.create_study("digits-ws", storage=f"sqlite:///{trained}", **first)
        study.supernet.train()
        study.supernet.save(weights)
    supernet = dataclasses.replace(settings["supernet"], weights=str(weights))
    study = autosearch.create_study(name, storage=url, **{**settings, "supernet": supernet})
    study.supernet.train()  # the weights file, checked and stored with the study
    return study


def _timed_trials(study: autosearch.Study, n: int) -> float:
    start = time.perf_counter()
    study.optimize(n, show_progress_bar=False)
    return (time.perf_counter() - start) / n


# 2. int8 ---------------------------------------------------------------------------------------
def int8(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    study = readme_study(root, "int8")
    study.supernet.train()
    evaluator, data = study.supernet.evaluator, study.data
    rng = np.random.default_rng(args.seed)
    rows = []
    compression = Compression()
    config = TrainConfig()
    for _ in range(args.candidates):
        arch = study.space.sample(rng)
        model, metrics = evaluator.evaluate(arch)
        t = time.perf_counter()
        estimate = derive("int8", model, data, config, compression=compression, estimate=True)
        estimated = evaluate(estimate.model, data.val, data)[0]
        estimate_seconds = time.perf_counter() - t
        t = time.perf_counter()
        real = derive("int8", model, data, config, compression=compression)
        measured = evaluate(real.model, data.val, data)[0]
        real_seconds = time.perf_counter() - t
        rows.append((metrics["accuracy"], estimated, measured, estimate_seconds, real_seconds))
    a = np.array(rows)
    diff = 100 * np.abs(a[:, 1] - a[:, 2])
    float_diff = 100 * np.abs(a[:, 0] - a[:, 2])
    return {
        "candidates": len(a),
        "validation_images": len(data.val),
        "median_abs_diff_points": float(np.median(diff)),
        "mean_abs_diff_points": float(np.mean(diff)),
        "max_abs_diff_points": float(np.max(diff)),
        "float_as_estimate_median_abs_diff_points": float(np.median(float_diff)),
        "float_as_estimate_mean_abs_diff_points": float(np.mean(float_diff)),
        "real_int8_mean_accuracy_drop_points": float(100 * np.mean(a[:, 0] - a[:, 2])),
        "estimate_seconds": float(np.median(a[:, 3])),
        "lowering_seconds": float(np.median(a[:, 4])),
    }


# 3. README's example -------------------------------------------------------------------------
def readme(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    base = readme_study(
        root,
        "base-only",
        variants=("base",),
        supernet=SupernetConfig(train=TrainConfig(epochs=30), sandwich=2, latency=False),
    )
    base_seconds = _timed_trials(base, args.base_trials)
    full = readme_study(root, "full", compression=Compression(estimate=False, latency="measured"))
    full_seconds = _timed_trials(full, args.full_trials)
    study = readme_study(root, "readme")
    start = time.perf_counter()
    study.optimize(args.trials, show_progress_bar=False)
    searched = time.perf_counter() - start
    best = study.best(max_flops=2e6)
    total = time.perf_counter() - start
    start = time.perf_counter()
    study.export(best, root / "ws-best", finetune_epochs=2)
    export_seconds = time.perf_counter() - start
    measured = [r for r in study.pareto() if r.metrics.get("measured")]
    return {
        "trials": args.trials,
        "optimize_and_best_seconds": total,
        "optimize_seconds": searched,
        "per_trial_seconds": total / args.trials,
        "base_only_per_trial_seconds": base_seconds,
        "ratio_to_base_only": (total / args.trials) / base_seconds,
        "full_measurement_per_trial_seconds": full_seconds,
        "full_measurement_trials": args.full_trials,
        "speedup_over_full_measurement": full_seconds / (total / args.trials),
        "front_points": len(study.pareto()),
        "front_points_measured": len(measured),
        "best": {
            "trial": best.trial,
            **{k: best.metrics.get(k) for k in ("accuracy", "flops", "latency", "measured")},
        },
        "export_with_2_epochs_finetune_seconds": export_seconds,
    }


# 4. The front -----------------------------------------------------------------------------------
def front(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    estimated = readme_study(root, "front-estimated")
    estimated.optimize(args.front_trials, show_progress_bar=False)
    full = readme_study(
        root, "front-full", compression=Compression(estimate=False, latency="measured")
    )
    full.optimize(args.front_trials, show_progress_bar=False)
    fronts = {
        name: np.array([[r.metrics["accuracy"], r.metrics["flops"]] for r in s.pareto()])
        for name, s in (("estimated", estimated), ("full", full))
    }
    every = np.concatenate(
        [
            [
                [r.metrics["accuracy"], r.metrics["flops"]]
                for r in s.records()
                if r.state == "complete"
            ]
            for s in (estimated, full)
        ]
    )
    reference = (float(every[:, 0].min()), float(every[:, 1].max()))
    volumes = {k: hypervolume(v, reference, ["maximize", "minimize"]) for k, v in fronts.items()}
    unmeasured = [
        r
        for r in estimated.pareto()
        if r.metrics.get("estimated") or r.metrics.get("latency_predicted")
    ]
    return {
        "trials": args.front_trials,
        "hypervolume_ratio_pct": 100 * volumes["estimated"] / volumes["full"],
        "reference": {"accuracy": reference[0], "flops": reference[1]},
        "front_points": {k: len(v) for k, v in fronts.items()},
        "estimated_front_points_left_unmeasured": len(unmeasured),
    }


# 5. A trained study ------------------------------------------------------------------------------
def trained(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from autosearch.studyfile import load_spec

    spec = load_spec(Path(__file__).resolve().parent.parent / "studies" / "digits_quick.py")
    out = {}
    for name, compression in (
        ("estimates", spec.compression),
        (
            "full_measurement",
            dataclasses.replace(spec.compression, estimate=False, latency="measured"),
        ),
    ):
        study = autosearch.create_study(
            f"quick-{name}",
            controller=spec.controller,
            data=spec.data,
            objectives=spec.objectives,
            variants=spec.variants,
            compression=compression,
            train=spec.train,
            storage=f"sqlite:///{root}/quick-{name}.db",
        )
        start = time.perf_counter()
        study.optimize(spec.n_trials, show_progress_bar=False)
        seconds = time.perf_counter() - start
        out[name] = {
            "trials": spec.n_trials,
            "per_trial_seconds": seconds / spec.n_trials,
            "front": [
                {
                    "trial": r.trial,
                    "variant": r.variant,
                    "accuracy": r.metrics["accuracy"],
                    "measured": bool(r.metrics.get("measured")),
                }
                for r in study.pareto()
            ],
        }
    out["speedup"] = (
        out["full_measurement"]["per_trial_seconds"] / out["estimates"]["per_trial_seconds"]
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", nargs="*", default=["latency", "int8", "readme", "front", "trained"]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fill", type=int, default=100, help="subnets that fill a fresh table")
    parser.add_argument("--subnets", type=int, default=100, help="subnets predicted and timed")
    parser.add_argument("--candidates", type=int, default=40, help="int8 estimates checked")
    parser.add_argument("--trials", type=int, default=1000, help="README example's trials")
    parser.add_argument("--base-trials", type=int, default=1000)
    parser.add_argument("--full-trials", type=int, default=20)
    parser.add_argument("--front-trials", type=int, default=100)
    parser.add_argument("--markdown", help="also write the results as markdown here")
    parser.add_argument("--work", help="keep studies here (default: a temporary folder)")
    args = parser.parse_args()
    # This machine's table, fresh for this run: kept out of the user's cache.
    root = Path(args.work or tempfile.mkdtemp(prefix="autosearch-scoring-"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("AUTOSEARCH_LATENCY_TABLES", str(root / "tables"))
    results: dict[str, Any] = {"machine": host_device(), "torch": TORCH}
    for part in args.only:
        start = time.perf_counter()
        if part == "latency":
            results[part] = latency(args)
        else:
            results[part] = {"int8": int8, "readme": readme, "front": front, "trained": trained}[
                part
            ](args, root)
        results[part]["benchmark_seconds"] = time.perf_counter() - start
        print(json.dumps({part: results[part]}), flush=True)
    print(json.dumps(results, indent=2))
    if args.markdown:
        Path(args.markdown).write_text("```json\n" + json.dumps(results, indent=2) + "\n```\n")


if __name__ == "__main__":
    main()
