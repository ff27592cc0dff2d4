"""A ground truth to rank supernets against: subnets of a sub-space trained stand-alone,
from scratch, with two seeds, and how well the two seeds agree.

A supernet's ranking means little against accuracies that do not repeat: on 6,000
Fashion-MNIST images and 4 epochs, two seeds of the same 30 subnets agreed only at
Kendall tau 0.52 (RESULTS.md). This script trains each ranking subnet with each seed
for ``--epochs`` epochs, records the validation accuracy after every epoch (the curve of
seed-against-seed tau along the training) and the final validation and test accuracy,
and keeps it all in one JSON file under ``benchmarks/ground_truth/`` with the recipe,
seeds, data, machine and code version. ``benchmarks/weight_sharing.py`` reads that file
instead of training again; the file is resumable (a killed run goes on where it
stopped) and ``--recompute`` starts it afresh.

Two sub-spaces, so that a result is not one space's accident:

- ``resnet``: stem width 8/16; three stride-2 stages of depth 1–3 and width 8–24
  (6,750 subnets);
- ``mobilenet``: a stride-2 stem, then inverted-residual stages of fixed width (16, 24,
  32) whose depth (1–3), expansion (3/4/6) and kernel (3/5/7) vary (19,683 subnets).

Two protocols (``PROTOCOLS``): ``small`` (20,000 images, 10 epochs: a 2-core CPU) and
``full`` (all 70,000 images, 15 epochs with crops and flips, batch 512: a GPU; the
default). Trainings of one table can run apart (``--seeds 0`` here, ``--seeds 1`` there,
each with its own ``--out``) and be joined with ``--merge``.

    python benchmarks/ground_truth.py --space resnet --protocol small
    python benchmarks/ground_truth.py --space mobilenet            # full: on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from autosearch import TrainConfig
from autosearch.data import Dataset, load_data
from autosearch.training.train import evaluate, train
from search_spaces import MobileNetSpace, ResNetSpace

HERE = Path(__file__).resolve().parent
FORMAT = "autosearch-ground-truth/1"

# A protocol: the data every stand-alone training of a table sees, its recipe, seeds and
# number of subnets per sub-space.
#
# "small" fits this project's 2-core CPU (about 2 hours per table): 20,000 images, 10
# epochs, no augmentation. Its seeds did not agree (Kendall tau 0.28 ResNet, -0.03
# MobileNet; RESULTS.md). MobileNet's depthwise layers train 3-5x slower per FLOP on a
# CPU, so its table there has fewer subnets.
#
# "full" is for a GPU: every Fashion-MNIST image (70,000: 42,000 training, 14,000
# validation, 14,000 test), 15 epochs with random crops and flips, batch 512; on a CPU it
# runs in the trainer's fp32 path at about 100x the cost.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "small": {
        "data": {"source": "fashion-mnist", "images": 20_000, "seed": 0},
        "recipe": {"epochs": 10, "batch_size": 128, "lr": 0.05},
        "seeds": {"resnet": [0, 1], "mobilenet": [0, 1]},
        "subnets": {"resnet": 30, "mobilenet": 16},
    },
    "full": {
        "data": {"source": "fashion-mnist", "images": 0, "seed": 0},
        "recipe": {
            "epochs": 15,
            "batch_size": 512,
            "lr": 0.2,
            "crop_padding": 2,
            "flip": True,
            "channels_last": True,
        },
        # ResNet: four seeds, so that two means of two seeds can be compared.
        "seeds": {"resnet": [0, 1, 2, 3], "mobilenet": [0, 1]},
        "subnets": {"resnet": 30, "mobilenet": 30},
    },
}
DEFAULT = "full"


def resnet_space(**budget: Any):
    """Elastic ResNets for 28×28 images: stem 8/16, three stride-2 stages of depth 1–3
    and width 8–24 (6,750 subnets, 0.4–20 MFLOPs)."""
    return ResNetSpace(
        max_stages=3,
        depths=(1, 2, 3),
        widths=(8, 12, 16, 20, 24),
        stem_widths=(8, 16),
        strides=(1, 2),
    ).supernet(
        fixed={
            "stages": 3,
            "block": "basic",
            "shortcut": "pad",
            "stage1.stride": 2,
            "stage2.stride": 2,
            "stage3.stride": 2,
        },
        **budget,
    )


def mobilenet_space(**budget: Any):
    """Elastic MobileNets for 28×28 images: depth 1–3, expansion 3/4/6 and kernel 3/5/7
    per stage (OFA's elastic dimensions); a stride-2 stem of width 16, then three stages
    of widths 16, 24, 32 and strides 2, 2, 1 (19,683 subnets)."""
    stages = 3
    elastic = [
        f"stage{i}.{g}" for i in range(1, stages + 1) for g in ("depth", "expansion", "kernel")
    ]
    fixed: dict[str, Any] = {
        "stages": stages,
        "width_mult": 1.0,
        "activation": "relu6",
        "stem.width": 16,
        "stem.stride": 2,
        "head.width": 256,
    }
    for i, (width, stride) in enumerate(((16, 2), (24, 2), (32, 1)), start=1):
        fixed |= {
            f"stage{i}.block": "ir",
            f"stage{i}.width": width,
            f"stage{i}.stride": stride,
            f"stage{i}.se": False,
        }
    return MobileNetSpace(
        max_stages=stages,
        depths=(1, 2, 3),
        widths=(16, 24, 32),
        expansions=(3, 4, 6),
        kernels=(3, 5, 7),
        stem_widths=(16,),
        stem_strides=(2,),
        head_widths=(256,),
        activations=("relu6",),
    ).supernet(elastic=elastic, fixed=fixed, **budget)


SPACES = {"resnet": resnet_space, "mobilenet": mobilenet_space}


def dataset(source: str, images: int, seed: int = 0):
    """``(images, labels)`` arrays: ``images`` (0: all) drawn with ``seed`` from the
    source's training and test images together (a study made from them splits them
    60/20/20)."""
    full = load_data(source, seed=seed)
    x = torch.cat([full.train.x, full.val.x, full.test.x])
    y = torch.cat([full.train.y, full.val.y, full.test.y])
    if images:
        pick = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        x, y = x[pick[:images]], y[pick[:images]]
    return x.numpy(), y.numpy()


def spread(elastic, n: int, seed: int, draws: int = 600) -> list:
    """``n`` distinct subnets evenly spaced in FLOPs rank among uniform draws."""
    rng = np.random.default_rng(seed)
    drawn = {a.arch_id: a for a in (elastic.sample(rng) for _ in range(draws))}
    ordered = sorted(drawn.values(), key=lambda a: elastic.cost(a).flops)
    picks = np.linspace(0, len(ordered) - 1, n).round().astype(int)
    return [ordered[i] for i in dict.fromkeys(picks.tolist())]


def trained(elastic, arch, data: Dataset, recipe: TrainConfig, seed: int) -> dict[str, Any]:
    """One stand-alone training: validation accuracy after each epoch, final validation
    and test accuracy, seconds."""
    torch.manual_seed(seed)
    model = elastic.build(arch, input_shape=data.input_shape, num_classes=data.num_classes)
    start = time.perf_counter()
    result = train(model, data, recipe, seed=seed)
    curve = [float(e.val_accuracy) for e in result.history]  # the trainer's own evaluation
    return {
        "val": curve[-1],
        "test": float(evaluate(model, data.test, data)[0]),
        "val_by_epoch": curve,
        "seconds": time.perf_counter() - start,
        "threads": torch.get_num_threads(),
        "device": str(next(model.parameters()).device),
        "precision": result.precision,
    }


def kendall(a: list[float], b: list[float]) -> float:
    return float(stats.kendalltau(a, b)[0])


def agreement(rows: list[dict[str, Any]], seeds: tuple[int, ...] = (0, 1)) -> dict[str, Any]:
    """Seed against seed: Kendall tau and Spearman of the final validation accuracies,
    within FLOPs tertiles, of FLOPs alone, and tau after each epoch."""
    done = [r for r in rows if all(str(s) in r["runs"] for s in seeds[:2])]
    if len(done) < 3:
        return {"subnets": len(done)}
    first, second = (str(s) for s in seeds[:2])
    every = [r for r in done if all(str(s) in r["runs"] for s in seeds)]
    a = [r["runs"][first]["val"] for r in done]
    b = [r["runs"][second]["val"] for r in done]
    flops = [r["flops"] for r in done]
    order = np.argsort(flops)
    within = [
        kendall([a[i] for i in part], [b[i] for i in part])
        for part in np.array_split(order, 3)
        if len(part) > 2
    ]
    epochs = len(done[0]["runs"][first]["val_by_epoch"])
    return {
        "subnets": len(done),
        "kendall_tau": kendall(a, b),
        "spearman": float(stats.spearmanr(a, b)[0]),
        "kendall_tau_within_groups": float(np.nanmean(within)),
        "kendall_tau_of_flops_vs_mean": kendall(
            flops, [(x + y) / 2 for x, y in zip(a, b, strict=True)]
        ),
        "kendall_tau_by_epoch": [
            kendall(
                [r["runs"][first]["val_by_epoch"][e] for r in done],
                [r["runs"][second]["val_by_epoch"][e] for r in done],
            )
            for e in range(epochs)
        ],
        "val_range": [min(a + b), max(a + b)],
        # Validation and test images together (twice the images: less evaluation noise).
        "kendall_tau_held_out": kendall(
            [(r["runs"][first]["val"] + r["runs"][first]["test"]) / 2 for r in done],
            [(r["runs"][second]["val"] + r["runs"][second]["test"]) / 2 for r in done],
        ),
        "projection": projection(a, b),
        **(halves(every, seeds) if len(every) > 2 else {}),
    }


def seed_mean(row: dict[str, Any], seeds: list[str]) -> float:
    """A subnet's final validation accuracy averaged over ``seeds``."""
    return float(np.mean([row["runs"][s]["val"] for s in seeds]))


