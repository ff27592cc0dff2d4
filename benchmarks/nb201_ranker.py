"""The ranker (autosearch.evaluation.ranker) on NAS-Bench-201: how well zero-cost
estimates rank the cells once a few of them are trained, and which cell a search that
trains only those few ends with.

Reads what ``nb201_proxies.py`` stored (each seed's cells, their proxies at the real
size, their published CIFAR-10 accuracies). A training is the published accuracy of
the cell it trains (NAS-Bench-201's own 200-epoch training: what the table holds), the
protocol of NAS-Bench-Suite-Zero's predictor experiments. Features of a cell: the
``--estimates`` (default: the default zero-cost estimate's proxies; the ranker's prior
before anything is trained is their log ranks summed, the estimate itself), and the
cell's operations, one-hot per edge. For each
budget of ``k`` trainings, the ways to spend them:

- ``prior``: none; the estimates' log ranks summed (the zero-cost estimate);
- ``top``: the prior's best ``k`` trained (a confirmation of the estimate's top, no
  ranker), the ranker fitted on them;
- ``random``: ``k`` cells drawn at random, trained, the ranker fitted on them;
- ``active``: the prior's top ``k / 4`` first, then rounds of ``k / 4`` chosen by
  :meth:`Ranker.choose` (the ranked top where the members disagree most), refitted
  after each round.

Figures over every cell (as nb201_supernet.py defines them): Kendall tau and Spearman,
tau within the better half, precision of the top 10, and the pick: the best published
accuracy among the trained cells and the ranker's top cell (a user trains what they
pick). Prints JSON:

    python benchmarks/nb201_ranker.py benchmarks/nb201/proxies-1000-cells-3-seeds.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from nb201_proxies import figures, published  # noqa: E402

from autosearch.evaluation.proxies import ProxyConfig  # noqa: E402
from autosearch.evaluation.ranker import Ranker, RankerConfig  # noqa: E402

OPS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
BUDGETS = (8, 20, 40)


def encoding(cell: str) -> list[float]:
    """One-hot operation per edge of a cell string (``|op~0|+|op~0|op~1|+|...|``)."""
    ops = [token.split("~")[0] for token in cell.split("|") if "~" in token]
    return [float(op == o) for op in ops for o in OPS]


def spend(
    strategy: str, k: int, features: np.ndarray, truth: np.ndarray, estimates: int, seed: int
) -> dict[str, Any]:
    """Train ``k`` cells the ``strategy``'s way; the figures of the ranking it ends with."""
    config = RankerConfig(seed=seed)
    ranker = Ranker(config, estimates=estimates)
    trained: list[int] = []
    k = min(k, len(truth))  # a run of fewer cells than the budget trains them all
    if strategy == "top":
        trained = [int(i) for i in np.argsort(-ranker.predict(features)[0], kind="stable")[:k]]
    elif strategy == "random":
        trained = [int(i) for i in np.random.default_rng(seed).permutation(len(truth))[:k]]
    elif strategy == "active":
        step = max(1, k // 4)
        while len(trained) < k:
            ranker.fit(features[trained], truth[trained])
            trained += ranker.choose(features, min(step, k - len(trained)), taken=set(trained))
    ranker.fit(features[trained], truth[trained])
    mean, _ = ranker.predict(features)
    top = int(np.argmax(mean))
    result = figures(mean, truth)
    result["trained"] = len(trained)
    result["pick_published"] = float(max(truth[[*trained, top]]))
    return result


def run(stored: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    table = published()
    out: dict[str, Any] = {"budgets": list(BUDGETS), "seeds": []}
    for run_ in stored["seeds"]:
        columns = run_["scored_columns"]
        rows = run_["scored"]
        cells = [r[0] for r in rows]
        truth = np.array([r[1] for r in rows])
        given = {c: i for i, c in enumerate(columns)}
        measured = {"flops": "flops", "params": "params"}  # the published ones
        estimates = np.array(
            [
                [table[r[0]][measured[n]] if n in measured else r[given[n]] for n in names]
                for r in rows
            ]
        )
        estimates = np.where(np.isfinite(estimates), estimates, np.nan)
        low = np.nanmin(estimates, axis=0)
        estimates = np.where(np.isnan(estimates), low - 1.0, estimates)  # unscored: the worst
        features = np.hstack([estimates, np.array([encoding(c) for c in cells])])
        seed = int(run_["seed"])
        figures_by = {"prior": spend("prior", 0, features, truth, estimates.shape[1], seed)}
        for k in BUDGETS:
            for strategy in ("top", "random", "active"):
                figures_by[f"{strategy} {k}"] = spend(
                    strategy, k, features, truth, estimates.shape[1], seed
                )
        out["seeds"].append(
            {
                "seed": seed,
                "cells": len(cells),
                "estimates": list(names),
                "best_of_the_cells_published": float(truth.max()),
                "figures": figures_by,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("proxies", type=Path, help="nb201_proxies.py's JSON")
    parser.add_argument(
        "--estimates",
        default=",".join(ProxyConfig().names),
        help="the proxies (and flops, params) a cell's estimate combines",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    names = tuple(args.estimates.split(","))
    text = json.dumps(run(json.loads(args.proxies.read_text()), names), indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
