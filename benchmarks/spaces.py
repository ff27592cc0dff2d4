"""Search-space benchmark: budget-check speed and the reference architectures' figures.

Prints JSON. For each space: the mean time to cost one sampled architecture with the
space's analytic model (what budgets use) and, as the baseline measured in the same
run, by building the network on the meta device and counting with FlopCounterMode;
and each reference's parameters and MACs (conv/linear multiply-accumulates).

    python benchmarks/spaces.py [--samples 50]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from autosearch.scoring.cost import measure
from search_spaces import DenseNetSpace, MobileNetSpace, NB201Space, ResNetSpace

SPACES = {
    "resnet": ResNetSpace,
    "densenet": DenseNetSpace,
    "mobilenet": MobileNetSpace,
    "nb201": NB201Space,
}
REFERENCE_INPUT = {
    "resnet18": 224,
    "resnet34": 224,
    "resnet50": 224,
    "densenet121": 224,
    "mobilenetv2": 224,
}


def _meta_count(space, arch, shape, classes):  # the generic path budgets would otherwise take
    spec = space.network(arch, input_shape=shape, num_classes=classes)
    with torch.device("meta"):
        model = spec.build()
    return measure(model, shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    shape, classes = (3, 32, 32), 10
    results: dict[str, object] = {"input": list(shape), "samples": args.samples, "spaces": {}}
    for name, cls in SPACES.items():
        space = cls()
        rng = np.random.default_rng(0)
        archs = [space.sample(rng) for _ in range(args.samples)]
        analytic, meta = [], []
        for arch in archs:  # interleaved, so machine noise hits both alike
            start = time.perf_counter()
            space.cost_model(arch, shape, classes)
            analytic.append(time.perf_counter() - start)
            start = time.perf_counter()
            _meta_count(space, arch, shape, classes)
            meta.append(time.perf_counter() - start)
        references = {}
        for ref in space.references():
            size = REFERENCE_INPUT.get(ref, 32)
            ref_classes = 1000 if size == 224 else 10
            cost = space.cost(
                space.reference(ref), input_shape=(3, size, size), num_classes=ref_classes
            )
            references[ref] = {
                "input": size,
                "classes": ref_classes,
                "params": cost.params,
                "macs": cost.macs,
            }
        results["spaces"][name] = {  # type: ignore[index]
            "analytic_ms_mean": 1e3 * float(np.mean(analytic)),
            "analytic_ms_max": 1e3 * float(np.max(analytic)),
            "meta_build_ms_mean": 1e3 * float(np.mean(meta)),
            "speedup": float(np.mean(meta) / np.mean(analytic)),
            "references": references,
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
