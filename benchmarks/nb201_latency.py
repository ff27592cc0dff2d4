"""Add a measured CPU latency column (``lat_ms``) to an NB201 table, for multi-objective
runs on accuracy and latency.

Latency is measured, not counted: each NB201 network (C=16, N=5, CIFAR-sized input,
batch 1, one thread, inference) is timed on this machine. Timing all 15,625 networks
would take hours, so, as FBNet and ProxylessNAS do, it is predicted from a lookup
table of measured per-operation latencies: the network with every edge ``none``, plus,
per edge, a sixth of what making all six edges that operation adds. The lookup table is
then checked against direct measurements of ``--check`` random cells, and the check is
printed (JSON): Spearman rank correlation and mean absolute percentage error.

    python benchmarks/nb201_latency.py runs/nb201_synthetic.csv runs/nb201_latency.csv
    python benchmarks/search_quality.py --table runs/nb201_latency.csv \\
        --metric latency=lat_ms --cost latency --seeds 0
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from search_spaces import NB201Space
from search_spaces.nb201 import EDGES, OPERATIONS

SHAPE = (3, 32, 32)


def latency_ms(space: NB201Space, ops: dict[tuple[int, int], str], repeats: int) -> float:
    """Median ms of one forward pass at batch 1, after a warm-up."""
    genes = {f"node{j}.in{i}": op for (j, i), op in ops.items()}
    model = space.network(space.make(genes), input_shape=SHAPE, num_classes=10).build().eval()
    x = torch.randn(1, *SHAPE)
    times = []
    with torch.inference_mode():
        for _ in range(3):
            model(x)
        for _ in range(repeats):
            start = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("table", help="an NB201 table (CSV with an 'arch' column)")
    parser.add_argument("out", help="the same table with a lat_ms column")
    parser.add_argument("--repeats", type=int, default=20, help="timed passes per network")
    parser.add_argument("--check", type=int, default=100, help="random cells timed directly")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    space = NB201Space()
    every = {op: latency_ms(space, dict.fromkeys(EDGES, op), args.repeats) for op in OPERATIONS}
    base = every["none"]
    per_edge = {op: (every[op] - base) / len(EDGES) for op in OPERATIONS}

    def predicted(arch_string: str) -> float:
        arch = space.from_string(arch_string)
        return base + sum(per_edge[str(arch[f"node{j}.in{i}"])] for j, i in EDGES)

    with open(args.table, newline="") as f:
        rows = list(csv.DictReader(f))
    rng = np.random.default_rng(args.seed)
    picks = rng.choice(len(rows), size=min(args.check, len(rows)), replace=False)
    measured, model = [], []
    for index in picks:
        arch = space.from_string(rows[index]["arch"])
        ops = {(j, i): str(arch[f"node{j}.in{i}"]) for j, i in EDGES}
        measured.append(latency_ms(space, ops, args.repeats))
        model.append(predicted(rows[index]["arch"]))
    for row in rows:
        row["lat_ms"] = f"{predicted(row['arch']):.4f}"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    m, p = np.array(measured), np.array(model)
    print(
        json.dumps(
            {
                "wrote": args.out,
                "all_edges_ms": {op: round(v, 3) for op, v in every.items()},
                "checked_cells": len(m),
                "spearman": round(float(spearmanr(m, p).statistic), 3),
                "mean_abs_percent_error": round(float(np.mean(np.abs(p - m) / m)) * 100, 2),
                "measured_ms_range": [round(float(m.min()), 3), round(float(m.max()), 3)],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
