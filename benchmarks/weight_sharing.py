"""Weight sharing on real images: does one supernet rank subnets like training them does,
and does a search on it find networks as good as a multi-trial search of equal compute?

On Fashion-MNIST (the Debian package ``dataset-fashion-mnist``; ``--data`` takes any
spec, e.g. ``cifar10:PATH``), over an elastic ResNet sub-space (stem width, and per
stage depth and width):

1. supernet training (sandwich rule, in-place distillation) against one stand-alone
   training of its largest subnet, per epoch;
2. rank correlation (Kendall tau, Spearman) between supernet-evaluated and stand-alone
   validation accuracy (same recipe, from scratch) over subnets spread over the FLOPs
   range, overall and within FLOPs-matched groups; for the sandwich rule and for
   progressive shrinking;
3. for three FLOPs budgets: the best subnet of a search on the supernet (regularized
   evolution, ``--evaluations`` each), trained from scratch, against the best of a
   multi-trial random search given the same total compute (the supernet's whole
   training, the search and the final training); the found subnet's inherited accuracy
   with and without ``--finetune`` epochs of fine-tuning;
4. the cost of one supernet evaluation against one trial's training;
5. (``--kernels``) a MobileNet supernet's elastic kernels as centred crops against OFA's
   learned kernel transformations: inherited accuracy of subnets of each kernel size;
6. (``--ceiling``) the ranking subnets trained again with another seed: how well one
   seed's stand-alone accuracies rank the other's (what any evaluator can reach against
   a single training), and the supernet's correlation with the two seeds' mean.

``--only ranking`` ranks supernets of each sub-space (``--space resnet|mobilenet|both``;
``--schedules sandwich,progressive``) against the stored ground truth of
``benchmarks/ground_truth.py`` (``--protocol``: ``full``, all 70,000 images and 15
epochs, trained on a GPU; or ``small``): Kendall tau against the seed mean, as a share
of the seeds' own agreement, within FLOPs groups, against FLOPs and parameters alone;
each supernet with 256 and 1,024 calibration images. The supernets' weights come from
``benchmarks/ground_truth/supernets`` where stored (``--only supernets
--save-supernets DIR`` trains and saves them, on a GPU; ``--retrain-supernets`` trains
them where the ranking runs). ``--only budgets`` is the equal-compute setting users spend:
one supernet charged once across four FLOPs budgets, each budget's search confirmed by
``study.supernet.confirm(--confirm)`` (charged too), against multi-trial random search given
three times the weight-sharing total.

Prints JSON (and writes ``--markdown``). The default settings fit a 2-core CPU in under
an hour; ``--large`` is for a GPU.

    python benchmarks/weight_sharing.py --markdown ws.md
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

import autosearch
from autosearch import SupernetConfig, TrainConfig
from autosearch.data import load_data
from autosearch.training.train import evaluate, train
from autosearch.weight_sharing.supernet import SubnetEvaluator
from controllers import RegularizedEvolution
from search_spaces import MobileNetSpace

_spec = importlib.util.spec_from_file_location(
    "ground_truth", Path(__file__).resolve().parent / "ground_truth.py"
)
ground_truth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ground_truth)  # type: ignore[union-attr]

SETTINGS = {
    # 2 CPU cores, under an hour.
    "reduced": {
        "images": 10_000,
        "epochs": 4,
        "supernet_epochs": 12,
        "subnets": 30,
        "groups": 3,
        "evaluations": 1000,
        "eval_images": 500,
        "finetune": 2,
        "batch_size": 128,
        "lr": 0.05,
    },
    # A GPU: the whole dataset, longer training.
    "large": {
        "images": 0,
        "epochs": 15,
        "supernet_epochs": 60,
        "subnets": 50,
        "groups": 5,
        "evaluations": 1000,
        "eval_images": 0,
        "finetune": 2,
        "batch_size": 256,
        "lr": 0.1,
    },
}


def space(**budget: Any):
    """The ResNet sub-space of the ground truth (benchmarks/ground_truth.py)."""
    return ground_truth.resnet_space(**budget)


class StandAlone:
    """Subnets trained from scratch with the recipe, each once (cached by arch id)."""

    def __init__(self, data, recipe: TrainConfig, seed: int) -> None:
        self.data, self.recipe, self.seed = data, recipe, seed
        self.done: dict[str, dict[str, float]] = {}

    def __call__(self, elastic, arch) -> dict[str, float]:
        if arch.arch_id not in self.done:
            torch.manual_seed(self.seed)
            model = elastic.build(
                arch, input_shape=self.data.input_shape, num_classes=self.data.num_classes
            )
            start = time.perf_counter()
            train(model, self.data, self.recipe, seed=self.seed)
            seconds = time.perf_counter() - start
            self.done[arch.arch_id] = {
                "val": evaluate(model, self.data.val, self.data)[0],
                "test": evaluate(model, self.data.test, self.data)[0],
                "seconds": seconds,
                "flops": float(elastic.cost(arch, input_shape=self.data.input_shape).flops),
            }
            print(f"  trained {elastic.describe(arch)}: {self.done[arch.arch_id]}", file=sys.stderr)
        return self.done[arch.arch_id]


spread = ground_truth.spread  # subnets evenly spaced in FLOPs rank among uniform draws


def correlation(ws: list[float], sa: list[float], flops: list[float], groups: int) -> dict:
    """Kendall tau and Spearman overall, and the mean within FLOPs-matched groups."""
    order = np.argsort(flops)
    within = []
    for part in np.array_split(order, groups):
        if len(part) > 2:
            within.append(stats.kendalltau([ws[i] for i in part], [sa[i] for i in part])[0])
    return {
        "kendall_tau": float(stats.kendalltau(ws, sa)[0]),
        "spearman": float(stats.spearmanr(ws, sa)[0]),
        "kendall_tau_within_groups": float(np.nanmean(within)),
        "within_groups": [float(t) for t in within],
        # Size alone: how well FLOPs order the stand-alone accuracies.
        "kendall_tau_of_flops": float(stats.kendalltau(flops, sa)[0]),
    }


def make_study(name: str, root: Path, data, recipe, supernet: SupernetConfig, elastic, seed=0):
    return autosearch.create_study(
        name,
        controller=RegularizedEvolution(elastic, population=50, sample=10, seed=seed),
        data=data,
        storage=f"sqlite:///{root}/{name}.db",
        train=recipe,
        supernet=supernet,
        load_if_exists=True,
    )


def fine_tuned(model, data, recipe: TrainConfig, epochs: int, seed: int) -> float:
    config = dataclasses.replace(recipe, epochs=epochs, lr=recipe.lr * 0.5)
    train(model, data, config, seed=seed)
    return evaluate(model, data.val, data)[0]


def kernels_experiment(arrays, recipe: TrainConfig, root: Path, seed: int) -> dict:
    """MobileNet elastic kernels: centred crops against OFA's kernel transformations,
    the same training; the mean inherited accuracy of random subnets per kernel size."""
    base = MobileNetSpace(
        max_stages=2, depths=(1, 2), widths=(16, 24), expansions=(3, 6), kernels=(3, 5, 7)
    )
    fixed = {
        "stages": 2,
        "width_mult": 1.0,
        "stem.stride": 2,
        "stem.width": 16,
        "head.width": 640,
        "stage1.stride": 2,
        "stage2.stride": 2,
    }
    out: dict[str, Any] = {}
    for label, transform in (("crop", False), ("transform", True)):
        elastic = base.supernet(fixed=fixed, kernel_transform=transform)
        study = make_study(
            f"kernels-{label}",
            root,
            arrays,
            recipe,
            SupernetConfig(sandwich=2, latency=False, test_accuracy=False),
            elastic,
            seed,
        )
        start = time.perf_counter()
        study.supernet.train()
        seconds = time.perf_counter() - start
        evaluator = study.supernet.evaluator
        rng = np.random.default_rng(seed)
        by_kernel: dict[int, list[float]] = {3: [], 5: [], 7: []}
        for _ in range(24):
            arch = elastic.sample(rng)
            kernel = int(arch["stage1.kernel"])
            arch = elastic.make({**arch, "stage2.kernel": kernel})  # one kernel size throughout
            by_kernel[kernel].append(evaluator.evaluate(arch)[1]["accuracy"])
        out[label] = {
            "train_seconds": seconds,
            **{f"kernel{k}": float(np.mean(v)) for k, v in by_kernel.items() if v},
        }
    return out


STORED_SUPERNETS = Path(__file__).resolve().parent / "ground_truth" / "supernets"


def supernet_file(folder: Path, space_name: str, protocol: str, schedule: str) -> Path:
    return folder / f"{space_name}-{protocol}-{schedule}.safetensors"


def ranking_supernet(
    space_name: str,
    protocol: str,
    schedule: str,
    settings: dict[str, Any],
    root: Path,
    seed: int,
    *,
    stored: Path | None = None,
    save: Path | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The study of one ranking supernet of ``space_name``, trained on the ground truth
    protocol's data and recipe (``supernet_epochs`` epochs, sandwich rule with 2 random
    subnets): its weights imported from ``stored`` where that folder holds them (with
    what their training cost, from the JSON beside them), else trained here, and saved
    to ``save`` when given."""
    spec = ground_truth.PROTOCOLS[protocol]
    elastic = ground_truth.SPACES[space_name]()
    arrays = ground_truth.dataset(**spec["data"])
    recipe = TrainConfig(**spec["recipe"])
    config = SupernetConfig(
        train=dataclasses.replace(recipe, epochs=settings["supernet_epochs"]),
        sandwich=2,
        schedule=schedule,  # type: ignore[arg-type]
        test_accuracy=False,
        latency=False,
    )
    path = supernet_file(stored, space_name, protocol, schedule) if stored else None
    info: dict[str, Any] = {}
    if path is not None and path.exists():
        info = json.loads(path.with_suffix(".json").read_text())
        config = dataclasses.replace(
            config,
            train=dataclasses.replace(config.train, epochs=info["epochs"]),
            weights=str(path),
        )
    study = make_study(f"{space_name}-{schedule}", root, arrays, recipe, config, elastic, seed)
    print(f"{space_name}: supernet ({schedule}, {protocol})...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    study.supernet.train()
    if not info:
        on_gpu = config.train.device in ("auto", "cuda") and torch.cuda.is_available()
        info = {
            "space": space_name,
            "protocol": protocol,
            "schedule": schedule,
            "epochs": config.train.epochs,
            "sandwich": config.sandwich,
            "recipe": spec["recipe"],
            "seed": seed,
            "train_seconds": time.perf_counter() - start,
            "device": torch.cuda.get_device_name()
            if on_gpu
            else config.train.device.replace("auto", "cpu"),
            "machine": ground_truth._machine(),
            "code": ground_truth._code_version(),
        }
    if save is not None:
        target = supernet_file(save, space_name, protocol, schedule)
        target.parent.mkdir(parents=True, exist_ok=True)
        study.supernet.save(target)
        target.with_suffix(".json").write_text(json.dumps(info, indent=1))
    return study, info


def against_halves(
    inherited: list[float], rows: list[dict[str, Any]], ceiling: dict[str, Any]
) -> dict[str, Any]:
    """With four seeds or more: the supernet's Kendall tau against each half's seed
    mean, and its mean as a share of the tau between the two halves (the ceiling for a
    ranking against a mean of that many seeds: how well one such mean repeats)."""
    if "seed_means" not in ceiling:
        return {}
    taus = [
        float(stats.kendalltau(inherited, [ground_truth.seed_mean(r, half) for r in rows])[0])
        for half in ceiling["seed_means"]
    ]
    between = ceiling["kendall_tau_of_seed_means"]
    return {
        "kendall_tau_against_halves": taus,
        "share_of_half_ceiling": float(np.mean(taus)) / between if between > 0 else None,
    }


def rank_against_truth(
    space_name: str,
    settings: dict[str, Any],
    root: Path,
    schedules: list[str],
    seed: int,
    protocol: str = ground_truth.DEFAULT,
    stored: Path | None = STORED_SUPERNETS,
) -> dict[str, Any]:
    """Supernets of ``space_name`` (one per schedule) ranked against the stored ground
    truth (benchmarks/ground_truth.py): Kendall tau and Spearman against the two-seed
    mean, as a share of the seeds' own agreement, within FLOPs groups, and what FLOPs or
    parameters alone reach; each supernet evaluated with 256 and 1,024 calibration
    images."""
    try:
        table = ground_truth.load(space_name, protocol)
    except FileNotFoundError:
        sys.exit(
            f"no {protocol} ground truth for {space_name}: python benchmarks/ground_truth.py "
            f"--space {space_name} --protocol {protocol} trains it"
        )
    truth = ground_truth.mean_truth(table)
    elastic = ground_truth.SPACES[space_name]()
    rows = [r for r in table["subnets"] if r["arch_id"] in truth]
    archs = [elastic.make(r["arch"]) for r in rows]
    mean = [truth[r["arch_id"]] for r in rows]
    flops = [r["flops"] for r in rows]
    params = [float(elastic.cost(a).params) for a in archs]
    out: dict[str, Any] = {
        "subnets": len(rows),
        "truth": {
            "protocol": protocol,
            "recipe": table["recipe"],
            "data": table["data"],
            "seeds": table["seeds"],
        },
        "ceiling": ground_truth.agreement(table["subnets"], tuple(table["seeds"])),
        "kendall_tau_of_flops": float(stats.kendalltau(flops, mean)[0]),
        "kendall_tau_of_params": float(stats.kendalltau(params, mean)[0]),
        "supernets": {},
    }
    ceiling = out["ceiling"]["kendall_tau"]
    for schedule in schedules:
        study, info = ranking_supernet(
            space_name, protocol, schedule, settings, root, seed, stored=stored
        )
        assert len(study.data.val) == table["images"]["val"], "another split than the truth's"
        config = study.definition.supernet
        for calibration in (256, 1024):
            evaluator = SubnetEvaluator(
                study.supernet.evaluator.net,
                elastic,
                study.data,
                dataclasses.replace(config, eval_images=0, calibration_images=calibration),
                seed=seed,
            )
            inherited = [evaluator.evaluate(a)[1]["accuracy"] for a in archs]
            found = correlation(inherited, mean, flops, settings["groups"])
            found["share_of_ceiling"] = found["kendall_tau"] / ceiling if ceiling > 0 else None
            found |= against_halves(inherited, rows, out["ceiling"])
            found["inherited"] = inherited
            found["train_seconds"] = info["train_seconds"]
            found["trained"] = {k: info[k] for k in ("epochs", "device") if k in info}
            out["supernets"][f"{schedule}, calibration {calibration}"] = found
    return out


def equal_compute(
    space_name: str,
    settings: dict[str, Any],
    root: Path,
    schedule: str,
    k: int,
    seed: int,
    protocol: str = "small",
) -> dict[str, Any]:
    """One supernet for four FLOPs budgets (OFA's setting), charged once; per budget a
    search on it (regularized evolution) and ``study.supernet.confirm(k)`` (k trainings with the
    ground truth's recipe, charged too); against a multi-trial random search per budget
    whose trainings (the same recipe) may cost three times the weight-sharing total,
    shared evenly among the budgets. The confirmed best against the multi-trial best."""
    spec = ground_truth.PROTOCOLS[protocol]
    arrays = ground_truth.dataset(**spec["data"])
    recipe = TrainConfig(**spec["recipe"])
    make_space = ground_truth.SPACES[space_name]
    elastic = make_space()
    config = SupernetConfig(
        train=dataclasses.replace(recipe, epochs=settings["supernet_epochs"]),
        sandwich=2,
        schedule=schedule,  # type: ignore[arg-type]
        eval_images=settings["eval_images"],
        test_accuracy=False,
        latency=False,
    )
    trained = make_study(f"{space_name}-ec", root, arrays, recipe, config, elastic, seed)
    start = time.perf_counter()
    trained.supernet.train()
    supernet_seconds = time.perf_counter() - start
    weights = trained.supernet.save(root / f"{space_name}-ec.safetensors")
    data = trained.data
    rng = np.random.default_rng(seed + 1)
    draws = sorted(elastic.cost(elastic.sample(rng)).flops for _ in range(400))
    budgets = [float(np.quantile(draws, q)) for q in (0.25, 0.5, 0.75, 1.0)]
    rows, ws_seconds = [], supernet_seconds
    for i, budget in enumerate(budgets):
        print(f"{space_name}: budget {budget / 1e6:.2f} MFLOPs...", file=sys.stderr)
        constrained = make_space(max_flops=budget, budget_input=data.input_shape)
        search = make_study(
            f"{space_name}-ec{i}",
            root,
            arrays,
            recipe,
            dataclasses.replace(config, weights=str(weights)),
            constrained,
            seed,
        )
        search.supernet.train()  # imports the weights
        start = time.perf_counter()
        search.optimize(settings["evaluations"], show_progress_bar=False)
        search_seconds = time.perf_counter() - start
        confirmed = search.supernet.confirm(min(k, len(search.pareto())))
        confirm_seconds = sum(r.metrics.get("train_seconds", 0.0) for r in confirmed)
        ws_seconds += search_seconds + confirm_seconds
        best = search.best()
        rows.append(
            {
                "max_mflops": budget / 1e6,
                "search_seconds": search_seconds,
                "confirm_seconds": confirm_seconds,
                "confirmations": [c.to_json() for c in search.supernet.confirmations()],
                "ws_best": search.space.describe(best.arch),
                "ws_best_val": best.metrics["accuracy"],
                "ws_best_test": best.metrics.get("test_accuracy"),
                "ws_best_confirmed": best.confirms is not None,
            }
        )
    alone = StandAlone(data, recipe, seed)
    for i, (row, budget) in enumerate(zip(rows, budgets, strict=True)):
        constrained = make_space(max_flops=budget, budget_input=data.input_shape)
        row["multi_trial"] = multi_trial(
            constrained, alone, 3 * ws_seconds / len(budgets), seed + 10 + i
        )
        row["gap_points"] = 100 * (row["multi_trial"]["best_val"] - row["ws_best_val"])
    return {
        "supernet_seconds": supernet_seconds,
        "ws_total_seconds": ws_seconds,
        "multi_trial_total_seconds": sum(r["multi_trial"]["seconds"] for r in rows),
        "k": k,
        "budgets": rows,
    }


def budgets_markdown(results: dict[str, Any]) -> str:
    """The equal-compute table: per budget, the weight-sharing search's confirmed best
    against the multi-trial best, on validation (where both chose) and on test."""
    lines = []
    for space_name, r in results.items():
        lines += [
            f"**{space_name}**: supernet {r['supernet_seconds']:.0f} s, weight sharing in all "
            f"{r['ws_total_seconds']:.0f} s (the supernet once, each budget's search and "
            f"its {r['k']} confirmations); multi-trial in all "
            f"{r['multi_trial_total_seconds']:.0f} s "
            f"({r['multi_trial_total_seconds'] / r['ws_total_seconds']:.1f}× as much).",
            "",
            "| budget (MFLOPs) | search s | confirm s | weight sharing: confirmed best | val | "
            "test | multi-trial: best of n | val | test | gap val / test (points) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for b in r["budgets"]:
            m = b["multi_trial"]
            ws_test = b.get("ws_best_test")
            lines.append(
                f"| {b['max_mflops']:.2f} | {b['search_seconds']:.0f} | "
                f"{b['confirm_seconds']:.0f} | {b['ws_best']} | {100 * b['ws_best_val']:.2f} | "
                + (f"{100 * ws_test:.2f}" if ws_test is not None else "–")
                + f" | {m['best']} (n = {m['trained']}) | {100 * m['best_val']:.2f} | "
                f"{100 * m['best_test']:.2f} | {b['gap_points']:.2f} / "
                + (f"{100 * (m['best_test'] - ws_test):.2f}" if ws_test is not None else "–")
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def ranking_markdown(results: dict[str, Any]) -> str:
    lines = []
    for space_name, r in results.items():
        c = r["ceiling"]
        lines += [
            f"**{space_name}** ({r['subnets']} subnets; ground truth {r['truth']['recipe']}, "
            f"seeds {r['truth']['seeds']}): seed against seed Kendall τ "
            f"{c['kendall_tau']:.2f} (Spearman {c['spearman']:.2f}, within FLOPs groups "
            f"{c['kendall_tau_within_groups']:.2f}); FLOPs alone τ "
            f"{r['kendall_tau_of_flops']:.2f}, "
            f"parameters alone τ {r['kendall_tau_of_params']:.2f}."
            + (
                f" Two means of two seeds each (seeds {', '.join(c['seed_means'][0])} and "
                f"{', '.join(c['seed_means'][1])}) agree at τ {c['kendall_tau_of_seed_means']:.2f}."
                if "seed_means" in c
                else ""
            ),
            "",
            "| supernet | τ against the mean | share of the seed ceiling | τ against each "
            "two-seed mean (share of their agreement) | Spearman | τ within FLOPs groups "
            "| training |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for label, s in r["supernets"].items():
            share = s["share_of_ceiling"] or float("nan")
            halves = (
                " / ".join(f"{t:.2f}" for t in s["kendall_tau_against_halves"])
                + f" ({s['share_of_half_ceiling'] or float('nan'):.2f})"
                if "kendall_tau_against_halves" in s
                else "–"
            )
            trained = s.get("trained", {})
            where = f", {trained['epochs']} epochs on {trained['device']}" if trained else ""
            lines.append(
                f"| {label} | {s['kendall_tau']:.2f} | {share:.2f} | {halves} | "
                f"{s['spearman']:.2f} | {s['kendall_tau_within_groups']:.2f} | "
                f"{s['train_seconds']:.0f} s{where} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--large", action="store_true", help="the GPU setting")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progressive", action="store_true")
    parser.add_argument("--kernels", action="store_true", help="also the kernel experiment")
    parser.add_argument("--ceiling", action="store_true", help="train the ranking set twice")
    parser.add_argument("--only", choices=("all", "ranking", "budgets", "supernets"), default="all")
    parser.add_argument(
        "--protocol",
        choices=sorted(ground_truth.PROTOCOLS),
        help="the ground truth's protocol (data, recipe): --only ranking and supernets "
        f"default to {ground_truth.DEFAULT!r}, --only budgets to 'small'",
    )
    parser.add_argument(
        "--supernets",
        type=Path,
        default=STORED_SUPERNETS,
        help="--only ranking: import the ranking supernets stored in this folder where it "
        "holds them (default: benchmarks/ground_truth/supernets), else train them here",
    )
    parser.add_argument(
        "--retrain-supernets", action="store_true", help="--only ranking: train them here"
    )
    parser.add_argument("--save-supernets", type=Path, help="--only supernets: save them here")
    parser.add_argument("--confirm", type=int, default=2, help="--only budgets: k per budget")
    parser.add_argument(
        "--space",
        choices=("resnet", "mobilenet", "both"),
        default="both",
        help="--only ranking: the sub-space(s) ranked against their stored ground truth",
    )
    parser.add_argument(
        "--schedules", default="sandwich,progressive", help="--only ranking: supernets to train"
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--workdir", help="keep the studies here (default: a temporary folder)")
    parser.add_argument("--markdown", help="write the table here too")
    for key, value in SETTINGS["reduced"].items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value))
    args = parser.parse_args()
    settings = dict(SETTINGS["large" if args.large else "reduced"])
    settings.update({k: v for k, v in vars(args).items() if k in settings and v is not None})
    if args.threads:
        torch.set_num_threads(args.threads)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="weight-sharing-"))
    root.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    if args.only == "ranking":
        names = ["resnet", "mobilenet"] if args.space == "both" else [args.space]
        schedules = args.schedules.split(",")
        stored = None if args.retrain_supernets else args.supernets
        protocol = args.protocol or ground_truth.DEFAULT
        found = {
            n: rank_against_truth(n, settings, root, schedules, args.seed, protocol, stored)
            for n in names
        }
        print(json.dumps({"ranking": found, "seconds": time.perf_counter() - began}, indent=2))
        if args.markdown:
            Path(args.markdown).write_text(ranking_markdown(found))
        return
    if args.only == "supernets":  # train the ranking supernets (on a GPU) and save them
        names = ["resnet", "mobilenet"] if args.space == "both" else [args.space]
        protocol = args.protocol or ground_truth.DEFAULT
        trained = {}
        for schedule in args.schedules.split(","):
            for n in names:
                _, info = ranking_supernet(
                    n, protocol, schedule, settings, root, args.seed, save=args.save_supernets
                )
                trained[f"{n}, {schedule}"] = info
        print(json.dumps({"supernets": trained, "seconds": time.perf_counter() - began}))
        return
    if args.only == "budgets":
        names = ["resnet", "mobilenet"] if args.space == "both" else [args.space]
        schedule = args.schedules.split(",")[0]
        protocol = args.protocol or "small"
        found = {
            n: equal_compute(n, settings, root, schedule, args.confirm, args.seed, protocol)
            for n in names
        }
        print(json.dumps({"budgets": found, "seconds": time.perf_counter() - began}, indent=2))
        if args.markdown:
            Path(args.markdown).write_text(budgets_markdown(found))
        return

    full = load_data(args.data, seed=args.seed)
    x = torch.cat([full.train.x, full.val.x, full.test.x])
    y = torch.cat([full.train.y, full.val.y, full.test.y])
    if settings["images"]:
        pick = torch.randperm(len(y), generator=torch.Generator().manual_seed(args.seed))
        x, y = x[pick[: settings["images"]]], y[pick[: settings["images"]]]
    arrays = (x.numpy(), y.numpy())
    recipe = TrainConfig(
        epochs=settings["epochs"], batch_size=settings["batch_size"], lr=settings["lr"]
    )
    super_recipe = dataclasses.replace(recipe, epochs=settings["supernet_epochs"])
    search_config = SupernetConfig(
        train=super_recipe,
        sandwich=2,
        eval_images=settings["eval_images"],
        test_accuracy=False,
        latency=False,
    )
    elastic = space()
    report: dict[str, Any] = {"settings": settings, "data": args.data}

    # 1. The supernet (sandwich rule), and its largest subnet trained alone.
    print("supernet (sandwich rule)...", file=sys.stderr)
    study = make_study("sandwich", root, arrays, recipe, search_config, elastic, args.seed)
    data = study.data
    report["images"] = {"train": len(data.train), "val": len(data.val), "test": len(data.test)}
    start = time.perf_counter()
    info = study.supernet.train()
    supernet_seconds = time.perf_counter() - start
    weights = study.supernet.save(root / "sandwich.safetensors")
    alone = StandAlone(data, recipe, args.seed)
    largest = alone(elastic, elastic.largest())
    per_epoch = info["seconds"] / info["epochs"]
    report["training"] = {
        "supernet_seconds": info["seconds"],
        "supernet_epochs": info["epochs"],
        "supernet_seconds_per_epoch": per_epoch,
        "largest_alone_seconds_per_epoch": largest["seconds"] / recipe.epochs,
        "ratio_per_epoch": per_epoch / (largest["seconds"] / recipe.epochs),
        "largest_alone_val": largest["val"],
    }

    # 2. Rank correlation over subnets spread over the FLOPs range.
    print("ranking...", file=sys.stderr)
    ranked = spread(elastic, settings["subnets"], args.seed)
    truth = [alone(elastic, a) for a in ranked]
    full_eval = dataclasses.replace(search_config, eval_images=0)
    schedules = {"sandwich": study}
    if not args.no_progressive:
        print("supernet (progressive shrinking)...", file=sys.stderr)
        progressive = make_study(
            "progressive",
            root,
            arrays,
            recipe,
            dataclasses.replace(search_config, schedule="progressive"),
            elastic,
            args.seed,
        )
        start = time.perf_counter()
        progressive.supernet.train()
        report["training"]["progressive_seconds"] = time.perf_counter() - start
        schedules["progressive"] = progressive
    report["ranking"] = {}
    for label, trained in schedules.items():
        evaluator = SubnetEvaluator(
            trained.supernet.evaluator.net, elastic, data, full_eval, seed=args.seed
        )
        inherited = [evaluator.evaluate(a)[1]["accuracy"] for a in ranked]
        report["ranking"][label] = {
            **correlation(
                inherited,
                [t["val"] for t in truth],
                [t["flops"] for t in truth],
                settings["groups"],
            ),
            "subnets": len(ranked),
            "inherited": inherited,
        }
    report["ranking"]["subnets"] = [
        {"arch": elastic.describe(a), "mflops": t["flops"] / 1e6, "stand_alone_val": t["val"]}
        for a, t in zip(ranked, truth, strict=True)
    ]
    if args.ceiling:
        print("ranking set, second seed...", file=sys.stderr)
        again = StandAlone(data, recipe, args.seed + 1)
        second = [again(elastic, a)["val"] for a in ranked]
        first = [t["val"] for t in truth]
        flops = [t["flops"] for t in truth]
        mean = [(a + b) / 2 for a, b in zip(first, second, strict=True)]
        report["ranking"]["ceiling"] = {
            "seed_against_seed": correlation(second, first, flops, settings["groups"]),
            **{
                f"{label}_against_mean": correlation(
                    report["ranking"][label]["inherited"], mean, flops, settings["groups"]
                )
                for label in schedules
            },
        }
    if args.only == "ranking":
        report["seconds"] = time.perf_counter() - began
        print(json.dumps(report, indent=2))
        if args.markdown:
            Path(args.markdown).write_text(markdown(report))
        return

    # 3. Three budgets: a search on the supernet against multi-trial at equal compute.
    rng = np.random.default_rng(args.seed + 1)
    draws = sorted(elastic.cost(elastic.sample(rng)).flops for _ in range(400))
    budgets = [float(np.quantile(draws, q)) for q in (1 / 3, 2 / 3, 1.0)]
    report["budgets"] = []
    evals: list[float] = []
    for i, budget in enumerate(budgets):
        print(f"budget {budget / 1e6:.2f} MFLOPs...", file=sys.stderr)
        constrained = space(max_flops=budget, budget_input=data.input_shape)
        search = make_study(
            f"search{i}",
            root,
            arrays,
            recipe,
            dataclasses.replace(search_config, weights=str(weights)),
            constrained,
            args.seed,
        )
        search.supernet.train()  # imports the weights
        start = time.perf_counter()
        done = search.optimize(settings["evaluations"], show_progress_bar=False)
        search_seconds = time.perf_counter() - start
        evals += [r.metrics["eval_seconds"] for r in done if "eval_seconds" in r.metrics]
        best = search.best()
        found = constrained.make(dict(best.arch))
        scratch = alone(constrained, found)
        model = search.supernet.evaluator.subnet(found)
        inherited = evaluate(model, data.val, data)[0]
        tuned = fine_tuned(model, data, recipe, settings["finetune"], args.seed)
        compute = supernet_seconds + search_seconds + scratch["seconds"]
        multi = multi_trial(constrained, alone, compute, args.seed + 10 + i)
        report["budgets"].append(
            {
                "max_mflops": budget / 1e6,
                "evaluations": len(done),
                "search_seconds": search_seconds,
                "found": constrained.describe(found),
                "found_mflops": scratch["flops"] / 1e6,
                "found_from_scratch_val": scratch["val"],
                "found_from_scratch_test": scratch["test"],
                "found_inherited_val": inherited,
                "found_finetuned_val": tuned,
                "finetune_epochs": settings["finetune"],
                "ws_compute_seconds": compute,
                "multi_trial": multi,
            }
        )

    # 4. What one evaluation costs against one training.
    trainings = [t["seconds"] for t in alone.done.values()]
    report["cost"] = {
        "evaluation_ms_median": 1000 * statistics.median(evals),
        "training_seconds_median": statistics.median(trainings),
        "trainings_per_evaluation": statistics.median(trainings) / statistics.median(evals),
    }
    if args.kernels:
        print("kernels...", file=sys.stderr)
        report["kernels"] = kernels_experiment(
            arrays, dataclasses.replace(recipe, epochs=max(2, recipe.epochs)), root, args.seed
        )
    report["seconds"] = time.perf_counter() - began
    print(json.dumps(report, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(markdown(report))


def multi_trial(constrained, alone: StandAlone, compute: float, seed: int) -> dict[str, Any]:
    """Random search within the budget, each candidate trained from scratch, until its
    trainings have cost ``compute`` seconds (a candidate trained earlier costs its
    recorded time again); the most accurate on validation."""
    rng = np.random.default_rng(seed)
    spent, tried = 0.0, []
    while spent < compute and len(tried) < 200:
        arch = constrained.sample(rng)
        if any(a.arch_id == arch.arch_id for a, _ in tried):
            continue
        result = alone(constrained, arch)
        spent += result["seconds"]
        tried.append((arch, result))
    arch, best = max(tried, key=lambda t: t[1]["val"])
    return {
        "trained": len(tried),
        "seconds": spent,
        "best": constrained.describe(arch),
        "best_val": best["val"],
        "best_test": best["test"],
        "best_mflops": best["flops"] / 1e6,
    }


def markdown(report: dict[str, Any]) -> str:
    t, s = report["training"], report["settings"]
    lines = [
        f"Data: {report['data']} ({report['images']['train']} training, "
        f"{report['images']['val']} validation images); recipe {s['epochs']} epochs; "
        f"supernet {t['supernet_epochs']} epochs; {report['seconds'] / 60:.1f} min in all.",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| supernet training, per epoch, against its largest subnet alone | "
        f"{t['ratio_per_epoch']:.2f}× ({t['supernet_seconds_per_epoch']:.1f} s against "
        f"{t['largest_alone_seconds_per_epoch']:.1f} s) |",
    ]
    for label in ("sandwich", "progressive"):
        r = report["ranking"].get(label)
        if r:
            lines.append(
                f"| {label}: Kendall τ / Spearman over {r['subnets']} subnets | "
                f"{r['kendall_tau']:.2f} / {r['spearman']:.2f} (within FLOPs groups τ "
                f"{r['kendall_tau_within_groups']:.2f}; FLOPs alone τ "
                f"{r['kendall_tau_of_flops']:.2f}) |"
            )
    for label, r in report["ranking"].get("ceiling", {}).items():
        lines.append(
            f"| {label.replace('_', ' ')}: Kendall τ / Spearman | {r['kendall_tau']:.2f} / "
            f"{r['spearman']:.2f} (within FLOPs groups τ {r['kendall_tau_within_groups']:.2f}) |"
        )
    if "cost" not in report:
        return "\n".join(lines) + "\n"
    c = report["cost"]
    lines.append(
        f"| one supernet evaluation against one training | {c['evaluation_ms_median']:.0f} ms "
        f"against {c['training_seconds_median']:.1f} s ({c['trainings_per_evaluation']:.0f}×) |"
    )
    lines += [
        "",
        "| budget MFLOPs | found on the supernet | from scratch val | inherited | "
        "+fine-tune | multi-trial best val (trainings) | equal compute s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in report["budgets"]:
        m = b["multi_trial"]
        lines.append(
            f"| {b['max_mflops']:.2f} | {b['found']} ({b['found_mflops']:.2f}) | "
            f"{b['found_from_scratch_val']:.4f} | {b['found_inherited_val']:.4f} | "
            f"{b['found_finetuned_val']:.4f} | {m['best_val']:.4f} ({m['trained']}) | "
            f"{b['ws_compute_seconds']:.0f} |"
        )
    if "kernels" in report:
        k = report["kernels"]
        lines += ["", "| kernels | train s | inherited acc k3 / k5 / k7 |", "| --- | --- | --- |"]
        for label, row in k.items():
            lines.append(
                f"| {label} | {row['train_seconds']:.0f} | "
                + " / ".join(f"{row.get(f'kernel{n}', float('nan')):.4f}" for n in (3, 5, 7))
                + " |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
