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
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import autosearch
from autosearch.study.measure import FrontMeasurer

MAX_FLOPS = 2e6  # the guide's budget: study.best(max_flops=2e6)

# The guide's study as ws_example.py makes it (loaded from its file: this folder is not a
# package).
_spec = importlib.util.spec_from_file_location(
    "ws_example", Path(__file__).with_name("ws_example.py")
)
assert _spec is not None and _spec.loader is not None
ws_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ws_example)


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
        one = ws_example.study(root, "cpu", name="one")
        one.supernet.train(show_progress_bar=False)
        weights = one.supernet.save(root / "supernet.safetensors")
        start = time.perf_counter()
        one.optimize(args.trials, show_progress_bar=False)
        out["one_process"] = {"seconds": round(time.perf_counter() - start, 1), **_found(one)}
        pool = ws_example.study(root, "cpu", name="pool", weights=weights)
        pool.supernet.train(show_progress_bar=False)  # loads the same weights
        start = time.perf_counter()
        pool.optimize(args.trials, show_progress_bar=False, n_workers=args.workers)
        out["workers"] = {"seconds": round(time.perf_counter() - start, 1), **_found(pool)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
