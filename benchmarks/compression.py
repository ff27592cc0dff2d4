"""Compressed variants of reference architectures: accuracy, MACs, latency and bytes.

    python benchmarks/compression.py [--data digits|fashion-mnist] [--epochs N]

Each reference network is trained with the shared trainer, then every variant is derived
with autosearch.compress, evaluated on the validation and test splits, and measured.
Latency is ms per image on one CPU thread (median of interleaved rounds: base and
variant alternate, so machine noise hits both alike), at batch 1 and in batches of 32.
MACs are conv/linear multiply-accumulates per image (FLOPs = 2 × MACs); bytes are the
saved weights (safetensors; int8 tensors for int8). Prints JSON.

Targets (issue 6): int8 at least 1.5× faster than fp32 on this CPU with at most 1 point
of accuracy lost; channel pruning at ratio 0.5 at least 2× fewer MACs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from autosearch import Compression, TrainConfig
from autosearch.compress import derive
from autosearch.compress._quantize import has_vnni, int8_ops
from autosearch.data import load_data
from autosearch.scoring.cost import latency, measure, saved_bytes
from autosearch.training.train import evaluate, train
from search_spaces import DenseNetSpace, MobileNetSpace, ResNetSpace

REFERENCES = {
    "resnet20": (ResNetSpace, "resnet20"),
    "mobilenetv2_cifar": (MobileNetSpace, "mobilenetv2_cifar"),
    "densenet_bc_100_k12": (DenseNetSpace, "densenet_bc_100_k12"),
}
VARIANTS = ("prune-l1@0.5", "prune-channels@0.5", "int8", "qat-int8", "distill")


def _latencies(models: dict[str, torch.nn.Module], shape, batch: int, rounds: int) -> dict:
    samples: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            samples[name].append(latency(model, shape, batch=batch, repeats=5, min_seconds=0.05))
    return {name: statistics.median(values) for name, values in samples.items()}


def run(data_name: str, epochs: int, finetune_epochs: int, rounds: int, only: list[str]) -> dict:
    data = load_data(data_name, seed=0)
    config = TrainConfig(epochs=epochs, batch_size=128, lr=0.05)
    compression = Compression(finetune_epochs=finetune_epochs)
    out: dict = {
        "data": data_name,
        "input_shape": list(data.input_shape),
        "epochs": epochs,
        "finetune_epochs": finetune_epochs,
        "cpu": platform.processor() or platform.machine(),
        "vnni": has_vnni(),
        "threads_for_latency": 1,
        "conventions": "MACs per image of conv/linear; latency ms per image, 1 CPU thread",
        "references": {},
    }
    for ref in only:
        space_cls, name = REFERENCES[ref]
        space = space_cls()
        arch = space.reference(name)
        torch.manual_seed(0)
        model = space.build(arch, input_shape=data.input_shape, num_classes=data.num_classes)
        start = time.perf_counter()
        train(model, data, config, seed=0)
        model.eval()
        rows = {
            "base": {
                "val_accuracy": evaluate(model, data.val, data)[0],
                "test_accuracy": evaluate(model, data.test, data)[0],
                "macs": measure(model, data.input_shape).macs,
                "params": measure(model, data.input_shape).params,
                "bytes": saved_bytes(model),
                "seconds": time.perf_counter() - start,
            }
        }
        runnable = {"base": model}
        for variant in VARIANTS:
            start = time.perf_counter()
            try:
                derived = derive(variant, model, data, config, compression=compression, seed=0)
            except Exception as exc:
                rows[variant] = {"failed": f"{type(exc).__name__}: {exc}"}
                continue
            runnable[variant] = derived.model
            rows[variant] = {
                "val_accuracy": evaluate(derived.model, data.val, data)[0],
                "test_accuracy": evaluate(derived.model, data.test, data)[0],
                "macs": measure(derived.float_model, data.input_shape).macs,
                "params": measure(derived.float_model, data.input_shape).params,
                "bytes": derived.saved_bytes or saved_bytes(derived.float_model),
                "seconds": time.perf_counter() - start,
            }
            if variant.endswith("int8"):
                rows[variant]["int8_kernels"] = int8_ops(derived.model)
        for batch, key in ((1, "latency_ms_b1"), (32, "latency_ms_per_image_b32")):
            for variant, ms in _latencies(runnable, data.input_shape, batch, rounds).items():
                rows[variant][key] = ms
        base = rows["base"]
        for variant, row in rows.items():
            if variant == "base" or "failed" in row:
                continue
            row["speedup_b1"] = base["latency_ms_b1"] / row["latency_ms_b1"]
            row["speedup_b32"] = base["latency_ms_per_image_b32"] / row["latency_ms_per_image_b32"]
            row["macs_reduction"] = base["macs"] / row["macs"]
            row["test_accuracy_change_points"] = 100 * (
                row["test_accuracy"] - base["test_accuracy"]
            )
        int8 = rows.get("int8", {})
        pruned = rows.get("prune-channels@0.5", {})
        rows["targets"] = {
            "int8_speedup_b32_at_least_1.5": int8.get("speedup_b32", 0) >= 1.5,
            "int8_loses_at_most_1_point": int8.get("test_accuracy_change_points", -100) >= -1,
            "prune_channels_0.5_at_least_2x_fewer_macs": pruned.get("macs_reduction", 0) >= 2,
        }
        out["references"][ref] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="digits")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--finetune-epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=list(REFERENCES), choices=list(REFERENCES))
    args = parser.parse_args()
    result = run(args.data, args.epochs, args.finetune_epochs, args.rounds, args.only)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
