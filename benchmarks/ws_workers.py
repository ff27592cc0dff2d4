"""Does a weight-sharing search on several workers find as good subnets as one process?

The weight-sharing guide's example (``ws_example.py``): its supernet trained once, then
``optimize(trials)`` by one process, and in a second study on the same weights
(``SupernetConfig(weights=...)``) by ``--workers`` worker processes. Prints JSON: each
search's seconds and what it found (the best validation accuracy on the supernet, the
mean of the ten best, the same within the guide's 2 MFLOPs). The front is not measured
for real in either (that is the same fixed cost for both, and not the search).

    python benchmarks/ws_workers.py [--trials 1000] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# This folder holds controllers.py (a benchmark), which would shadow the `controllers`
# package for any script run from here: take the folder off the path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import autosearch
from autosearch import SupernetConfig, TrainConfig
from autosearch.study.measure import FrontMeasurer
from controllers import RegularizedEvolution
from search_spaces import ResNetSpace

MAX_FLOPS = 2e6  # the guide's budget: study.best(max_flops=2e6)


def _study(name: str, root: Path, weights: Path | None = None) -> autosearch.Study:
    space = ResNetSpace(max_stages=3, depths=(1, 2, 3), widths=(8, 16, 24, 32)).supernet(
        fixed={"stages": 3, "block": "basic"}
    )
    return autosearch.create_study(
        name,
        controller=RegularizedEvolution(space, seed=0),
        data="digits",
        supernet=SupernetConfig(
            train=TrainConfig(epochs=30, device="cpu"),
            sandwich=2,
            weights=str(weights) if weights else None,
        ),
        variants=("base", "int8"),
        storage=f"sqlite:///{root}/{name}.db",
    )


def _found(study: autosearch.Study) -> dict[str, Any]:
    records = [r for r in study.records(variants=False) if r.state == "complete"]
    ranked = sorted((r.metrics["accuracy"] for r in records), reverse=True)
    within = sorted(
        (r.metrics["accuracy"] for r in records if r.metrics["flops"] <= MAX_FLOPS), reverse=True
    )
    return {
        "subnets": len(records),
        "distinct": len({r.arch.arch_id for r in records}),
        "best": ranked[0],
        "ten_best_mean": sum(ranked[:10]) / len(ranked[:10]),
        "best_within_budget": within[0] if within else None,
        "ten_best_within_budget_mean": sum(within[:10]) / len(within[:10]) if within else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.trials < 1 or args.workers < 2:
        parser.error("--trials: 1 or more; --workers: 2 or more (one process is the baseline)")
    FrontMeasurer.measure = lambda self, points: None  # type: ignore[method-assign]
    out: dict[str, Any] = {"trials": args.trials, "workers": args.workers}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["AUTOSEARCH_LATENCY_TABLES"] = str(root / "latency")  # a new table
        one = _study("one", root)
        one.train_supernet(show_progress_bar=False)
        weights = one.save_supernet(root / "supernet.safetensors")
        start = time.perf_counter()
        one.optimize(args.trials, show_progress_bar=False)
        out["one_process"] = {"seconds": round(time.perf_counter() - start, 1), **_found(one)}
        pool = _study("pool", root, weights)
        pool.train_supernet(show_progress_bar=False)  # loads the same weights
        start = time.perf_counter()
        pool.optimize(args.trials, show_progress_bar=False, n_workers=args.workers)
        out["workers"] = {"seconds": round(time.perf_counter() - start, 1), **_found(pool)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
