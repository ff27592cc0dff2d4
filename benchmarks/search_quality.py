"""Controller benchmark on NAS-Bench-201 with tabular evaluation. Prints JSON (and,
with ``--markdown FILE``, the same figures as Markdown tables).

Single objective: every controller searches NB201Space for the largest budget, over
``--seeds`` seeds, through the public API (``ask``, then ``tell`` with the cell's
validation accuracy). Per controller and budget (``--budgets``, default 50, 100, 150,
300): the share of seeds that found the table's best cell, and the mean best
validation accuracy so far; and the mean ms of one ask + tell over the last 50 results
before the largest budget (the controller then holds that many results).

Multi-objective (``--mo-seeds``): maximise validation accuracy and minimise a cost
(``--cost``: ``flops``, counted from each cell, or any metric column named with
``--metric``), as a percentage of the hypervolume of the table's true front (the whole
table is enumerated), reference point ``--reference`` (default: 80 % accuracy and the
largest cost in the table).

    python benchmarks/make_nb201_table.py runs/nb201_synthetic.csv
    python benchmarks/search_quality.py [--table runs/nb201_synthetic.csv] [--seeds 50]
        [--mo-seeds 20] [--metric latency=lat_ms --cost latency] [--markdown out.md]

A table of your own: ``--table FILE --key COLUMN --accuracy COLUMN`` (CSV or JSON, as
``autosearch.Table`` reads it).

The zero-cost warm-up (``--warmup PROXIES.json ...``, files written by
``nb201_proxies.py``: cells scored by the proxies on CIFAR-10 at their real size): each
single-objective controller also runs as ``NAME+zc``, wrapped in
``controllers.ZeroCostWarmup``: a pool of ``--warmup-pool`` cells drawn (with the seed)
from the scored ones, its ``--warmup-first`` best by the estimate of
``--warmup-proxies`` (default: the default estimate's) combined by ``--warmup-aggregate``
(default: AZ-NAS's sum of log ranks) proposed first. Per controller, also the evaluations each seed
needed to reach the table's best cell (``evals_to_best``; null: not within the largest
budget), and the proxies' cost of the pool (``warmup_proxy_seconds``, as measured).

    python benchmarks/search_quality.py --table ../shared/benchdata/nb201_cifar10_valid.csv \
        --warmup benchmarks/nb201/proxies-pool.json --mo-seeds 0
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import optuna
from evaluator_overhead import machine

from autosearch import Controller, Outcome, ProxyConfig, Table
from autosearch.scoring.pareto import hypervolume as pareto_hypervolume
from autosearch.scoring.ranks import AGGREGATIONS
from controllers import (
    NSGA2,
    TPE,
    LocalSearch,
    RandomSearch,
    RegularizedEvolution,
    Reinforce,
    ZeroCostWarmup,
)
from search_spaces import NB201Space

VERBOSE = True  # progress lines on stderr
HERE = Path(__file__).resolve().parent
SYNTHETIC = HERE.parent / "runs" / "nb201_synthetic.csv"

Make = Callable[[NB201Space, int], Controller]

SINGLE: dict[str, Make] = {
    "random": lambda s, seed: RandomSearch(s, seed=seed),
    "evolution": lambda s, seed: RegularizedEvolution(s, seed=seed),
    "reinforce": lambda s, seed: Reinforce(s, seed=seed),
    "reinforce-transformer": lambda s, seed: Reinforce(s, seed=seed, policy="transformer"),
    "tpe": lambda s, seed: TPE(s, seed=seed),
    "local": lambda s, seed: LocalSearch(s, seed=seed),
    # The textbook algorithms: the same controllers without the predictor-guided walk.
    "evolution-textbook": lambda s, seed: RegularizedEvolution(s, seed=seed, walk=0),
    "reinforce-textbook": lambda s, seed: Reinforce(s, seed=seed, walk=0),
    "tpe-textbook": lambda s, seed: TPE(s, seed=seed, walk=0),
}


def scored_cells(paths: Sequence[Path]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Cells scored by ``nb201_proxies.py`` (every file's seeds), and the seconds a cell
    each proxy took there (building the network included as ``build``)."""
    cells: dict[str, dict[str, float]] = {}
    seconds: Counter[str] = Counter()
    counted = default_cells = 0
    for path in paths:
        for run in json.loads(Path(path).read_text())["seeds"]:
            columns = run["scored_columns"]
            for row in run["scored"]:
                cells.setdefault(row[0], dict(zip(columns[2:], row[2:], strict=True)))
            seconds.update(run["seconds"])
            counted += run["cells"]
            if "default_seconds_a_cell" in run:  # the default estimate, timed alone
                seconds["default"] += run["default_seconds_a_cell"] * run["cells"]
                default_cells += run["cells"]
    each = {name: s / max(counted, 1) for name, s in seconds.items()}
    if default_cells:
        each["default"] = seconds["default"] / default_cells
    return cells, each


