"""A NAS-Bench-201 supernet trained on CIFAR-10, ranked against the published accuracies
(issue 46).

1. data: CIFAR-10's 60,000 JPEGs (``../shared/datasets/cifar10-jpeg.tar.gz``, unpacked
   once into the cache), read as an image folder with its own test split; at the proxy
   scale the images are averaged down to 16 x 16.
2. supernet: ``NB201Space(channels=C, cells=N).supernet()`` trained in a study with the
   rule asked for (``--rule fair``, the default: FairNAS's strict fairness, which ranked
   best here; ``uniform``: SPOS; ``sandwich``), on the shared trainer, stored and
   resumed like any study's supernet.
3. ranking: ``--rank-cells`` cells drawn uniformly with the seed, each scored on the
   supernet (inherited weights, batch norm recalibrated, ``--rank-images`` validation
   images) and compared with its published CIFAR-10 accuracy (``cifar10-valid``, 200
   epochs, ``../shared/benchdata/nb201_cifar10_valid.csv``): Kendall tau, Spearman, tau
   within the better half, precision of the top 10, and FLOPs alone for comparison.
   ``--ceiling K`` also trains the first K ranked cells from scratch at the benchmark's
   scale: how well that scale itself ranks the published accuracies (``--ceiling-from
   RESULT.json`` does only that, for the cells an earlier run ranked).
4. search: regularized evolution over ``--search`` subnets on the supernet (each a
   trial of the study), its pick looked up in the table; ``confirm(k)`` trains the
   front's top k from scratch at the benchmark's scale, and ``best()`` (which prefers
   confirmed subnets) is the final pick, looked up too.

Prints JSON (``--out FILE`` writes it too): every phase's wall time and the whole in
minutes on this machine (CPU minutes: wall minutes times the cores used; GPU minutes
on a GPU). Two scales: ``--scale proxy`` (C = 8, N = 1, 16 x 16: the 2-core CPU, under
30 minutes) and ``--scale full`` (C = 16, N = 5, 32 x 32: a GPU). ``--smoke`` is the
smallest setting, on a slice of the images (the test suite runs it).

    python benchmarks/nb201_supernet.py --scale proxy [--rule fair] [--epochs 40]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import platform
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

import autosearch
from autosearch import SupernetConfig, TrainConfig
from autosearch.data import load_data
from autosearch.data._cache import cache_dir
from autosearch.training.train import train
from autosearch.weight_sharing.supernet import SubnetEvaluator
from controllers import RegularizedEvolution
from search_spaces import NB201Space

# The shared folder beside the checkout; AUTOSEARCH_SHARED names another (a lent GPU's copy
# of the tree has none: benchmarks/gpu_session.sh carries what it needs in .gpu/shared).
SHARED = Path(os.environ.get("AUTOSEARCH_SHARED") or Path(__file__).resolve().parents[2] / "shared")
TARBALL = SHARED / "datasets" / "cifar10-jpeg.tar.gz"
TABLE = SHARED / "benchdata" / "nb201_cifar10_valid.csv"

SCALES: dict[str, dict[str, Any]] = {
    # channels, cells, image side, supernet epochs, batch, subnets searched, ranked cells,
    # images a ranked cell / a searched subnet is scored on, confirmation epochs
    "proxy": dict(
        channels=8,
        cells=1,
        side=16,
        epochs=40,
        batch=256,
        search=1500,
        rank_cells=200,
        rank_images=10000,
        search_images=2000,
        confirm=3,
        confirm_epochs=12,
    ),
    "full": dict(
        channels=16,
        cells=5,
        side=32,
        epochs=100,
        batch=256,
        search=3000,
        rank_cells=300,
        rank_images=25000,
        search_images=5000,
        confirm=3,
        confirm_epochs=50,
    ),
    "smoke": dict(
        channels=4,
        cells=1,
        side=8,
        epochs=1,
        batch=128,
        search=6,
        rank_cells=12,
        rank_images=300,
        search_images=200,
        confirm=1,
        confirm_epochs=1,
        images=3000,
    ),
}


def cifar10(work: Path) -> Path:
    """The CIFAR-10 JPEG folder, unpacked from the shared tarball once (into the cache)."""
    if not TARBALL.is_file():
        raise SystemExit(f"{TARBALL} is absent: this benchmark needs CIFAR-10's JPEG files")
    folder = cache_dir() / "datasets" / "cifar10-jpeg"
    if not (folder / "train").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(TARBALL) as archive:
            archive.extractall(folder, filter="data")
    return folder


def images(folder: Path, side: int) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10's training images (its own test folder is kept apart from the search),
    averaged down to ``side`` x ``side``."""
    data = load_data(f"folder:{folder}", seed=0)
    x = torch.cat([data.train.x, data.val.x])
    y = torch.cat([data.train.y, data.val.y])
    return _resized(x, side), y.numpy()