def halves(done: list[dict[str, Any]], seeds: tuple[int, ...]) -> dict[str, Any]:
    """With four seeds or more: Kendall tau between the means of the first and the
    second half of the seeds (what a two-seed-mean ground truth repeats at)."""
    if len(seeds) < 4:
        return {}
    half = len(seeds) // 2
    first, second = ([str(s) for s in part] for part in (seeds[:half], seeds[half:]))
    return {
        "kendall_tau_of_seed_means": kendall(
            [seed_mean(r, first) for r in done], [seed_mean(r, second) for r in done]
        ),
        "seed_means": [first, second],
    }


def projection(a: list[float], b: list[float], seeds=(1, 2, 4, 8), draws: int = 2000) -> dict:
    """How the seeds' agreement would grow with more seeds per subnet, from the two
    measured: the seed noise (sd of one training's accuracy around the subnet's mean,
    from the pairs' differences), the subnets' true spread (the variance of the pair
    means less the noise's share, their means shrunk to it), and the expected Kendall
    tau between two independent means of ``m`` seeds each, simulated."""
    x, y = np.asarray(a), np.asarray(b)
    noise = float(np.sqrt(np.mean((x - y) ** 2) / 2))
    means = (x + y) / 2
    spread = max(float(np.var(means, ddof=1)) - noise**2 / 2, 0.0)
    shrink = spread / (spread + noise**2 / 2) if spread else 0.0
    truth = means.mean() + shrink * (means - means.mean())
    rng = np.random.default_rng(0)
    expected = {}
    for m in seeds:
        taus = [
            kendall(
                list(truth + rng.normal(0, noise / np.sqrt(m), len(truth))),
                list(truth + rng.normal(0, noise / np.sqrt(m), len(truth))),
            )
            for _ in range(draws)
        ]
        expected[str(m)] = float(np.mean(taus))
    return {
        "seed_noise_sd": noise,
        "true_spread_sd": float(np.sqrt(spread)),
        "expected_tau_of_m_seed_means": expected,
    }


