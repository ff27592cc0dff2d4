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

``--whole-space FILE``: every one of the space's 15,625 cells, under the same protocol
(the seed's batch, each cell's own initialization), in an order the seed draws, so that
the cells scored so far are a uniform sample of the space. Resumable across machines and
sessions: the file holds every cell scored (written every 50 cells, and on SIGINT,
SIGTERM or after ``--minutes``), each run adds a part (its device, machine, cells and
seconds), and the figures are those of the cells scored so far. ``--reuse RUN.json``
takes the rows a run of this script scored with the same seed (the same protocol).
``--part I/K`` scores every K-th cell of the order from the I-th, so that K runs at once
(the cores of one machine, or several machines) share the file: each save merges its
cells into the file as it is then, under a lock of the file's folder::

    python benchmarks/nb201_proxies.py --whole-space benchmarks/nb201/proxies-whole-space.json \
        --seeds 0 --threads 1 [--minutes 60] [--reuse RUN.json] [--part 0/2]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterator
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


def batch_of(seed: int, batch: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed's batch of CIFAR-10 training images, normalized by its own statistics."""
    x, y = sampled(batch, 32, seed=seed)
    images = torch.from_numpy(x).float() / 255.0
    mean = images.mean(dim=(0, 2, 3), keepdim=True)
    std = images.std(dim=(0, 2, 3), keepdim=True)
    return ((images - mean) / std).to(device), torch.from_numpy(y).to(device)


def score_cell(
    space: NB201Space, key: str, seed: int, images, labels, names=tuple(PROXIES)
) -> dict:
    """Every proxy (or ``names``) of the cell ``key``, initialized with its own seed."""
    torch.manual_seed(cell_seed(seed, key))
    model = space.build(space.from_string(key), input_shape=(3, 32, 32), num_classes=10)
    return proxy_scores(model.to(images.device), images, labels, names)


def estimators(keys: list[str], columns: dict[str, np.ndarray], table: dict) -> dict:
    """Each proxy's, the published costs' and each combination's figures over ``keys``."""
    truth = np.array([table[k]["accuracy"] for k in keys])
    columns = dict(columns)
    columns["flops"] = np.array([table[k]["flops"] for k in keys])
    columns["params"] = np.array([table[k]["params"] for k in keys])
    for name, (members, how) in ENSEMBLES.items():
        columns[name] = combined({m: columns[m] for m in members}, how)
    return {name: figures(values, truth) for name, values in columns.items()}


def run_seed(
    seed: int, cells: int, batch: int, table: dict, device: str, timed: int
) -> dict[str, Any]:
    space = NB201Space(channels=16, cells=5)
    rng = np.random.default_rng(seed)
    archs = [space.sample(rng) for _ in range(cells)]
    keys = [space.to_string(a) for a in archs]
    images, labels = batch_of(seed, batch, device)
    scores: dict[str, list[float]] = {n: [] for n in PROXIES}
    seconds: dict[str, float] = dict.fromkeys(PROXIES, 0.0)
    build = 0.0
    for i, key in enumerate(keys):
        start = time.perf_counter()
        found = score_cell(space, key, seed, images, labels)
        build += time.perf_counter() - start - sum(found[f"{n}_seconds"] for n in PROXIES)
        for name in PROXIES:
            scores[name].append(found[name])
            seconds[name] += found[f"{name}_seconds"]
        if (i + 1) % 20 == 0:
            print(f"seed {seed}: {i + 1}/{cells} cells", file=sys.stderr, flush=True)
    default_seconds = 0.0  # the default estimate alone, as a study computes it
    for key in keys[:timed]:
        found = score_cell(space, key, seed, images, labels, DEFAULT)
        default_seconds += sum(found[f"{n}_seconds"] for n in DEFAULT)
    truth = np.array([table[k]["accuracy"] for k in keys])
    columns = {n: np.array(v, dtype=float) for n, v in scores.items()}
    return {
        "seed": seed,
        "cells": cells,
        "batch": batch,
        "estimators": estimators(keys, columns, table),
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


WHOLE = 15625  # the space's cells


def _row(key: str, truth: float, found: dict[str, float]) -> list:
    return [key, truth, *(float(f"{found[n]:.9g}") for n in PROXIES)]


def _write(path: Path, report: dict[str, Any]) -> None:
    """``report`` with one scored cell a line, replaced whole (never half written)."""
    rows = ",\n  ".join(json.dumps(r) for r in report["scored"])
    head = json.dumps({k: v for k, v in report.items() if k != "scored"}, indent=1)
    text = head[:-2] + f',\n "scored": [\n  {rows}\n ]\n}}\n'
    partial = path.with_name(path.name + ".partial")
    with partial.open("w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def _fresh(seed: int, batch: int) -> dict[str, Any]:
    return {
        "size": "C=16, N=5, 32x32 (NAS-Bench-201's own)",
        "seed": seed,
        "batch": batch,
        "of": WHOLE,
        "default": {"proxies": list(DEFAULT), "aggregation": "log_rank"},
        "columns": ["cell", "published", *PROXIES],
        "parts": [],
        "scored": [],
    }


def _read(path: Path, seed: int, batch: int) -> dict[str, Any]:
    if not path.exists():
        return _fresh(seed, batch)
    report = json.loads(path.read_text())
    if (report["seed"], report["batch"]) != (seed, batch):
        raise SystemExit(f"{path} holds seed {report['seed']}, batch {report['batch']}")
    return report


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The file's folder locked (flock): one run at a time reads, merges and replaces the
    file, so that runs of several parts at once keep each other's cells."""
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)


def whole_space(
    path: Path, seed: int, batch: int, table: dict, device: str, minutes: float | None,
    reuse: Path | None, limit: int | None = None, part: tuple[int, int] = (0, 1),
) -> dict[str, Any]:  # fmt: skip
    """Score the space's cells not yet in ``path`` (see the module's docstring): this
    run's ``part`` (index, count) of the seed's order, at most ``limit`` cells. Each save
    merges this run's cells into the file as it is then (other parts' runs write it too)."""
    index, count = part
    entry = {
        "id": uuid.uuid4().hex[:12],
        "part": f"{index}/{count}",
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "machine": machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cells": 0,
        "seconds": 0.0,
    }
    with _locked(path):
        report = _read(path, seed, batch)
        done = {row[0] for row in report["scored"]}
        if reuse is not None:
            earlier = json.loads(reuse.read_text())
            (run,) = [r for r in earlier["seeds"] if r["seed"] == seed and r["batch"] == batch]
            assert run["scored_columns"] == report["columns"], "another run's columns"
            rows = [r for r in run["scored"] if r[0] not in done and not done.add(r[0])]
            report["scored"] += rows
            report["parts"].append(
                {"reused": str(reuse), "cells": len(rows), "machine": earlier.get("machine_name")}
            )
            _write(path, report)
    permutation = np.random.default_rng(seed).permutation(sorted(table))
    order = [k for i, k in enumerate(permutation) if i % count == index and k not in done]
    order = order[:limit] if limit is not None else order
    space = NB201Space(channels=16, cells=5)
    images, labels = batch_of(seed, batch, device)
    mine: list[list] = []  # the cells this run scored
    start = time.perf_counter()
    stop = start + minutes * 60 if minutes else float("inf")

    def save() -> dict[str, Any]:
        entry["cells"], entry["seconds"] = len(mine), round(time.perf_counter() - start, 1)
        with _locked(path):
            report = _read(path, seed, batch)
            have = {row[0] for row in report["scored"]}
            report["scored"] += [row for row in mine if row[0] not in have]
            report["parts"] = [p for p in report["parts"] if p.get("id") != entry["id"]]
            report["parts"].append(entry)
            keys = [row[0] for row in report["scored"]]
            columns = {n: np.array([r[2 + i] for r in report["scored"]], dtype=float)
                       for i, n in enumerate(PROXIES)}  # fmt: skip
            report["cells_scored"] = len(keys)
            report["complete"] = len(keys) == WHOLE
            report["estimators"] = estimators(keys, columns, table) if keys else {}
            report["best_of_the_cells_published"] = max(
                (table[k]["accuracy"] for k in keys), default=None
            )
            _write(path, report)
        return report

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        for key in order:
            if time.perf_counter() > stop:
                break
            found = score_cell(space, key, seed, images, labels)
            mine.append(_row(key, table[key]["accuracy"], found))
            if len(mine) % 50 == 0:
                merged = save()
                print(f"{merged['cells_scored']}/{WHOLE} cells", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted: the cells scored so far are kept", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return save()


def _part(text: str) -> tuple[int, int]:
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise SystemExit(f"--part {text!r}: I/K with 0 <= I < K, like 0/2 and 1/2")
    return int(index), int(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--timed", type=int, default=50, help="cells the default is timed on")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the proxies on a GPU")
    parser.add_argument("--out", type=Path, help="also written after each seed")
    parser.add_argument("--whole-space", type=Path, help="score every cell into this file")
    parser.add_argument("--minutes", type=float, help="--whole-space: stop after these")
    parser.add_argument("--reuse", type=Path, help="--whole-space: a run's rows of the seed")
    parser.add_argument("--part", default="0/1", help="--whole-space: I/K, every K-th cell from I")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    table = published()
    if args.whole_space:
        report = whole_space(
            args.whole_space, args.seeds[0], args.batch, table, args.device, args.minutes,
            args.reuse, part=_part(args.part),
        )  # fmt: skip
        print(json.dumps({k: report[k] for k in ("cells_scored", "of", "parts")}, indent=1))
        return
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
