"""autosearch against NNI 3 on the same work. Prints JSON; everything measured in one run.

The same small CNN space written both ways: natively (``search_spaces.SmallCNNSpace``)
and with NNI (``search_spaces.nni_examples.SmallCNN``: LayerChoice, nni.choice,
Repeat); they build the same networks (tests/test_nni.py). NNI runs its own
strategies in-process (SequentialExecutionEngine, FunctionalEvaluator); autosearch runs
its controllers in a study. Pairs: random / Random, evolution / RegularizedEvolution
(population 8, sample 3), tpe / TPE.

1. overhead: per-trial time of the search machinery with an evaluator that trains
   nothing (a fixed pseudo-accuracy per architecture, the same on both sides);
   autosearch on a journal file and on SQLite (it stores every trial; NNI keeps them in
   memory).
2. search: the same trial budget with real training (the same trainer, data split,
   epochs and seed on both sides): wall time and best validation accuracy.

    python benchmarks/vs_nni.py [--overhead-trials 50] [--trials 12] [--epochs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import tempfile
import time
import warnings
from collections.abc import Iterator

import optuna
import torch

import autosearch
from autosearch import TrainConfig
from autosearch.data import load_data
from autosearch.evaluation.runner import TrialPlan, TrialResult, VariantResult
from autosearch.registry import controllers
from autosearch.study import loop
from autosearch.training.train import train
from search_spaces import SmallCNNSpace

PAIRS = {"random": "Random", "evolution": "RegularizedEvolution", "tpe": "TPE"}
SPACE = SmallCNNSpace()


def _pseudo_accuracy(genes: dict) -> float:
    """A fixed value per network (genes that do not reach the network left out)."""
    depth = int(genes["depth"])
    key = json.dumps([genes["width"], [genes[f"op{i}"] for i in range(depth)]])
    return 0.5 + int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2**33


@contextlib.contextmanager
def _pseudo_trials() -> Iterator[None]:
    """Trials that train nothing: each network gets its fixed pseudo accuracy."""
    costs = {"flops": 1e6, "macs": 5e5, "params": 1e4}

    def evaluate(plan: TrialPlan, data: object, context: object = None) -> TrialResult:
        metrics = {**costs, "accuracy": _pseudo_accuracy(dict(plan.arch))}
        point = VariantResult(name="base", metrics={**metrics, "reward": plan.reward(metrics)})
        return TrialResult(status="complete", points=(point,))

    real = loop.run_trial
    loop.run_trial = evaluate  # type: ignore[assignment]
    try:
        yield
    finally:
        loop.run_trial = real


def _nni_strategy(name: str):
    from nni.nas.strategy import TPE, Random, RegularizedEvolution

    return {
        "Random": lambda: Random(),
        "RegularizedEvolution": lambda: RegularizedEvolution(population_size=8, sample_size=3),
        "TPE": lambda: TPE(),
    }[name]()


def run_nni(strategy: str, trials: int, evaluate) -> tuple[float, float]:
    """(seconds, best reported value) of NNI's ``strategy`` over ``trials`` models."""
    import nni
    from nni.nas.evaluator import FunctionalEvaluator
    from nni.nas.execution import SequentialExecutionEngine
    from nni.nas.space import RawFormatModelSpace

    from search_spaces.nni_examples import SmallCNN

    def evaluator(model: torch.nn.Module) -> None:
        nni.report_final_result(evaluate(model))

    space = RawFormatModelSpace.from_model(SmallCNN(in_channels=1), FunctionalEvaluator(evaluator))
    engine = SequentialExecutionEngine(max_model_count=trials)
    chosen = _nni_strategy(strategy)
    start = time.perf_counter()
    chosen(space, engine)
    seconds = time.perf_counter() - start
    best = list(chosen.list_models(sort=True, limit=1))
    return seconds, float(best[0].metric) if best else float("nan")


def run_autosearch(
    controller: str, trials: int, storage: str, train_config: TrainConfig, fake: bool
) -> tuple[float, float, float]:
    """(seconds, best validation accuracy, seconds spent in training)."""
    options = {"population": 8, "sample": 3} if controller == "evolution" else {}
    study = autosearch.create_study(
        f"vs-nni-{controller}",
        controller=controllers.get(controller)(SPACE, seed=0, **options),
        storage=storage,
        train=train_config,
        objectives=("accuracy", "flops"),
    )
    start = time.perf_counter()
    with _pseudo_trials() if fake else contextlib.nullcontext():
        study.optimize(trials)
    seconds = time.perf_counter() - start
    training = sum(r.metrics.get("train_seconds", 0.0) for r in study.records())
    return seconds, study.best().metrics["accuracy"], training


def bench_overhead(trials: int) -> dict:
    out: dict[str, dict] = {}
    for ours, theirs in PAIRS.items():
        nni_s, _ = run_nni(theirs, trials, lambda model: _pseudo_accuracy(_genes_of(model)))
        row = {"nni_ms_per_trial": 1000 * nni_s / trials}
        for kind in ("journal", "sqlite"):
            with tempfile.TemporaryDirectory() as tmp:
                url = f"journal:{tmp}/s.log" if kind == "journal" else f"sqlite:///{tmp}/s.db"
                seconds, _, _ = run_autosearch(ours, trials, url, TrainConfig(epochs=1), fake=True)
            row[f"autosearch_{kind}_ms_per_trial"] = 1000 * seconds / trials
        out[f"{ours} / {theirs}"] = row
    return out


def _genes_of(model: torch.nn.Module) -> dict:
    """The genes of a frozen NNI SmallCNN, read back from its layers."""
    width = model.stem[0].out_channels
    ops = []
    for block in model.blocks:
        op = block.op
        ops.append("skip" if isinstance(op, torch.nn.Identity) else f"conv{op[0].kernel_size[0]}")
    return {"width": width, "depth": len(ops), **{f"op{i}": o for i, o in enumerate(ops)}}


def bench_search(trials: int, epochs: int) -> dict:
    data = load_data("digits", seed=0)
    config = TrainConfig(epochs=epochs, batch_size=64, lr=0.05)

    def trained_accuracy(model: torch.nn.Module) -> float:
        return train(model, data, config, seed=0).val_accuracy

    out: dict[str, dict] = {}
    for ours, theirs in PAIRS.items():
        nni_s, nni_best = run_nni(theirs, trials, trained_accuracy)
        with tempfile.TemporaryDirectory() as tmp:
            as_s, as_best, as_train = run_autosearch(
                ours, trials, f"sqlite:///{tmp}/s.db", config, False
            )
        out[f"{ours} / {theirs}"] = {
            "nni_seconds": nni_s,
            "nni_best_val_accuracy": nni_best,
            "autosearch_seconds": as_s,
            "autosearch_best_val_accuracy": as_best,
            # the rest of autosearch's time: test-split evaluation, FLOPs, latency
            # (batch 1 and 32, repeated), weights stored, storage
            "autosearch_training_seconds": as_train,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--overhead-trials", type=int, default=50)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=["overhead", "search"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.disable(logging.WARNING)  # NNI logs every trial
    chosen = args.only or ["overhead", "search"]
    import nni

    result: dict[str, object] = {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "nni": nni.__version__,
        "space": "small CNN (width x depth x ops), digits",
    }
    if "overhead" in chosen:
        result["overhead"] = bench_overhead(args.overhead_trials)
    if "search" in chosen:
        result["search"] = {"trials": args.trials, "epochs": args.epochs} | bench_search(
            args.trials, args.epochs
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