def mean_truth(table: dict[str, Any]) -> dict[str, float]:
    """arch id -> the mean over the table's seeds of the final validation accuracy
    (subnets trained with each of them)."""
    return {
        r["arch_id"]: float(np.mean([run["val"] for run in r["runs"].values()]))
        for r in table["subnets"]
        if len(r["runs"]) == len(table["seeds"])
    }


def path_for(space: str, protocol: str = DEFAULT) -> Path:
    source = PROTOCOLS[protocol]["data"]["source"]
    return HERE / "ground_truth" / f"{source}-{space}-{protocol}.json"


def load(space: str, protocol: str = DEFAULT) -> dict[str, Any]:
    """The stored ground truth of ``space`` under ``protocol`` (complete or not)."""
    return json.loads(path_for(space, protocol).read_text())


def protocol_data(protocol: str) -> Dataset:
    """The study-split dataset every training of ``protocol`` sees."""
    spec = PROTOCOLS[protocol]["data"]
    return load_data(dataset(spec["source"], spec["images"], spec["seed"]), seed=spec["seed"])


def _code_version() -> str:
    if os.environ.get("AUTOSEARCH_CODE_VERSION"):  # a copy of the tree without its history
        return os.environ["AUTOSEARCH_CODE_VERSION"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    host = f"{model}, {os.cpu_count()} cores, {platform.system()}, torch {torch.__version__}"
    return f"{torch.cuda.get_device_name()} ({host})" if torch.cuda.is_available() else host


def _head(space: str, protocol: str) -> dict[str, Any]:
    spec = PROTOCOLS[protocol]
    return {
        "format": FORMAT,
        "protocol": protocol,
        "space": space,
        "space_doc": SPACES[space].__doc__.split("\n\n")[0].replace("\n", " "),
        "data": spec["data"],
        "recipe": spec["recipe"],
        "seeds": list(spec["seeds"][space]),
        "subnets_drawn": {"n": spec["subnets"][space], "seed": 0, "draws": 600},
    }


def _save(table: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1))
    tmp.replace(out)


