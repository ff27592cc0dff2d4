"""Population-based training against the best of fixed-setting trials and against Ray
Tune's PopulationBasedTraining, on the same task at equal compute. Prints JSON.

Per seed, three methods train 8 runs of a small ResNet on Fashion-MNIST images for the
same number of epochs each (equal compute: 8 x epochs), two at a time on the 2 cores:

- fixed: 8 trials with fixed settings, drawn from the ranges (the population's own
  initial draws), the best final validation accuracy kept;
- autosearch: ``autosearch.train_population`` with 2 workers sharing the population's
  folder (size 8, every 2 epochs, quantile 0.25, resample 0.25, factors 0.8 / 1.2;
  members ranked with batch-norm statistics recomputed over ``--precise-bn`` images);
- ray: Ray Tune's ``PopulationBasedTraining`` with the same settings and the same
  initial draws, the same trainer (autosearch's ``train``, one epoch a report, its
  checkpoint handed to Ray), 2 trials at a time (1 CPU each).

The figures: each method's best final validation accuracy, that run's test accuracy,
and its wall time. Needs ``ray[tune]`` (``pip install 'ray[tune]'``).

    python benchmarks/pbt.py [--seeds 0 1 2] [--epochs 6] [--images 6000]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from optuna.distributions import FloatDistribution

from autosearch import PopulationBasedTraining, TrainConfig, train_population
from autosearch.data import Split, load_data
from autosearch.training.train import evaluate, train
from search_spaces import ResNetSpace

SPACE = ResNetSpace(max_stages=2, depths=(1, 2), widths=(16, 32), stem_widths=(16,))
MUTATIONS = {
    "lr": FloatDistribution(0.003, 0.3, log=True),
    "weight_decay": FloatDistribution(1e-5, 1e-2, log=True),
}
SIZE, INTERVAL = 8, 2


def task(args: argparse.Namespace):
    """(data, base config, population) of one seed."""
    data = load_data(args.data, seed=args.seed)
    n, v = args.images, args.images // 4
    data = dataclasses.replace(
        data,
        train=Split(x=data.train.x[:n], y=data.train.y[:n]),
        val=Split(x=data.val.x[:v], y=data.val.y[:v]),
    )
    config = TrainConfig(epochs=args.epochs, batch_size=128, crop_padding=2, device="cpu")
    population = PopulationBasedTraining(
        size=SIZE, interval=INTERVAL, quantile=0.25, resample=0.25, mutations=MUTATIONS,
        seed=args.seed, burn_in=args.burn_in, precise_bn=args.precise_bn,
    )  # fmt: skip
    return data, config, population


def builder(data, seed: int):
    shape, classes = data.input_shape, data.num_classes

    def build() -> torch.nn.Module:  # the architecture made here: Ray pickles this
        arch = SPACE.make({**SPACE.default(), "stages": 2, "block": "basic"})
        torch.manual_seed(seed)
        return SPACE.build(arch, input_shape=shape, num_classes=classes)

    return build


def run_fixed(args) -> dict:
    """This worker's share of the fixed-setting trials (every other member)."""
    data, config, population = task(args)
    build, out = builder(data, args.seed), {}
    for member in range(args.share, SIZE, 2):
        model = build()
        cfg = dataclasses.replace(config, **population.initial(member))
        result = train(model, data, cfg, seed=args.seed)
        out[member] = {"val": result.val_accuracy, "test": evaluate(model, data.test, data)[0]}
    return out


def run_autosearch(args) -> dict:
    data, config, population = task(args)
    build = builder(data, args.seed)
    result = train_population(build, data, config, population, args.folder, seed=args.seed)
    model = result.load(build())
    return {"val": result.val_accuracy, "test": evaluate(model, data.test, data)[0],
            "winner": result.winner, "rounds": len(result.rounds)}  # fmt: skip