def warm_variants(
    names: Sequence[str],
    cells: Mapping[str, Mapping[str, float]],
    pool: int,
    first: int,
    proxies: Sequence[str],
    aggregate: str,
) -> dict[str, Make]:
    """Each controller of ``names`` wrapped in the zero-cost warm-up, its pool drawn
    with the seed from ``cells``."""
    keys = sorted(cells)
    if pool > len(keys):
        raise SystemExit(f"--warmup-pool {pool}: the files score only {len(keys)} cells")

    def scores(space: NB201Space) -> Callable:
        def score(archs):
            found = [cells[space.to_string(a)] for a in archs]
            return {p: [c[p] for c in found] for p in proxies}

        return score

    def make(name: str) -> Make:
        def build(space: NB201Space, seed: int) -> Controller:
            rng = np.random.default_rng([seed, 20211])
            drawn = [space.from_string(keys[i]) for i in rng.choice(len(keys), pool, False)]
            return ZeroCostWarmup(
                space,
                controller=SINGLE[name](space, seed),
                scores=scores(space),
                proxies=proxies,
                aggregate=aggregate,
                first=first,
                candidates=drawn,
            )

        return build

    return {f"{name}+zc": make(name) for name in names}


def _multi(cost: str) -> dict[str, Make]:
    objectives = {"accuracy": "maximize", cost: "minimize"}
    return {
        "random": lambda s, seed: RandomSearch(s, seed=seed),
        "evolution": lambda s, seed: RegularizedEvolution(s, seed=seed, objectives=objectives),
        "nsga2": lambda s, seed: NSGA2(s, seed=seed, objectives=objectives),
        "tpe": lambda s, seed: TPE(s, seed=seed, objectives=objectives),
    }


class Landscape:
    """Every cell of the table: validation accuracy (fraction) and cost, by string."""

    def __init__(self, table: Table, space: NB201Space, cost: str) -> None:
        rows = table.rows()
        scale = 100.0 if max(r[table.accuracy] for r in rows.values()) > 1 else 1.0
        columns = dict(table.metrics)
        self.accuracy = {k: r[table.accuracy] / scale for k, r in rows.items()}
        if cost in columns:
            self.cost = {k: r[columns[cost]] for k, r in rows.items()}
        else:  # counted from the architecture, as a study would
            self.cost = {k: float(getattr(space.cost(space.from_string(k)), cost)) for k in rows}
        self.top = max(self.accuracy.values())
        self.best = {k for k, v in self.accuracy.items() if v == self.top}

    def front_hypervolume(self, reference: tuple[float, float]) -> float:
        keys = list(self.accuracy)
        return hypervolume([(self.accuracy[k], self.cost[k]) for k in keys], reference)


def hypervolume(points: Sequence[tuple[float, float]], reference: tuple[float, float]) -> float:
    """Area dominated by (accuracy ↑, cost ↓) points, bounded by ``reference``
    (accuracy, cost): linear in both (autosearch.scoring.pareto.hypervolume)."""
    return pareto_hypervolume(points, reference, ["maximize", "minimize"]) if points else 0.0


def search(
    make: Make,
    land: Landscape,
    space: NB201Space,
    budget: int,
    seed: int,
    cost: str | None = None,
) -> tuple[list[str], float]:
    """The cells evaluated, in order, and the mean ms of ask + tell over the last 50."""
    controller = make(space, seed)
    asked: list[str] = []
    seconds: list[float] = []
    for _ in range(budget):
        start = time.perf_counter()
        arch = controller.ask()
        key = space.to_string(arch)
        accuracy = land.accuracy[key]
        objectives = {"accuracy": accuracy}
        if cost is not None:
            objectives[cost] = land.cost[key]
        controller.tell(arch, Outcome(reward=accuracy, objectives=objectives))
        seconds.append(time.perf_counter() - start)
        asked.append(key)
    return asked, 1e3 * float(np.mean(seconds[-50:]))


