"""Zero-cost proxies of NAS-Bench-201 cells at the benchmark's real size (C = 16, N = 5,
32 x 32 CIFAR-10 images), ranked against the published CIFAR-10 accuracies.

For each seed: the seed draws ``--cells`` cells uniformly (the same draw as
``nb201_supernet.py``'s ranking with that seed), each network initialized with a seed
of its own (the run's seed and the cell), scored by every proxy of
``autosearch.evaluation.proxies`` on one batch of CIFAR-10 training images drawn with
the seed; beside FLOPs and parameters (the published ones) and combinations of
proxies' ranks (``autosearch.scoring.ranks.combined``): the default estimate
(``ProxyConfig()``'s proxies, AZ-NAS's log-rank aggregation), AZ-NAS's own four, and the
earlier mean rank. Figures, as nb201_supernet.py defines them: Kendall tau and Spearman over all
cells, Kendall tau within the better half (by published accuracy), precision of the
top 10, and the published accuracy of each estimator's best-ranked cell; every proxy's
seconds, charged in full (every proxy computed in one call, its shared pass charged to
the first proxy that needs it), and the default estimate's seconds a cell timed alone on
the seed's first ``--timed`` cells. Prints JSON (``--out`` writes it too):

    python benchmarks/nb201_proxies.py --seeds 0 1 2 --cells 1000 [--device cuda]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]

from evaluator_overhead import machine  # noqa: E402
from nb201_supernet import TABLE, sampled  # noqa: E402

from autosearch.evaluation.proxies import PROXIES, ProxyConfig, proxy_scores  # noqa: E402
from autosearch.scoring.ranks import combined  # noqa: E402
from search_spaces import NB201Space  # noqa: E402

DEFAULT = ProxyConfig().names
# name -> (members, aggregation)
ENSEMBLES = {
    "estimate (the default): " + " + ".join(DEFAULT): (DEFAULT, "log_rank"),
    "AZ-NAS: expressivity + progressivity + trainability + complexity": (
        ("expressivity", "progressivity", "trainability", "complexity"),
        "log_rank",
    ),
    "the default's proxies, mean rank": (DEFAULT, "mean_rank"),
    "every proxy, log rank": (tuple(PROXIES), "log_rank"),
    "mean rank: synflow + naswot + jacob_cov": (("synflow", "naswot", "jacob_cov"), "mean_rank"),
}


def published() -> dict[str, dict[str, float]]:
    import csv

    with TABLE.open() as f:
        return {
            r["arch"]: {
                "accuracy": float(r["val_accuracy"]),
                "flops": float(r["flops_M"]),
                "params": float(r["params_M"]),
            }
            for r in csv.DictReader(f)
        }


def figures(scores: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """How well ``scores`` rank the cells whose published accuracies are ``truth``."""
    scores = np.nan_to_num(scores, nan=-np.inf)
    better = np.argsort(truth)[len(truth) // 2 :]
    top = min(10, len(truth))
    return {
        "kendall_tau": float(stats.kendalltau(scores, truth)[0]),
        "spearman": float(stats.spearmanr(scores, truth)[0]),
        "kendall_tau_better_half": float(stats.kendalltau(scores[better], truth[better])[0]),
        f"precision_top{top}": len(set(np.argsort(-scores)[:top]) & set(np.argsort(-truth)[:top]))
        / top,
        "best_ranked_published": float(truth[int(np.argmax(scores))]),
    }


def cell_seed(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:4], "little")


def run_seed(
    seed: int, cells: int, batch: int, table: dict, device: str, timed: int
) -> dict[str, Any]:
    space = NB201Space(channels=16, cells=5)
    rng = np.random.default_rng(seed)
    archs = [space.sample(rng) for _ in range(cells)]
    keys = [space.to_string(a) for a in archs]
    x, y = sampled(batch, 32, seed=seed)
    images = torch.from_numpy(x).float() / 255.0
    mean = images.mean(dim=(0, 2, 3), keepdim=True)
    std = images.std(dim=(0, 2, 3), keepdim=True)
    images = ((images - mean) / std).to(device)
    labels = torch.from_numpy(y).to(device)
    scores: dict[str, list[float]] = {n: [] for n in PROXIES}
    seconds: dict[str, float] = dict.fromkeys(PROXIES, 0.0)
    build = 0.0
    for i, (arch, key) in enumerate(zip(archs, keys, strict=True)):
        start = time.perf_counter()
        torch.manual_seed(cell_seed(seed, key))
        model = space.build(arch, input_shape=(3, 32, 32), num_classes=10).to(device)
        build += time.perf_counter() - start
        found = proxy_scores(model, images, labels)
        for name in PROXIES:
            scores[name].append(found[name])
            seconds[name] += found[f"{name}_seconds"]
        if (i + 1) % 20 == 0:
            print(f"seed {seed}: {i + 1}/{cells} cells", file=sys.stderr, flush=True)
    default_seconds = 0.0  # the default estimate alone, as a study computes it
    for arch, key in list(zip(archs, keys, strict=True))[:timed]:
        torch.manual_seed(cell_seed(seed, key))
        model = space.build(arch, input_shape=(3, 32, 32), num_classes=10).to(device)
        found = proxy_scores(model, images, labels, DEFAULT)
        default_seconds += sum(found[f"{n}_seconds"] for n in DEFAULT)
    truth = np.array([table[k]["accuracy"] for k in keys])
    columns = {n: np.array(v, dtype=float) for n, v in scores.items()}
    columns["flops"] = np.array([table[k]["flops"] for k in keys])
    columns["params"] = np.array([table[k]["params"] for k in keys])
    for name, (members, how) in ENSEMBLES.items():
        columns[name] = combined({m: columns[m] for m in members}, how)
    return {
        "seed": seed,
        "cells": cells,
        "batch": batch,
        "estimators": {name: figures(values, truth) for name, values in columns.items()},
        "seconds": {**{n: round(s, 1) for n, s in seconds.items()}, "build": round(build, 1)},
        "seconds_a_cell": {n: round(s / cells, 3) for n, s in seconds.items()},
        "default_seconds_a_cell": round(default_seconds / max(1, min(timed, cells)), 3),
        "default_timed_cells": min(timed, cells),
        "best_of_the_cells_published": float(truth.max()),
        "scored": [
            [k, float(t), *(float(columns[n][i]) for n in PROXIES)]
            for i, (k, t) in enumerate(zip(keys, truth, strict=True))
        ],
        "scored_columns": ["cell", "published", *PROXIES],
    }


def dumps(report: dict[str, Any]) -> str:
    """The report as indented JSON, each scored cell's row on one line."""
    rows: list[str] = []
    seeds = []
    for run in report["seeds"]:
        scored = []
        for row in run["scored"]:
            scored.append(f"@row{len(rows)}@")
            rows.append(json.dumps(row))
        seeds.append({**run, "scored": scored})
    text = json.dumps({**report, "seeds": seeds}, indent=1)
    return re.sub(r'"@row(\d+)@"', lambda m: rows[int(m.group(1))], text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--timed", type=int, default=50, help="cells the default is timed on")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the proxies on a GPU")
    parser.add_argument("--out", type=Path, help="also written after each seed")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    table = published()
    start = time.perf_counter()
    report: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(),
        "machine_name": machine(),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "size": "C=16, N=5, 32x32 (NAS-Bench-201's own)",
        "default": {"proxies": list(DEFAULT), "aggregation": "log_rank"},
        "seeds": [],
    }
    for seed in args.seeds:  # a run cut short keeps the seeds it finished
        report["seeds"].append(
            run_seed(seed, args.cells, args.batch, table, args.device, args.timed)
        )
        report["seconds"] = round(time.perf_counter() - start, 1)
        text = dumps(report)
        if args.out:
            args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