def run_ray(args) -> dict:
    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining as RayPBT

    shared, config, population = task(args)
    build = builder(shared, args.seed)
    initial = [population.initial(i) for i in range(SIZE)]

    def trainable(settings: dict, data=None) -> None:  # data: through Ray's object store
        torch.set_num_threads(1)
        work = Path(tempfile.mkdtemp())
        checkpoint = work / "train.pt"
        start = tune.get_checkpoint()
        if start is not None:
            with start.as_directory() as folder:
                shutil.copyfile(Path(folder) / "train.pt", checkpoint)
        cfg = dataclasses.replace(config, lr=settings["lr"], weight_decay=settings["weight_decay"])
        done = torch.load(checkpoint, weights_only=True)["epoch"] if checkpoint.exists() else 0
        for epoch in range(done + 1, config.epochs + 1):
            model = build()
            result = train(model, data, cfg, seed=args.seed, checkpoint=checkpoint, until=epoch,
                           adaptive=["lr", "weight_decay"])  # fmt: skip
            report = {"val_accuracy": result.val_accuracy, "epoch": epoch}
            if epoch == config.epochs:
                report["test_accuracy"] = evaluate(model, data.test, data)[0]
            with tempfile.TemporaryDirectory() as folder:
                shutil.copyfile(checkpoint, Path(folder) / "train.pt")
                tune.report(report, checkpoint=tune.Checkpoint.from_directory(folder))

    scheduler = RayPBT(
        time_attr="training_iteration",
        perturbation_interval=INTERVAL,
        burn_in_period=args.burn_in,
        quantile_fraction=0.25,
        resample_probability=0.25,
        perturbation_factors=(1.2, 0.8),
        hyperparam_mutations={
            "lr": tune.loguniform(MUTATIONS["lr"].low, MUTATIONS["lr"].high),
            "weight_decay": tune.loguniform(
                MUTATIONS["weight_decay"].low, MUTATIONS["weight_decay"].high
            ),
        },
    )
    space = {
        "member": tune.grid_search(list(range(SIZE))),
        "lr": tune.sample_from(lambda spec: initial[spec.config.member]["lr"]),
        "weight_decay": tune.sample_from(lambda spec: initial[spec.config.member]["weight_decay"]),
    }
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable, data=shared), {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            scheduler=scheduler, metric="val_accuracy", mode="max", num_samples=1
        ),
        run_config=tune.RunConfig(storage_path=str(Path(args.folder).resolve()), verbose=0),
    )
    results = tuner.fit()
    best = results.get_best_result(metric="val_accuracy", mode="max", scope="last")
    ray.shutdown()
    return {"val": best.metrics["val_accuracy"], "test": best.metrics.get("test_accuracy")}


def _worker(args) -> None:
    out = {"fixed": run_fixed, "autosearch": run_autosearch, "ray": run_ray}[args.method](args)
    Path(args.out).write_text(json.dumps(out))


def _launch(method: str, args, folder: Path, workers: int) -> tuple[list[dict], float]:
    """``workers`` processes of ``method`` at once; their outputs and the wall time."""
    base = [sys.executable, __file__, "--worker", "--method", method, "--seed", str(args.seed)]
    base += ["--epochs", str(args.epochs), "--images", str(args.images), "--data", args.data]
    base += ["--folder", str(folder), "--burn-in", str(args.burn_in)]
    base += ["--precise-bn", str(args.precise_bn)]
    home = folder / "home"  # Ray reads nothing of the user's (~/.ray) here
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HOME": str(home)}
    env.pop("RAY_ADDRESS", None)
    start = time.perf_counter()
    procs, outs = [], []
    for share in range(workers):
        out = folder / f"out{share}.json"
        outs.append(out)
        cmd = [*base, "--share", str(share), "--out", str(out)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=sys.stderr))  # Ray prints tables
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"{method} worker failed (exit {proc.returncode})")
    return [json.loads(o.read_text()) for o in outs], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--methods", nargs="+", default=["fixed", "autosearch", "ray"])
    parser.add_argument("--keep", help="keep every run's folder (population records) here")
    parser.add_argument("--burn-in", type=int, default=0, help="epochs before the first round")
    parser.add_argument(
        "--precise-bn",
        type=int,
        default=PopulationBasedTraining().precise_bn,
        help="training images autosearch's rounds recompute batch-norm statistics over "
        "before ranking (0: rank as trained, as Ray Tune does)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--share", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        torch.set_num_threads(1)
        _worker(args)
        return
    report: dict = {"epochs": args.epochs, "images": args.images, "data": args.data,
                    "size": SIZE, "interval": INTERVAL, "burn_in": args.burn_in,
                    "precise_bn": args.precise_bn,
                    "seeds": {}}  # fmt: skip
    for seed in args.seeds:
        args.seed = seed
        row: dict = {}
        keep = Path(args.keep) / f"seed{seed}" if args.keep else None
        with (
            contextlib.nullcontext(str(keep)) if keep else tempfile.TemporaryDirectory() as scratch
        ):
            for method in args.methods:
                workers = 1 if method == "ray" else 2  # Ray runs 2 trials at once itself
                outs, seconds = _launch(method, args, Path(scratch) / method, workers)
                if method == "fixed":
                    members = {int(k): v for out in outs for k, v in out.items()}
                    best = max(members.values(), key=lambda m: m["val"])
                    row[method] = {**best, "seconds": seconds, "members": members}
                else:
                    row[method] = {**outs[0], "seconds": seconds}
                print(f"seed {seed} {method}: {row[method]['val']:.4f} in {seconds:.0f} s",
                      file=sys.stderr)  # fmt: skip
        report["seeds"][str(seed)] = row
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
