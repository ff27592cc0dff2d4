"""Training-stack benchmark. Prints JSON; every ratio is measured within this run.

1. trainer: autosearch's train() against a hand-written PyTorch loop on the same model,
   data, batch and schedule (both validate after each epoch), interleaved, median of
   repeats: throughput ratio (target >= 0.97 on CPU fp32).
2. pipeline: images/s of batched in-memory augmentation (crop + flip + normalise) against
   a per-sample torch DataLoader doing the same.
3. ddp: the same training under torchrun with 2 gloo processes (1 thread each) against
   1 process (all threads).
4. early_stopping: a study with and without successive halving: wall time and the best
   validation accuracy found.
5. streamed: the training split written as PNG files and streamed (a DataLoader with 0
   and with 2 worker processes decoding them) against the same images held in memory:
   training throughput, and the one-off scan's images/s.

    python benchmarks/trainer.py [--data digits] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from autosearch import TrainConfig, create_study
from autosearch.data import augment, load_data
from autosearch.training.early_stopping import SuccessiveHalving
from autosearch.training.train import evaluate, train
from controllers import RandomSearch
from search_spaces import ResNetSpace

SPACE = ResNetSpace(max_stages=3, depths=(1, 2), widths=(16, 32), stem_widths=(16,))


def _model(data):
    torch.manual_seed(0)
    arch = SPACE.make({**SPACE.default(), "stages": 2, "block": "basic"})
    return SPACE.build(arch, input_shape=data.input_shape, num_classes=data.num_classes)


def plain_loop(model, data, config: TrainConfig, seed: int) -> None:
    """What one would write by hand: shuffle, step, cosine schedule, validate."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(
        model.parameters(),
        lr=config.lr,
        momentum=0.9,
        nesterov=True,
        weight_decay=config.weight_decay,
    )
    steps = config.epochs * -(-len(data.train) // config.batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in range(config.epochs):
        model.train()
        for idx in torch.randperm(len(data.train), generator=g).split(config.batch_size):
            loss = F.cross_entropy(model(data.normalize(data.train.x[idx])), data.train.y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        evaluate(model, data.val, data)


def bench_trainer(data, repeats: int) -> dict[str, float]:
    config = TrainConfig(epochs=2, batch_size=128, lr=0.05, device="cpu", precision="fp32")
    runs = {
        "ours": lambda m: train(m, data, config, seed=0),
        "plain": lambda m: plain_loop(m, data, config, seed=0),
    }
    for run in runs.values():  # warm-up, untimed: first calls pay for allocator and caches
        run(_model(data))
    times: dict[str, list[float]] = {"ours": [], "plain": []}
    for repeat in range(repeats):  # interleaved, alternating who goes first
        for name in ("ours", "plain") if repeat % 2 == 0 else ("plain", "ours"):
            model = _model(data)
            start = time.perf_counter()
            runs[name](model)
            times[name].append(time.perf_counter() - start)
    ours, plain = statistics.median(times["ours"]), statistics.median(times["plain"])
    images = config.epochs * len(data.train)
    return {
        "autosearch_images_per_s": images / ours,
        "plain_images_per_s": images / plain,
        "throughput_ratio": plain / ours,
    }


class _PerSample(torch.utils.data.Dataset):
    def __init__(self, data, padding: int) -> None:
        self.data, self.padding = data, padding
        self.g = torch.Generator().manual_seed(0)

    def __len__(self) -> int:
        return len(self.data.train)

    def __getitem__(self, i: int):
        x = self.data.train.x[i]
        p = self.padding
        x = F.pad(x, (p, p, p, p))
        top, left = torch.randint(0, 2 * p + 1, (2,), generator=self.g).tolist()
        x = x[:, top : top + self.data.input_shape[1], left : left + self.data.input_shape[2]]
        if torch.rand(1, generator=self.g).item() < 0.5:
            x = x.flip(2)
        return self.data.normalize(x[None])[0], self.data.train.y[i]


def bench_pipeline(data, repeats: int) -> dict[str, float]:
    config = TrainConfig(crop_padding=2, flip=True)
    batched, loader = [], []
    for _ in range(repeats):
        g = torch.Generator().manual_seed(0)
        start = time.perf_counter()
        for idx in torch.randperm(len(data.train), generator=g).split(128):
            data.normalize(
                augment(
                    data.train.x[idx],
                    crop_padding=config.crop_padding,
                    flip=config.flip,
                    generator=g,
                )
            )
        batched.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _x, _y in torch.utils.data.DataLoader(
            _PerSample(data, 2), batch_size=128, shuffle=True
        ):
            pass
        loader.append(time.perf_counter() - start)
    n = len(data.train)
    return {
        "batched_images_per_s": n / statistics.median(batched),
        "dataloader_images_per_s": n / statistics.median(loader),
        "speedup": statistics.median(loader) / statistics.median(batched),
    }


_DDP = """
import sys, time, torch
from trainer import _model  # this folder is on PYTHONPATH
from autosearch import TrainConfig
from autosearch.data import load_data
from autosearch.training.runtime import init_distributed, resolve
from autosearch.training.train import train
init_distributed()
data = load_data({data!r})
config = TrainConfig(epochs=2, batch_size=128, lr=0.05, device="cpu", precision="fp32")
start = time.perf_counter()
train(_model(data), data, config, seed=0, runtime=resolve(device="cpu", precision="fp32"))
if resolve().rank == 0:
    print("SECONDS", time.perf_counter() - start)
"""


def bench_ddp(data_spec: str) -> dict[str, float]:
    here = str(Path(__file__).resolve().parent)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "ddp.py"
        script.write_text(_DDP.format(data=data_spec))
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        runs = {}
        for procs in (1, 2):
            threads = str(max(1, (os.cpu_count() or 1) // procs))
            env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": here}
            out = subprocess.run(
                [torchrun, "--standalone", f"--nproc-per-node={procs}", str(script)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            runs[procs] = float(out.split("SECONDS")[-1])
    return {"one_process_s": runs[1], "two_processes_s": runs[2], "speedup": runs[1] / runs[2]}


def bench_early_stopping(data_spec: str) -> dict[str, float]:
    results = {}
    for label, stopper in (
        ("without", None),
        ("with", SuccessiveHalving(min_epochs=1, reduction=3)),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            study = create_study(
                label,
                controller=RandomSearch(SPACE, seed=0),
                data=data_spec,
                train=TrainConfig(epochs=6, batch_size=128, lr=0.05),
                storage=f"sqlite:///{tmp}/s.db",
                early_stopping=stopper,
            )
            start = time.perf_counter()
            study.optimize(9)
            results[label] = (
                time.perf_counter() - start,
                study.best().metrics["accuracy"],
                study.trials.count("stopped"),
            )
    return {
        "seconds_without": results["without"][0],
        "seconds_with": results["with"][0],
        "time_saved": 1 - results["with"][0] / results["without"][0],
        "best_val_without": results["without"][1],
        "best_val_with": results["with"][1],
        "trials_stopped": results["with"][2],
    }


def bench_streamed(data, repeats: int, limit: int) -> dict[str, float]:
    from PIL import Image

    from autosearch.data.loading import load_named

    config = TrainConfig(epochs=1, batch_size=128, lr=0.05, crop_padding=1, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "images"
        images, labels = data.train.x[:limit], data.train.y[:limit]
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            (root / str(int(label))).mkdir(parents=True, exist_ok=True)
            pixels = image.permute(1, 2, 0).numpy()
            Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(
                root / str(int(label)) / f"{i}.png"
            )
        os.environ["AUTOSEARCH_CACHE"] = str(Path(tmp) / "cache")
        start = time.perf_counter()
        streamed = load_data(f"folder:{root}", stream=True)
        scan_s = time.perf_counter() - start
        load_named.cache_clear()
        held = load_data(f"folder:{root}", stream=False)
        times: dict[str, list[float]] = {
            "memory": [],
            "workers_0": [],
            "workers_1": [],
            "workers_2": [],
        }
        for _ in range(repeats):  # interleaved
            for label in times:
                dataset = held if label == "memory" else streamed
                os.environ["AUTOSEARCH_LOADER_WORKERS"] = label.removeprefix("workers_")
                model = _model(dataset)
                start = time.perf_counter()
                train(model, dataset, config, seed=0)
                times[label].append(time.perf_counter() - start)
        os.environ.pop("AUTOSEARCH_LOADER_WORKERS")
    n = len(streamed.train)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "images": n,
        "scan_images_per_s": (n + len(streamed.val) + len(streamed.test)) / scan_s,
        "memory_images_per_s": n / median["memory"],
        **{f"streamed_{w}_workers_images_per_s": n / median[f"workers_{w}"] for w in (0, 1, 2)},
        **{
            f"streamed_{w}_workers_vs_memory": median["memory"] / median[f"workers_{w}"]
            for w in (0, 1, 2)
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="digits")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", nargs="*", help="sections to run (default: all)")
    parser.add_argument(
        "--stream-data", help="dataset written out as PNG files for the streamed section"
    )
    parser.add_argument("--stream-images", type=int, default=12000)
    args = parser.parse_args()
    import logging

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("autosearch").setLevel(logging.ERROR)
    data = load_data(args.data)
    sections = {
        "trainer": lambda: bench_trainer(data, args.repeats),
        "pipeline": lambda: bench_pipeline(data, args.repeats),
        "ddp": lambda: bench_ddp(args.data),
        "early_stopping": lambda: bench_early_stopping(args.data),
        "streamed": lambda: bench_streamed(
            load_data(args.stream_data) if args.stream_data else data,
            max(3, args.repeats // 2),
            args.stream_images,
        ),
    }
    chosen = args.only or list(sections)
    unknown = sorted(set(chosen) - set(sections))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {sorted(sections)}")
    out = {"device": "cpu", "threads": torch.get_num_threads(), "data": args.data}
    if "streamed" in chosen:
        out["stream_data"] = args.stream_data or args.data
    print(json.dumps(out | {name: sections[name]() for name in chosen}, indent=2))


if __name__ == "__main__":
    main()
