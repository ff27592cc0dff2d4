"""Controller benchmark on NAS-Bench-201 with tabular evaluation. Prints JSON.

Every registered single-objective controller searches NB201Space for ``--budget``
evaluations, looked up in the table, over ``--seeds`` seeds. Per controller: mean and
standard deviation of the best validation accuracy found, and of the test accuracy of
that architecture (the test column plays no part in the search); the regret against
the table's best validation accuracy; the mean ask + tell overhead in milliseconds;
and the one-sided Mann-Whitney U p-value that it finds better architectures than
random search (measured in the same run).

    python benchmarks/make_nb201_table.py runs/nb201_synthetic.csv
    python benchmarks/controllers.py --table runs/nb201_synthetic.csv --budget 100 --seeds 20
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path, and this file's name
# would shadow the `controllers` package: take the folder off the path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np
import optuna
from scipy.stats import mannwhitneyu

from autosearch import Outcome, Table
from autosearch.registry import controllers
from search_spaces import NB201Space

MULTI_OBJECTIVE = {"nsga2"}  # benchmarked on the scalar objective only when asked


def run(name: str, table: Table, budget: int, seed: int) -> tuple[float, float, float]:
    """(best validation accuracy, its test accuracy, mean ask+tell seconds)."""
    space = NB201Space()
    controller = controllers.get(name)(space, seed=seed)
    best_val, best_test, overhead = -1.0, -1.0, 0.0
    for _ in range(budget):
        start = time.perf_counter()
        arch = controller.ask()
        overhead += time.perf_counter() - start
        metrics = table.evaluate(space, arch)  # fractions, as a study would see them
        val, test = metrics["accuracy"], metrics["test_accuracy"]
        outcome = Outcome(reward=val, objectives={"accuracy": val})
        start = time.perf_counter()
        controller.tell(arch, outcome)
        overhead += time.perf_counter() - start
        if val > best_val:
            best_val, best_test = val, test
    return best_val, best_test, overhead / budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table", required=True)
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--controllers", default=None, help="comma-separated (default: all)")
    parser.add_argument("--key", default="arch", help="column of the architecture strings")
    parser.add_argument("--accuracy", default="val_accuracy")
    parser.add_argument("--test-accuracy", default="test_accuracy")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("autosearch").setLevel(logging.WARNING)
    table = Table(
        path=args.table,
        key=args.key,
        accuracy=args.accuracy,
        test_accuracy=args.test_accuracy,
        train_time=None,
    )
    scale = 100.0 if max(r[args.accuracy] for r in table.rows().values()) > 1 else 1.0
    top = max(row[args.accuracy] for row in table.rows().values()) / scale
    names = (
        args.controllers.split(",")
        if args.controllers
        else [n for n in controllers.names() if n not in MULTI_OBJECTIVE]
    )
    results: dict[str, dict[str, float]] = {}
    raw: dict[str, list[float]] = {}
    for name in names:
        runs = [run(name, table, args.budget, seed) for seed in range(args.seeds)]
        vals, tests, overheads = (np.array(x) for x in zip(*runs, strict=True))
        raw[name] = list(vals)
        results[name] = {
            "best_val_mean": float(vals.mean()),
            "best_val_std": float(vals.std()),
            "test_of_best_mean": float(tests.mean()),
            "test_of_best_std": float(tests.std()),
            "regret_mean": float(top - vals.mean()),
            "ask_tell_ms": 1e3 * float(overheads.mean()),
        }
    if "random" in raw:
        for name in names:
            if name != "random":
                p = mannwhitneyu(raw[name], raw["random"], alternative="greater").pvalue
                results[name]["p_better_than_random"] = float(p)
    print(
        json.dumps(
            {
                "table": args.table,
                "budget": args.budget,
                "seeds": args.seeds,
                "table_best_val": top,
                "controllers": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
