"""Zero-cost proxies, the supernet and the ranker on the ResNet sub-space of the
weight-sharing benchmark, against its stored ground truth.

The ground truth (``benchmarks/ground_truth/fashion-mnist-resnet-full.json``): 30
subnets of the elastic ResNet sub-space, each trained stand-alone on Fashion-MNIST
(42,000 training images, 15 epochs) with four seeds. Every estimator scores the same 30
subnets at their real size (28 × 28 images, 10 classes):

- each proxy of ``autosearch.evaluation.proxies``, computed as a study computes it
  (:func:`autosearch.evaluation.runner.initial_proxies`: the subnet at the
  initialization its trial would train from, on one batch of 64 training images drawn
  with the seed), for each of ``--seeds``;
- FLOPs and parameters;
- the default zero-cost estimate (``ProxyConfig()``'s proxies, their log ranks summed),
  AZ-NAS's four (log ranks), and the earlier mean rank of synflow, NASWOT and jacob_cov;
- the stored sandwich supernet's inherited accuracy (``benchmarks/ground_truth/
  supernets/resnet-full-sandwich.safetensors``, batch norm recalibrated on 256 images,
  evaluated on the 14,000 validation images), alone and combined with the estimate's
  proxies (log ranks);
- the ranker (autosearch.evaluation.ranker) fitted on ``--trained`` subnets chosen
  actively, each "trained" once: its seed-0 run's accuracy (a study trains a candidate
  once). So that it is not judged on the noise it learnt from, every estimator is
  measured against the mean of seeds 1–3, and against the four-seed mean.

Prints JSON (``--out`` writes it too):

    python benchmarks/resnet_proxies.py --seeds 0 1 2 --trained 8 12 \
        --out benchmarks/ground_truth/resnet-proxies-3-seeds.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

HERE = Path(__file__).resolve().parent

from autosearch.evaluation.proxies import PROXIES, ProxyConfig  # noqa: E402
from autosearch.evaluation.ranker import Ranker, RankerConfig  # noqa: E402
from autosearch.evaluation.runner import initial_proxies  # noqa: E402
from autosearch.scoring.ranks import combined  # noqa: E402
from autosearch.study.definition import trial_seed  # noqa: E402
from autosearch.weight_sharing.supernet import SubnetEvaluator  # noqa: E402


def _module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


weight_sharing = _module("weight_sharing")
ground_truth = weight_sharing.ground_truth

ENSEMBLE = ("synflow", "naswot", "jacob_cov")
DEFAULT = ProxyConfig().names
AZ_NAS = ("expressivity", "progressivity", "trainability", "complexity")


CONFIRM = (3, 5, 8)  # confirm(k): k subnets trained for real


def mean_rank(*columns: np.ndarray) -> np.ndarray:
    return np.mean([stats.rankdata(np.nan_to_num(c, nan=-np.inf)) for c in columns], axis=0)


def figures(scores: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    better = np.argsort(truth)[len(truth) // 2 :]
    top = 5
    return {
        "kendall_tau": float(stats.kendalltau(scores, truth)[0]),
        "spearman": float(stats.spearmanr(scores, truth)[0]),
        "kendall_tau_better_half": float(stats.kendalltau(scores[better], truth[better])[0]),
        "precision_top5": len(set(np.argsort(-scores)[:top]) & set(np.argsort(-truth)[:top])) / top,
        "best_ranked_truth": float(truth[int(np.argmax(scores))]),
    }


def supernet_scores(archs: list, seed: int, root: Path) -> tuple[list[float], Any, float]:
    """The stored sandwich supernet's accuracy of each subnet, and the study's data."""
    study, _ = weight_sharing.ranking_supernet(
        "resnet",
        "full",
        "sandwich",
        weight_sharing.SETTINGS["large"],
        root,
        seed,
        stored=weight_sharing.STORED_SUPERNETS,
    )
    config = dataclasses.replace(study.definition.supernet, eval_images=0, calibration_images=256)
    evaluator = SubnetEvaluator(
        study.supernet.evaluator.net, study.space, study.data, config, seed=seed
    )
    start = time.perf_counter()
    scores = [evaluator.evaluate(a)[1]["accuracy"] for a in archs]
    return scores, study.data, (time.perf_counter() - start) / len(archs)


def proxy_columns(archs: list, elastic, data, seed: int) -> tuple[dict[str, np.ndarray], dict]:
    """Every proxy of every subnet as a study with ``seed`` stores it, and seconds each."""
    config = ProxyConfig(names=tuple(PROXIES), seed=seed)
    found = [initial_proxies(config, elastic, a, trial_seed(seed, a), data) for a in archs]
    columns = {n: np.array([f.get(n, np.nan) for f in found]) for n in PROXIES}
    return columns, {"proxy_seconds": float(np.mean([f["proxy_seconds"] for f in found]))}


def ranked_by_ranker(features: np.ndarray, once: np.ndarray, k: int, seed: int) -> np.ndarray:
    """The ranker's estimates after ``k`` subnets trained, chosen a quarter at a time
    where its members disagree among the top (the first quarter: the prior's best)."""
    ranker = Ranker(RankerConfig(seed=seed), estimates=features.shape[1])
    trained: list[int] = []
    step = max(1, k // 4)
    while len(trained) < k:
        ranker.fit(features[trained], once[trained])
        trained += ranker.choose(features, min(step, k - len(trained)), taken=set(trained))
    ranker.fit(features[trained], once[trained])
    return ranker.predict(features)[0]


def confirmed_pick(
    features: np.ndarray, estimates: int, once: np.ndarray, later: np.ndarray, k: int, seed: int
) -> dict[str, Any]:
    """What ``confirm(k, ranker=True)`` ends with: ``k`` subnets trained one at a time,
    each chosen by the ranker fitted on those before it (the first by the prior: the
    mean rank of the estimates), and the study's pick, the best trained once; its truth
    (the mean of seeds 1-3). With ``estimates`` = 0: the ``k`` best by the first column
    (a confirmation of the supernet's top, no ranker)."""
    if estimates == 0:
        trained = [int(i) for i in np.argsort(-features[:, 0], kind="stable")[:k]]
    else:
        ranker = Ranker(RankerConfig(seed=seed), estimates=estimates)
        trained = []
        while len(trained) < k:
            ranker.fit(features[trained], once[trained])
            trained += ranker.choose(features, 1, taken=set(trained))
    pick = trained[int(np.argmax(once[trained]))]
    return {
        "trained": trained,
        "pick_truth": float(later[pick]),
        "best_trained_truth": float(later[trained].max()),
    }


def run(seeds: list[int], trained: list[int]) -> dict[str, Any]:
    table = ground_truth.load("resnet", "full")
    elastic = ground_truth.resnet_space()
    rows = [r for r in table["subnets"] if len(r["runs"]) == len(table["seeds"])]
    archs = [elastic.make(r["arch"]) for r in rows]
    later = np.array([np.mean([r["runs"][s]["val"] for s in ("1", "2", "3")]) for r in rows])
    every = np.array([np.mean([run["val"] for run in r["runs"].values()]) for r in rows])
    once = np.array([r["runs"]["0"]["val"] for r in rows])
    flops = np.array([float(elastic.cost(a).flops) for a in archs])
    params = np.array([float(elastic.cost(a).params) for a in archs])
    with tempfile.TemporaryDirectory() as root:
        supernet, data, eval_seconds = supernet_scores(archs, 0, Path(root))
    supernet_col = np.array(supernet)
    out: dict[str, Any] = {
        "subnets": len(rows),
        "truth": {"protocol": "full", "seeds": table["seeds"], "recipe": table["recipe"]},
        "seeds_agree": {
            "seed0_vs_later": float(stats.kendalltau(once, later)[0]),
            "halves": ground_truth.agreement(table["subnets"], tuple(table["seeds"])),
        },
        "supernet_eval_seconds": eval_seconds,
        "machine": ground_truth._machine(),
        "best_truth": float(later.max()),
        "seeds": [],
    }
    for seed in seeds:
        columns, cost = proxy_columns(archs, elastic, data, seed)
        estimators = {
            **columns,
            "flops": flops,
            "params": params,
            "estimate (the default)": combined({n: columns[n] for n in DEFAULT}),
            "AZ-NAS (four, log ranks)": combined({n: columns[n] for n in AZ_NAS}),
            "mean rank synflow+naswot+jacob_cov": mean_rank(*(columns[n] for n in ENSEMBLE)),
            "supernet": supernet_col,
            "mean rank supernet+3 proxies": mean_rank(
                supernet_col, *(columns[n] for n in ENSEMBLE)
            ),
            "supernet + the estimate's proxies (log ranks)": combined(
                {"supernet": supernet_col, **{n: columns[n] for n in DEFAULT}}
            ),
        }
        estimates = np.column_stack([*(columns[n] for n in DEFAULT), supernet_col])
        estimates = np.where(np.isfinite(estimates), estimates, np.nanmin(estimates, 0) - 1.0)
        features = np.hstack([estimates, np.array([elastic.one_hot(a) for a in archs])])
        for k in trained:
            estimators[f"ranker, {k} trained once"] = ranked_by_ranker(features, once, k, seed)
        encoded = features[:, estimates.shape[1] :]
        plain = np.hstack([np.column_stack([supernet_col, flops, params]), encoded])
        confirm = {
            f"{name}, k={k}": confirmed_pick(rows_, width, once, later, k, seed)
            for k in CONFIRM
            for name, rows_, width in (
                ("supernet's top", plain, 0),
                ("ranker: supernet, FLOPs, parameters", plain, 3),
                ("ranker: supernet and the estimate's proxies", features, estimates.shape[1]),
            )
        }
        out["seeds"].append(
            {
                "seed": seed,
                **cost,
                "against_seeds_1_3": {n: figures(s, later) for n, s in estimators.items()},
                "against_all_4": {n: figures(s, every) for n, s in estimators.items()},
                "confirm": confirm,
            }
        )
        print(f"seed {seed} done", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--trained", type=int, nargs="+", default=[8])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args.seeds, args.trained)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
