"""The int8 estimate against the real int8 program, on real images (issue 45).

Trains ``--nets`` ResNets of the guide's sub-space briefly on Fashion-MNIST (28 x 28),
then for each: the estimate (fake quantization: calibrate, round, evaluate) against the
real program (torchao PT2E: export, calibrate, convert, lower to oneDNN int8 kernels,
evaluate), both scored on the same ``--val`` validation images, timed apart. Prints
JSON: the seconds of each side, their ratio, and how far each accuracy is from the
real program's (the float network's too, the estimate anyone has for free). Target:
the estimate in at most a tenth of the real program's time, within 0.3 point of it.

On a GPU (``--device cuda``) the networks train and the estimate runs there, as a
supernet's subnets are estimated where they are evaluated; the real program is lowered
and evaluated on the CPU, the only place its int8 kernels exist.

    python benchmarks/int8_estimate.py [--nets 8] [--val 2400] [--device cpu|cuda] [--out F]

(``--epochs 1``: each network's training.)
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from autosearch import Compression, TrainConfig
from autosearch.compress._fake_quant import estimate_int8
from autosearch.compress._quantize import quantize_ptq
from autosearch.data import Split, load_data
from autosearch.training.train import evaluate, train
from search_spaces import ResNetSpace


def _timed(run):
    start = time.perf_counter()
    value = run()
    return value, time.perf_counter() - start


def _synced(device: torch.device, run):
    """``run()``, with the device's queued work finished before it returns."""
    value = run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--nets", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--val", type=int, default=2400)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    data = load_data(args.data, seed=0)
    pick = torch.randperm(len(data.val), generator=torch.Generator().manual_seed(0))[: args.val]
    val = Split(x=data.val.take(pick), y=data.val.y[pick])
    space = ResNetSpace(max_stages=3, depths=(1, 2, 3), widths=(8, 16, 24, 32))
    rng = np.random.default_rng(0)
    compression, rows = Compression(), []
    for i in range(args.nets):
        arch = space.sample(rng)
        torch.manual_seed(i)
        model = space.build(arch, input_shape=data.input_shape, num_classes=data.num_classes)
        config = TrainConfig(epochs=args.epochs, batch_size=256, lr=0.1, device=args.device)
        train(model, data, config, seed=i)
        model.to(device).eval()
        estimate, estimate_s = _timed(
            lambda m=model: _synced(
                device,
                lambda: evaluate(estimate_int8(m, data, compression, seed=0).model, val, data),
            )
        )
        on_cpu = copy.deepcopy(model).cpu()
        real, real_s = _timed(
            lambda m=on_cpu: evaluate(quantize_ptq(m, data, compression, seed=0).model, val, data)
        )
        float_accuracy = evaluate(model, val, data)[0]
        rows.append(
            {
                "architecture": space.describe(arch),
                "params": sum(p.numel() for p in model.parameters()),
                "estimate_s": estimate_s,
                "real_s": real_s,
                "real_accuracy": real[0],
                "estimate_off_points": 100 * abs(estimate[0] - real[0]),
                "float_off_points": 100 * abs(float_accuracy - real[0]),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr)

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 3)

    result = {
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "data": args.data,
        "validation_images": len(val),
        "nets": rows,
        "median_estimate_s": median("estimate_s"),
        "median_real_s": median("real_s"),
        "median_time_ratio": round(
            statistics.median(r["estimate_s"] / r["real_s"] for r in rows), 3
        ),
        "median_estimate_off_points": median("estimate_off_points"),
        "median_float_off_points": median("float_off_points"),
        "target": "estimate <= 0.1 x the real program's time, within 0.3 point of it",
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