def build(
    space: str,
    protocol: str = DEFAULT,
    *,
    recompute: bool = False,
    out: Path | None = None,
    seeds: list[int] | None = None,
) -> dict[str, Any]:
    """Train what the stored table lacks (everything with ``recompute``; only ``seeds``
    when given), saving after each training; returns the table. Subnets are trained in
    a fixed shuffled order, so that a table cut short still spans the FLOPs range."""
    out = out or path_for(space, protocol)
    elastic = SPACES[space]()
    head = _head(space, protocol)
    recipe = TrainConfig(**head["recipe"])
    table: dict[str, Any] = {**head, "subnets": []}
    if out.exists() and not recompute:
        stored = json.loads(out.read_text())
        if {k: stored.get(k) for k in head} != head:
            sys.exit(f"{out} holds another recipe or data; --recompute trains it afresh")
        table = stored
    data = protocol_data(protocol)
    table["images"] = {"train": len(data.train), "val": len(data.val), "test": len(data.test)}
    rows = {r["arch_id"]: r for r in table["subnets"]}
    archs = spread(elastic, head["subnets_drawn"]["n"], 0)
    for i in np.random.default_rng(0).permutation(len(archs)):
        arch = archs[i]
        row = rows.setdefault(
            arch.arch_id,
            {
                "arch_id": arch.arch_id,
                "arch": dict(arch),
                "describe": elastic.describe(arch),
                "flops": float(elastic.cost(arch, input_shape=data.input_shape).flops),
                "runs": {},
            },
        )
        for seed in seeds if seeds is not None else head["seeds"]:
            if str(seed) in row["runs"]:
                continue
            row["runs"][str(seed)] = trained(elastic, arch, data, recipe, seed)
            table["subnets"] = sorted(rows.values(), key=lambda r: r["flops"])
            table["machine"], table["code"] = _machine(), _code_version()
            table["agreement"] = agreement(table["subnets"], tuple(head["seeds"]))
            _save(table, out)
            run = row["runs"][str(seed)]
            print(
                f"{row['describe']} seed {seed}: val {run['val']:.4f} ({run['seconds']:.1f} s); "
                f"tau so far {table['agreement'].get('kendall_tau', float('nan')):.3f}",
                file=sys.stderr,
                flush=True,
            )
    table["subnets"] = sorted(rows.values(), key=lambda r: r["flops"])
    table["agreement"] = agreement(table["subnets"], tuple(head["seeds"]))
    return table


