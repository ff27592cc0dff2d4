"""FSDP and hybrid sharding against DDP and one process. Prints JSON; every ratio is
measured within this run.

A ResNet-18 of the ResNet space (stem 64, four stages of two basic blocks, 64 to 512
channels: 11 M parameters) trains on the same images under each setting, launched by
torchrun as trials are: one process, DDP, FSDP and HSDP (2 × 2) on 2 and 4 ranks. Per
setting and rank: the bytes of parameters and of optimizer state the rank held
(measured from its tensors: its shards under FSDP), the peak CUDA memory where the
device is a GPU, the seconds per epoch, and each epoch's training loss against one
process's and against DDP's on as many ranks (the same global batch: sharding should
change nothing but the order of float sums; batch norm's statistics are per rank, so
one process differs from every multi-rank run by more).

    python benchmarks/sharding.py [--data fashion-mnist] [--images 2048] [--device cpu]

On the CPU the ranks are gloo processes of one thread each: the time ratios there are
the price of the collectives on one machine, not a GPU's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from autosearch import TrainConfig
from autosearch.data import Split, load_data
from autosearch.training.runtime import init_distributed, leave_distributed, resolve
from autosearch.training.train import train
from search_spaces import ResNetSpace

SETTINGS = [  # name, ranks, parallel, shard_size
    ("one process", 1, "ddp", None),
    ("ddp x2", 2, "ddp", None),
    ("fsdp x2", 2, "fsdp", None),
    ("ddp x4", 4, "ddp", None),
    ("fsdp x4", 4, "fsdp", None),
    ("hsdp 2x2", 4, "hsdp", 2),
]


def resnet18(data):
    space = ResNetSpace()
    genes = {"stem.width": 64, "block": "basic", "shortcut": "projection", "stages": 4}
    for i, width in enumerate((64, 128, 256, 512), start=1):
        genes |= {f"stage{i}.depth": 2, f"stage{i}.width": width}
    arch = space.make({**space.default(), **genes})
    torch.manual_seed(0)
    return space.build(arch, input_shape=data.input_shape, num_classes=data.num_classes)


def _data(spec: str, images: int):
    """The first ``images`` training images, validated on a quarter as many
    (``cifar10-sample``: drawn from the shared CIFAR-10 tarball, 32 x 32)."""
    if spec == "cifar10-sample":
        import importlib.util

        path = Path(__file__).with_name("nb201_supernet.py")
        found = importlib.util.spec_from_file_location("nb201_supernet", path)
        assert found is not None and found.loader is not None
        nb201 = importlib.util.module_from_spec(found)
        found.loader.exec_module(nb201)
        x, y = nb201.sampled(images * 2, 32)
        data = load_data((x, y), seed=0, num_classes=10)
    else:
        data = load_data(spec, seed=0)
    val = max(1, images // 4)
    return dataclasses.replace(
        data,
        train=Split(x=data.train.x[:images], y=data.train.y[:images]),
        val=Split(x=data.val.x[:val], y=data.val.y[:val]),
    )


def worker(args: argparse.Namespace) -> None:
    """One rank of one setting: train, write what it held and measured."""
    init_distributed(args.device)
    runtime = resolve(device=args.device, precision=args.precision)
    data = _data(args.data, args.images)
    config = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=0.05,
        device=args.device,
        precision=args.precision,
        parallel=args.parallel,
        shard_size=args.shard_size,
        cuda_graphs=False,
    )
    model = resnet18(data)
    if runtime.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(runtime.device)
    start = time.perf_counter()
    result = train(model, data, config, seed=0, runtime=runtime)
    seconds = time.perf_counter() - start
    out = {
        "rank": runtime.rank,
        "world": runtime.world_size,
        "held": result.held,
        "losses": [e.train_loss for e in result.history],
        "seconds_per_epoch": seconds / args.epochs,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if runtime.device.type == "cuda":
        out["peak_cuda_bytes"] = torch.cuda.max_memory_allocated(runtime.device)
    Path(args.out, f"rank{runtime.rank}.json").write_text(json.dumps(out))
    leave_distributed()


def run_setting(args, ranks: int, parallel: str, shard_size: int | None) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, __file__, "--worker", "--out", out, "--parallel", parallel]
        command += ["--data", args.data, "--images", str(args.images), "--epochs", str(args.epochs)]
        command += ["--batch-size", str(args.batch_size), "--device", args.device]
        command += ["--precision", args.precision]
        if shard_size:
            command += ["--shard-size", str(shard_size)]
        if ranks > 1:
            torchrun = str(Path(sys.executable).with_name("torchrun"))
            command = [torchrun, "--standalone", f"--nproc-per-node={ranks}", *command[1:]]
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--images", type=int, default=2048, help="training images used")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--only", nargs="*", help="settings by name (default: all)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--parallel", default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--shard-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    report: dict = {
        "machine": _machine(),
        "model": "ResNet-18 (ResNet space)",
        "data": args.data,
        "images": args.images,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "device": args.device,
        "precision": args.precision,
        "settings": {},
    }
    for name, ranks, parallel, shard_size in SETTINGS:
        if args.only and name not in args.only:
            continue
        ranks_out = run_setting(args, ranks, parallel, shard_size)
        report["settings"][name] = {"ranks": ranks_out}
        print(f"{name}: done", file=sys.stderr)
    _summarise(report)
    print(json.dumps(report, indent=2))


def _summarise(report: dict) -> None:
    settings = report["settings"]
    one = settings.get("one process", {}).get("ranks", [None])[0]
    for setting in settings.values():
        ranks = setting["ranks"]
        first = ranks[0]
        summary = {
            "parameter_bytes_per_rank": max(r["held"]["parameters"] for r in ranks),
            "optimizer_bytes_per_rank": max(r["held"]["optimizer"] for r in ranks),
            "seconds_per_epoch": max(r["seconds_per_epoch"] for r in ranks),
        }
        if "peak_cuda_bytes" in first:
            summary["peak_cuda_bytes_per_rank"] = max(r["peak_cuda_bytes"] for r in ranks)
        if one is not None:
            whole = one["held"]["parameters"]
            summary["parameter_share_of_one_process"] = summary["parameter_bytes_per_rank"] / whole
            summary["optimizer_share_of_one_process"] = (
                summary["optimizer_bytes_per_rank"] / one["held"]["optimizer"]
            )
            summary["time_vs_one_process"] = summary["seconds_per_epoch"] / one["seconds_per_epoch"]
            summary["loss_vs_one_process"] = _difference(first["losses"], one["losses"])
        ddp = settings.get(f"ddp x{len(ranks)}", {}).get("ranks")
        if ddp and len(ranks) > 1:  # the same per-rank batches: batch norm alike
            summary["loss_vs_ddp_same_ranks"] = _difference(first["losses"], ddp[0]["losses"])
        setting["summary"] = summary


def _difference(losses: list[float], reference: list[float]) -> float:
    """The largest relative difference between two runs' per-epoch losses."""
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))


def _machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(
            line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line
        )
    except (OSError, StopIteration):
        model = "unknown"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return f"{model}, {os.cpu_count()} cores" + (f", {gpu}" if gpu else "")


if __name__ == "__main__":
    main()