def single_objective(
    makers: Mapping[str, Make], land: Landscape, space: NB201Space, budgets: list[int], seeds: int
) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, make in makers.items():
        found = np.zeros((seeds, len(budgets)), dtype=bool)
        best = np.zeros((seeds, len(budgets)))
        ms, to_best = [], []
        for seed in range(seeds):
            asked, overhead = search(make, land, space, budgets[-1], seed)
            ms.append(overhead)
            hits = [i + 1 for i, k in enumerate(asked) if k in land.best]
            to_best.append(hits[0] if hits else None)
            so_far = np.maximum.accumulate([land.accuracy[k] for k in asked])
            for j, b in enumerate(budgets):
                best[seed, j] = so_far[b - 1]
                found[seed, j] = bool(land.best & set(asked[:b]))
        out[name] = {
            "found_best": {b: float(found[:, j].mean()) for j, b in enumerate(budgets)},
            "best_val": {b: float(best[:, j].mean()) for j, b in enumerate(budgets)},
            "ask_tell_ms": float(np.mean(ms)),
            "evals_to_best": to_best,
            "evals_to_best_median": _median_censored(to_best, budgets[-1]),
        }
        if VERBOSE:  # progress, one line per controller
            print(f"{name}: {out[name]}", file=sys.stderr)
    return out


def _median_censored(values: Sequence[int | None], budget: int) -> float | None:
    """The median of evaluations to the best, a seed that never found it counted as
    past the budget; None where half the seeds or more never found it."""
    ordered = sorted(v if v is not None else budget + 1 for v in values)
    median = float(np.median(ordered))
    return None if median > budget else median


def multi_objective(
    land: Landscape,
    space: NB201Space,
    cost: str,
    budgets: list[int],
    seeds: int,
    reference: tuple[float, float],
) -> dict[str, dict[str, object]]:
    true = land.front_hypervolume(reference)
    out: dict[str, dict[str, object]] = {}
    for name, make in _multi(cost).items():
        share = np.zeros((seeds, len(budgets)))
        ms = []
        for seed in range(seeds):
            asked, overhead = search(make, land, space, budgets[-1], seed, cost)
            ms.append(overhead)
            for j, b in enumerate(budgets):
                points = [(land.accuracy[k], land.cost[k]) for k in asked[:b]]
                share[seed, j] = hypervolume(points, reference) / true
        out[name] = {
            "hypervolume_percent": {
                b: 100 * float(share[:, j].mean()) for j, b in enumerate(budgets)
            },
            "worst_seed_percent": {
                b: 100 * float(share[:, j].min()) for j, b in enumerate(budgets)
            },
            "ask_tell_ms": float(np.mean(ms)),
        }
        if VERBOSE:  # progress, one line per controller
            print(f"{name}: {out[name]}", file=sys.stderr)
    return out