def merge(space: str, protocol: str, parts: list[Path], out: Path | None = None) -> dict:
    """One table from tables of the same protocol trained apart (``--seeds``, another
    machine): their runs together, saved to the protocol's file."""
    head = _head(space, protocol)
    rows: dict[str, dict[str, Any]] = {}
    table: dict[str, Any] = {**head}
    for part in parts:
        stored = json.loads(part.read_text())
        same = {k: stored.get(k) for k in head if k != "seeds"} == {
            k: v for k, v in head.items() if k != "seeds"
        }
        if not same or not set(stored.get("seeds", [])) <= set(head["seeds"]):
            sys.exit(f"{part} holds another protocol, space, recipe or data than {protocol}")
        for key in ("images", "machine", "code"):
            table.setdefault(key, stored.get(key))
        for row in stored["subnets"]:
            rows.setdefault(row["arch_id"], {**row, "runs": {}})["runs"].update(row["runs"])
    table["subnets"] = sorted(rows.values(), key=lambda r: r["flops"])
    table["agreement"] = agreement(table["subnets"], tuple(head["seeds"]))
    _save(table, out or path_for(space, protocol))
    return table


def markdown(table: dict[str, Any]) -> str:
    """The table's agreement as RESULTS.md shows it."""
    a = table["agreement"]
    p = a["projection"]
    runs = [run for r in table["subnets"] for run in r["runs"].values()]
    by_epoch = " / ".join(f"{t:.2f}" for t in a["kendall_tau_by_epoch"])
    expected = ", ".join(
        f"{m} seed{'s' if m != '1' else ''}: {t:.2f}"
        for m, t in p["expected_tau_of_m_seed_means"].items()
    )
    return "\n".join(
        [
            f"**{table['space']}**: {a['subnets']} subnets, {len(runs)} trainings "
            f"({sum(r['seconds'] for r in runs) / 3600:.1f} h of training on {table['machine']}).",
            "",
            "| measure | value |",
            "| --- | --- |",
            f"| seed 0 against seed 1, Kendall τ / Spearman (validation) | "
            f"{a['kendall_tau']:.2f} / {a['spearman']:.2f} |",
            f"| the same on validation and test images together "
            f"({table['images']['val'] + table['images']['test']:,}) | "
            f"{a['kendall_tau_held_out']:.2f} |",
            f"| within FLOPs tertiles | {a['kendall_tau_within_groups']:.2f} |",
            *(
                [
                    f"| mean of seeds {', '.join(a['seed_means'][0])} against mean of seeds "
                    f"{', '.join(a['seed_means'][1])}, Kendall τ | "
                    f"{a['kendall_tau_of_seed_means']:.2f} |"
                ]
                if "kendall_tau_of_seed_means" in a
                else []
            ),
            f"| FLOPs alone against the two-seed mean | {a['kendall_tau_of_flops_vs_mean']:.2f} |",
            f"| validation accuracy range | {100 * a['val_range'][0]:.2f}–"
            f"{100 * a['val_range'][1]:.2f} % |",
            f"| τ after each epoch (of the {table['recipe']['epochs']}-epoch cosine run) "
            f"| {by_epoch} |",
            f"| seed noise (sd of one training) / the subnets' true spread (sd) | "
            f"{100 * p['seed_noise_sd']:.2f} / {100 * p['true_spread_sd']:.2f} points |",
            f"| expected τ between two means of m seeds (projection) | {expected} |",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", choices=sorted(SPACES), default="resnet")
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), default=DEFAULT)
    parser.add_argument("--recompute", action="store_true", help="train everything again")
    parser.add_argument("--out", type=Path, help="default: " + str(path_for("SPACE", DEFAULT)))
    parser.add_argument("--seeds", type=int, nargs="+", help="train only these seeds")
    parser.add_argument("--merge", type=Path, nargs="+", help="join these tables into one")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--markdown", help="write the agreement table here too")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    began = time.perf_counter()
    if args.merge:
        table = merge(args.space, args.protocol, args.merge, args.out)
    else:
        table = build(
            args.space, args.protocol, recompute=args.recompute, out=args.out, seeds=args.seeds
        )
    if args.markdown:
        Path(args.markdown).write_text(markdown(table))
    seconds = sum(run["seconds"] for r in table["subnets"] for run in r["runs"].values())
    print(
        json.dumps(
            {
                "space": args.space,
                "protocol": args.protocol,
                "agreement": table["agreement"],
                "training_seconds": seconds,
                "seconds_this_run": time.perf_counter() - began,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