def sampled(limit: int, side: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``limit`` of CIFAR-10's training images, drawn with ``seed``, read straight from
    the tarball (a small setting decodes only what it uses, not the 60,000 files)."""
    from PIL import Image

    with tarfile.open(TARBALL) as archive:
        members = [
            m for m in archive.getmembers() if m.isfile() and m.name.split("/")[-3:-2] == ["train"]
        ]
        members.sort(key=lambda m: m.name)
        classes = sorted({m.name.split("/")[-2] for m in members})
        rng = np.random.default_rng(seed)
        picked = [members[i] for i in sorted(rng.choice(len(members), limit, replace=False))]
        decoded = []
        for member in picked:
            with Image.open(archive.extractfile(member)) as img:
                decoded.append(np.asarray(img.convert("RGB")).transpose(2, 0, 1))
    x = torch.from_numpy(np.stack(decoded))
    y = np.array([classes.index(m.name.split("/")[-2]) for m in picked], dtype=np.int64)
    return _resized(x, side), y


def _resized(x: torch.Tensor, side: int) -> np.ndarray:
    if side != x.shape[-1]:
        x = F.adaptive_avg_pool2d(x.float(), side).round().to(torch.uint8)
    return x.numpy()


def published() -> dict[str, dict[str, float]]:
    with TABLE.open() as f:
        return {
            r["arch"]: {"accuracy": float(r["val_accuracy"]), "flops": float(r["flops_M"])}
            for r in csv.DictReader(f)
        }


def standalone(settings: dict[str, Any]) -> TrainConfig:
    """The recipe of a cell trained from scratch at the benchmark's scale (confirm,
    the proxy's ceiling)."""
    return TrainConfig(
        epochs=settings["confirm_epochs"],
        batch_size=settings["batch"],
        lr=0.1,
        weight_decay=5e-4,
        crop_padding=max(1, settings["side"] // 8),
        flip=True,
    )


def make_study(args: argparse.Namespace, settings: dict[str, Any], arrays: Any, root: Path):
    space = NB201Space(channels=settings["channels"], cells=settings["cells"]).supernet()
    augment = {"crop_padding": max(1, settings["side"] // 8), "flip": True}
    supernet = SupernetConfig(
        train=TrainConfig(
            epochs=settings["epochs"],
            batch_size=settings["batch"],
            lr=args.lr,
            weight_decay=5e-4,
            **augment,
        ),
        schedule=args.rule,
        eval_images=settings["search_images"],
        test_accuracy=False,
        latency=False,
    )
    return autosearch.create_study(
        f"nb201-{args.scale}-{args.rule}",
        controller=RegularizedEvolution(space, population=50, sample=10, seed=args.seed),
        data=arrays,
        supernet=supernet,
        train=standalone(settings),
        storage=f"sqlite:///{root}/nb201.db",
        seed=args.seed,
        load_if_exists=True,
    )


def rank(study: Any, settings: dict[str, Any], table: dict, seed: int) -> dict[str, Any]:
    """Kendall tau and the rest, of the supernet's scores of cells drawn uniformly."""
    space = study.space
    evaluator = study.supernet.evaluator
    config = dataclasses.replace(evaluator.config, eval_images=settings["rank_images"])
    scorer = SubnetEvaluator(evaluator.net, space, study.data, config, seed=study.definition.seed)
    rng = np.random.default_rng(seed)
    cells = [space.sample(rng) for _ in range(settings["rank_cells"])]
    start = time.perf_counter()
    scores = np.array([scorer.evaluate(arch)[1]["accuracy"] for arch in cells])
    seconds = time.perf_counter() - start
    keys = [space.describe(arch) for arch in cells]
    truth = np.array([table[k]["accuracy"] for k in keys])
    flops = np.array([table[k]["flops"] for k in keys])
    better = np.argsort(truth)[len(truth) // 2 :]
    top = min(10, len(truth))
    return {
        "cells": len(cells),
        "images_a_cell": len(scorer.val),
        "kendall_tau": float(stats.kendalltau(scores, truth)[0]),
        "spearman": float(stats.spearmanr(scores, truth)[0]),
        "kendall_tau_better_half": float(stats.kendalltau(scores[better], truth[better])[0]),
        f"precision_top{top}": len(set(np.argsort(-scores)[:top]) & set(np.argsort(-truth)[:top]))
        / top,
        "flops_kendall_tau": float(stats.kendalltau(flops, truth)[0]),
        "flops_kendall_tau_better_half": float(stats.kendalltau(flops[better], truth[better])[0]),
        "best_ranked_published": float(truth[int(np.argmax(scores))]),
        "scored": [[k, float(a), float(t)] for k, a, t in zip(keys, scores, truth, strict=True)],
        "best_of_the_cells_published": float(truth.max()),
        "seconds": seconds,
    }


def ceiling(data: Any, settings: dict[str, Any], scored: list, count: int) -> dict[str, Any]:
    """What this scale can show at all: the first ``count`` ranked cells (``scored``:
    [cell, supernet score, published accuracy]) trained from scratch at the benchmark's
    scale (the confirm recipe), their accuracy against the published one (the most an
    estimator at this scale could hope to match) and against the supernet's scores."""
    space = NB201Space(channels=settings["channels"], cells=settings["cells"])
    scored = scored[:count]
    trained = []
    start = time.perf_counter()
    for key, _score, _truth in scored:
        torch.manual_seed(0)
        model = space.build(
            space.from_string(key), input_shape=data.input_shape, num_classes=data.num_classes
        )
        trained.append(train(model, data, standalone(settings), seed=0).val_accuracy)
        print(f"ceiling: {len(trained)}/{len(scored)} {key} {trained[-1]:.4f}", file=sys.stderr)
    seconds = time.perf_counter() - start
    supernet = np.array([score for _, score, _ in scored])
    truth = np.array([published for _, _, published in scored])
    alone = np.array(trained)
    return {
        "cells": len(scored),
        "epochs": settings["confirm_epochs"],
        "standalone_vs_published_kendall_tau": float(stats.kendalltau(alone, truth)[0]),
        "standalone_vs_published_spearman": float(stats.spearmanr(alone, truth)[0]),
        "supernet_vs_standalone_kendall_tau": float(stats.kendalltau(supernet, alone)[0]),
        "supernet_vs_published_kendall_tau_same_cells": float(stats.kendalltau(supernet, truth)[0]),
        "trained": [[k, float(a)] for (k, _, _), a in zip(scored, alone, strict=True)],
        "seconds": seconds,
    }


def search(study: Any, settings: dict[str, Any], table: dict) -> dict[str, Any]:
    """Regularized evolution on the supernet, then the top k confirmed by training."""
    start = time.perf_counter()
    study.optimize(settings["search"], show_progress_bar=False)
    searched = time.perf_counter() - start
    records = [
        r for r in study.records(variants=False) if r.state == "complete" and r.confirms is None
    ]
    pick = max(records, key=lambda r: r.metrics["accuracy"])
    start = time.perf_counter()
    confirmed = study.supernet.confirm(settings["confirm"])
    confirm_seconds = time.perf_counter() - start
    final = study.best()

    def looked_up(record: Any) -> dict[str, Any]:
        key = study.space.describe(record.arch)
        return {
            "cell": key,
            "supernet_or_trained_accuracy": record.metrics["accuracy"],
            "published_accuracy": table[key]["accuracy"],
        }

    return {
        "subnets": len(records),
        "distinct_cells": len({study.space.describe(r.arch) for r in records}),
        "seconds": searched,
        "pick": looked_up(pick),
        "confirmed": [looked_up(r) for r in confirmed],
        "confirm_seconds": confirm_seconds,
        "final": looked_up(final),
        "best_searched_published": max(
            table[study.space.describe(r.arch)]["accuracy"] for r in records
        ),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = dict(SCALES["smoke" if args.smoke else args.scale])
    for name in ("epochs", "search", "rank_cells", "rank_images", "confirm"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    earlier = json.loads(args.ceiling_from.read_text()) if args.ceiling_from else None
    if earlier:
        settings = earlier["settings"]  # the earlier run's scale, images and recipe
    table = published()
    start = time.perf_counter()
    limit = settings.get("images")
    arrays = (
        sampled(limit, settings["side"]) if limit else images(cifar10(args.work), settings["side"])
    )
    loaded = time.perf_counter() - start
    if earlier:  # the ceiling of an earlier run's ranked cells, nothing else
        data = load_data(arrays, seed=args.seed)  # the study's split (its seed)
        return {
            "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "of": str(args.ceiling_from),
            "settings": settings,
            "ceiling": ceiling(data, settings, earlier["ranking"]["scored"], args.ceiling),
        }
    study = make_study(args, settings, arrays, args.work)
    t = time.perf_counter()
    trained = study.supernet.train(show_progress_bar=False)
    supernet_seconds = time.perf_counter() - t
    ranking = rank(study, settings, table, args.seed)
    bound = ceiling(study.data, settings, ranking["scored"], args.ceiling) if args.ceiling else None
    found = search(study, settings, table)
    # the whole benchmark, the ceiling apart (an experiment about the scale, not a search)
    whole = time.perf_counter() - start - (bound["seconds"] if bound else 0.0)
    cores = torch.get_num_threads()
    return {
        "machine": platform.processor() or platform.machine(),
        "device": str(study.supernet.evaluator.device),
        "torch": torch.__version__,
        "threads": cores,
        "scale": "smoke" if args.smoke else args.scale,
        "rule": args.rule,
        "settings": settings,
        "images": {"train": len(study.data.train), "val": len(study.data.val)},
        "seconds": {
            "data": loaded,
            "supernet": supernet_seconds,
            "ranking": ranking["seconds"],
            "search": found["seconds"],
            "confirm": found["confirm_seconds"],
            "whole": whole,
            "ceiling (apart from the whole)": bound["seconds"] if bound else 0.0,
        },
        "minutes_whole": whole / 60,
        # compute charged: GPU minutes on a GPU, else CPU minutes (wall times the cores)
        "compute_minutes": {"gpu": whole / 60}
        if study.supernet.evaluator.device.type == "cuda"
        else {"cpu": whole / 60 * cores},
        "supernet_last_epoch": trained.get("history", [{}])[-1],
        "ranking": ranking,
        "ceiling": bound,
        "search": found,
        "table": {
            "optimum": max(r["accuracy"] for r in table.values()),
            "top_1_percent_from": float(np.percentile([r["accuracy"] for r in table.values()], 99)),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=("proxy", "full"), default="proxy")
    parser.add_argument("--smoke", action="store_true", help="the smallest setting (tests)")
    parser.add_argument("--rule", choices=("uniform", "fair", "sandwich"), default="fair")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--search", type=int)
    parser.add_argument("--rank-cells", type=int)
    parser.add_argument("--rank-images", type=int)
    parser.add_argument("--confirm", type=int)
    parser.add_argument(
        "--ceiling",
        type=int,
        default=0,
        help="also train this many of the ranked cells from scratch at this scale",
    )
    parser.add_argument(
        "--ceiling-from",
        type=Path,
        help="only the ceiling (--ceiling cells) of the cells an earlier run's JSON ranked",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="the study's folder (default: a temporary one)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args.work = args.work or Path(tmp)
        result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