def markdown(result: dict[str, object]) -> str:
    budgets = result["budgets"]
    assert isinstance(budgets, list)
    lines = [
        f"Table: {result['table']} (best validation accuracy {result['table_best_val']:.4f}); "
        f"{result['seeds']} seeds.",
    ]
    if "single" in result:
        lines += [
            "",
            "| controller | found the best by "
            + " / ".join(map(str, budgets))
            + " | best validation accuracy at "
            + " / ".join(map(str, budgets))
            + " | evaluations to the best, median | ms per ask + tell |",
            "| --- | --- | --- | --- | --- |",
        ]
    for name, row in result.get("single", {}).items():  # type: ignore[attr-defined]
        lines.append(
            f"| {name} | "
            + " / ".join(f"{100 * row['found_best'][b]:.0f} %" for b in budgets)
            + " | "
            + " / ".join(f"{100 * row['best_val'][b]:.2f}" for b in budgets)
            + f" | {row.get('evals_to_best_median') or 'not found'} | {row['ask_tell_ms']:.1f} |"
        )
    if "multi" in result:
        mo = result["multi"]
        assert isinstance(mo, dict)
        lines += [
            "",
            f"Multi-objective (accuracy, {mo['cost']}), {mo['seeds']} seeds, reference "
            f"{mo['reference']}: hypervolume as a percentage of the true front's, mean "
            "(worst seed).",
            "",
            "| controller | " + " | ".join(map(str, budgets)) + " | ms per ask + tell |",
            "| --- | " + " | ".join("---" for _ in budgets) + " | --- |",
        ]
        for name, row in mo["controllers"].items():
            lines.append(
                f"| {name} | "
                + " | ".join(
                    f"{row['hypervolume_percent'][b]:.1f} % ({row['worst_seed_percent'][b]:.1f})"
                    for b in budgets
                )
                + f" | {row['ask_tell_ms']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--table", default=str(SYNTHETIC), help="default: the synthetic table")
    parser.add_argument("--key", default="arch", help="column of the architecture strings")
    parser.add_argument("--accuracy", default="val_accuracy", help="validation-accuracy column")
    parser.add_argument(
        "--metric",
        action="append",
        default=[],
        help="NAME=COLUMN, a metric column: latency=lat_ms",
    )
    parser.add_argument("--budgets", default="50,100,150,300")
    parser.add_argument("--seeds", type=int, default=50, help="0: no single-objective runs")
    parser.add_argument("--mo-seeds", type=int, default=20, help="0: no multi-objective runs")
    parser.add_argument("--cost", default="flops", help="the cost objective: flops or a --metric")
    parser.add_argument("--reference", default=None, help="ACCURACY,COST (default 0.8,max cost)")
    parser.add_argument("--controllers", default=None, help="comma-separated (default: all)")
    parser.add_argument("--markdown", default=None, help="also write Markdown tables here")
    parser.add_argument("--warmup", nargs="+", type=Path, default=[], help="nb201_proxies JSON")
    parser.add_argument("--warmup-pool", type=int, default=256)
    parser.add_argument("--warmup-first", type=int, default=16)
    parser.add_argument("--warmup-proxies", default=",".join(ProxyConfig().names))
    parser.add_argument("--warmup-aggregate", default="log_rank", choices=AGGREGATIONS)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("autosearch").setLevel(logging.WARNING)
    if args.table == str(SYNTHETIC) and not SYNTHETIC.exists():
        subprocess.run(
            [sys.executable, str(HERE / "make_nb201_table.py"), str(SYNTHETIC)], check=True
        )
    metrics = dict(m.split("=", 1) for m in args.metric)
    table = Table(
        path=args.table,
        key=args.key,
        accuracy=args.accuracy,
        test_accuracy=None,
        train_time=None,
        metrics=metrics,
    )
    space = NB201Space()
    land = Landscape(table, space, args.cost)
    budgets = sorted(int(b) for b in args.budgets.split(","))
    names = args.controllers.split(",") if args.controllers else list(SINGLE)
    result: dict[str, object] = {
        "machine": machine(),
        "table": args.table,
        "table_best_val": land.top,
        "budgets": budgets,
        "seeds": args.seeds,
    }
    makers = {name: SINGLE[name] for name in names}
    if args.warmup:
        cells, each = scored_cells(args.warmup)
        proxies = args.warmup_proxies.split(",")
        if tuple(proxies) == ProxyConfig().names and "default" in each:
            per_cell = each.get("build", 0.0) + each["default"]  # timed alone
        else:  # their shares of the full run (a shared pass charged to its first proxy)
            per_cell = each.get("build", 0.0) + sum(each[p] for p in proxies)
        makers.update(
            warm_variants(
                names,
                cells,
                args.warmup_pool,
                args.warmup_first,
                proxies,
                args.warmup_aggregate,
            )
        )
        result["warmup"] = {
            "files": [str(p) for p in args.warmup],
            "scored_cells": len(cells),
            "pool": args.warmup_pool,
            "first": args.warmup_first,
            "proxies": proxies,
            "aggregate": args.warmup_aggregate,
            "proxy_seconds_a_cell": round(per_cell, 3),
            "warmup_proxy_seconds": round(per_cell * args.warmup_pool, 1),
        }
    if args.seeds:  # 0: multi-objective runs only
        result["single"] = single_objective(makers, land, space, budgets, args.seeds)
    if args.mo_seeds:
        if args.reference:
            ref_acc, ref_cost = (float(x) for x in args.reference.split(","))
        else:
            ref_acc, ref_cost = 0.8, max(land.cost.values())
        reference = (ref_acc, ref_cost)
        result["multi"] = {
            "cost": args.cost,
            "seeds": args.mo_seeds,
            "reference": list(reference),
            "controllers": multi_objective(
                land, space, args.cost, budgets, args.mo_seeds, reference
            ),
        }
    print(json.dumps(result, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(markdown(result))


if __name__ == "__main__":
    main()
