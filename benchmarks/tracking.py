"""What showing a study live in MLflow and TensorBoard costs. Prints JSON; every ratio
is measured within this run.

1. cost: the default study (studies/digits_quick.py: small ResNets on digits, 10 epochs,
   pruned and int8 variants of the front), ``--trials`` of its trials, run without
   tracking, with MLflow (a SQLite store, MLflow's default kind), with TensorBoard, and
   with both; each setting ``--repeats`` times, interleaved, each in a fresh folder,
   after one untimed warm-up trial. Seconds per trial (the whole ``optimize``, its
   end-of-run wait for the tracker included) and the ratio of medians to no tracking
   (target: <= 1.05). MLflow's one-time creation of a new store's tables is timed
   apart (``store_seconds``).
2. growth: a study that trains nothing (NB201 cells, the study's machinery alone), run
   in chunks with MLflow on and off side by side: ms per trial by chunk, the wait for
   the tracker at each chunk's end included (target: flat, the last chunks within 1.2x
   the first).

    python benchmarks/tracking.py [--trials 6] [--repeats 2] [--growth-trials 400]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import autosearch
from autosearch.evaluation.runner import TrialPlan, TrialResult, VariantResult
from autosearch.study import loop
from autosearch.studyfile import load_spec
from controllers import RandomSearch
from search_spaces import NB201Space

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("off", "mlflow", "tensorboard", "both")


def _tracking(setting: str, folder: str) -> dict[str, str]:
    chosen = {}
    if setting in ("mlflow", "both"):
        chosen["mlflow"] = f"sqlite:///{folder}/mlflow.db"
    if setting in ("tensorboard", "both"):
        chosen["tensorboard"] = f"{folder}/tb"
    return chosen


def _store_seconds(folder: str) -> float:
    """MLflow's tables made in a new SQLite store, once (as a study's first worker does)."""
    from mlflow.tracking import MlflowClient

    start = time.perf_counter()
    MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db").search_experiments()
    return time.perf_counter() - start


def _one_run(setting: str, trials: int) -> dict[str, float]:
    """One timed run, in this process (a child of :func:`bench_cost`): a warm-up trial of
    a study of its own, then ``trials`` trials of the default study, ``setting`` on."""
    spec = load_spec(str(ROOT / "studies" / "digits_quick.py"))
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        if setting in ("mlflow", "both"):
            out["store_seconds"] = _store_seconds(folder)
        for name, n in (("warm-up", 1), ("cost", trials)):
            study = dataclasses.replace(spec, name=name).create(
                storage=f"sqlite:///{folder}/{name}.db", **_tracking(setting, folder)
            )
            start = time.perf_counter()
            done = study.optimize(n)
            assert all(r.state == "complete" for r in done), done
        out["seconds_per_trial"] = (time.perf_counter() - start) / trials
        out["tracking_cpu_per_trial"] = study._tracker.busy / trials
    return out


def bench_cost(trials: int, repeats: int) -> dict[str, object]:
    """Each setting ``repeats`` times, each run a fresh process (a long process slows
    down as torch's compile caches fill, which would favour whichever ran first), the
    settings' order rotated every repeat."""
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in SETTINGS}
    for rep in range(repeats):
        for setting in SETTINGS[rep % len(SETTINGS) :] + SETTINGS[: rep % len(SETTINGS)]:
            child = subprocess.run(
                [sys.executable, __file__, "--one", setting, "--trials", str(trials)],
                capture_output=True, text=True, check=True, timeout=3600,
            )  # fmt: skip
            runs[setting].append(json.loads(child.stdout))
    med = {s: statistics.median(r["seconds_per_trial"] for r in runs[s]) for s in SETTINGS}
    cpu = {s: statistics.median(r["tracking_cpu_per_trial"] for r in runs[s]) for s in SETTINGS}
    stores = [r["store_seconds"] for s in SETTINGS for r in runs[s] if "store_seconds" in r]
    return {
        "study": "studies/digits_quick.py",
        "trials": trials,
        "repeats": repeats,
        "seconds_per_trial": {
            s: [round(r["seconds_per_trial"], 3) for r in runs[s]] for s in SETTINGS
        },
        "ratio_to_off": {s: round(med[s] / med["off"], 3) for s in SETTINGS},
        # CPU seconds the tracking threads spent per trial, and as a share of a trial's
        # wall time without tracking: what tracking takes from the machine.
        "tracking_cpu_seconds_per_trial": {s: round(cpu[s], 4) for s in SETTINGS},
        "tracking_cpu_share": {s: round(cpu[s] / med["off"], 4) for s in SETTINGS},
        "store_seconds": round(statistics.median(stores), 2) if stores else None,
    }


def _no_training() -> None:
    metrics = {"accuracy": 0.5, "flops": 1e6, "macs": 5e5, "params": 1e4}

    def evaluate(plan: TrialPlan, data: object, context: object = None) -> TrialResult:
        point = VariantResult(name="base", metrics={**metrics, "reward": plan.reward(metrics)})
        return TrialResult(status="complete", points=(point,))

    loop.run_trial = evaluate  # type: ignore[assignment]


def bench_growth(trials: int, chunk: int) -> dict[str, object]:
    _no_training()
    rows: dict[str, list[float]] = {"off": [], "mlflow": []}
    with tempfile.TemporaryDirectory() as folder:
        studies = {
            setting: autosearch.create_study(
                f"growth-{setting}",
                controller=RandomSearch(NB201Space(), seed=0),
                storage=f"sqlite:///{folder}/study-{setting}.db",
                **_tracking(setting, folder),
            )
            for setting in rows
        }
        for _ in range(trials // chunk):
            for setting, study in studies.items():
                start = time.perf_counter()
                study.optimize(chunk)
                rows[setting].append(round(1000 * (time.perf_counter() - start) / chunk, 1))
    med = statistics.median
    ours = rows["mlflow"]
    return {
        "trials": trials,
        "chunk": chunk,
        "ms_per_trial": rows,
        "last3_over_first3": round(med(ours[-3:]) / med(ours[:3]), 2),
        "mlflow_over_off_last3": round(med(ours[-3:]) / med(rows["off"][-3:]), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--growth-trials", type=int, default=400)
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--only", choices=("cost", "growth"))
    parser.add_argument("--one", choices=SETTINGS, help=argparse.SUPPRESS)  # a child's run
    args = parser.parse_args()
    logging.getLogger("autosearch").setLevel(logging.WARNING)
    if args.one:
        print(json.dumps(_one_run(args.one, args.trials)))
        return
    out: dict[str, object] = {}
    if args.only in (None, "cost"):
        out["cost"] = bench_cost(args.trials, args.repeats)
    if args.only in (None, "growth"):
        out["growth"] = bench_growth(args.growth_trials, args.chunk)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
