"""Scale-out benchmark. Prints JSON; every ratio is measured within this run.

1. workers: trials per hour of one study run by 1 worker (all CPU threads), by 1 worker
   with one thread, and by 2 worker processes (half the threads each), same space,
   data, epochs and trial count (target: 2 workers >= 1.8x one worker). Worker
   start-up (imports, data loading) is included. On a 2-core machine the cores, not
   the workers, bound the first ratio; the one-thread baseline shows how the workers
   themselves scale.
2. storage: overhead per trial of the study machinery on each storage (SQLite, journal
   file, PostgreSQL when reachable): asking, claiming, heartbeats, storing the result,
   controller state, with an evaluator that trains nothing.
3. duplicates: superseded (duplicate) claims in 10 runs of optimize(8, n_workers=4) on
   the tests' tiny space (target: at most 1 in all 10 runs).
4. ray: the same small study run by 2 local worker processes, by 2 Ray tasks on a
   one-node Ray cluster (2 CPUs) and on a two-node cluster (1 CPU each; both nodes on
   this machine, 127.0.0.1): wall seconds, trials per hour and the overhead of Ray's
   placement against the local pool (cluster start-up excluded).
5. growth: ms per trial in chunks of 100 over a long study that trains nothing (NB201
   cells), against bare Optuna's RandomSampler storing the same per trial on the same
   kind of storage (target: flat, the last chunk within 1.2x the first, and at most 2x
   bare Optuna).

    python benchmarks/scaleout.py [--trials 12] [--epochs 4] [--only duplicates]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import optuna
import torch

import autosearch
from autosearch import TrainConfig
from autosearch.evaluation.runner import TrialPlan, TrialResult, VariantResult
from autosearch.storage._urls import open_storage
from autosearch.study import loop
from controllers import RandomSearch
from search_spaces import NB201Space, ResNetSpace

SPACE = ResNetSpace(
    min_stages=2, max_stages=2, depths=(1, 2), widths=(16, 32), stem_widths=(16,), blocks=("basic",)
)
# The tests' tiny space: few enough architectures that parallel workers drawing the
# same one at once is a real risk.
TINY = ResNetSpace(
    min_stages=2, max_stages=2, depths=(1, 2), widths=(4, 8), stem_widths=(4, 8), blocks=("basic",)
)
PG = "postgresql://postgres@127.0.0.1:5432"


def bench_workers(trials: int, epochs: int) -> dict[str, float]:
    runs = {}
    cpus = os.cpu_count() or 1
    for workers, threads in ((1, cpus), (1, 1), (2, cpus)):
        with tempfile.TemporaryDirectory() as tmp:
            study = autosearch.create_study(
                f"w{workers}",
                controller=RandomSearch(SPACE, seed=0),
                storage=f"sqlite:///{tmp}/s.db",
                train=TrainConfig(epochs=epochs, batch_size=64, lr=0.05),
            )
            torch.set_num_threads(threads)
            start = time.perf_counter()
            records = study.optimize(trials, n_workers=workers)
            seconds = time.perf_counter() - start
            assert len(records) == trials and study.trials.count("complete") == trials
            # From the first trial's start to the last one's end: without process start-up,
            # which a long search amortises.
            stamps = [
                t for t in study.optuna_study.get_trials(deepcopy=False) if t.datetime_complete
            ]
            span = max(t.datetime_complete for t in stamps) - min(t.datetime_start for t in stamps)
            runs[(workers, threads)] = {
                "seconds": seconds,
                "trials_per_hour": trials / seconds * 3600,
                "steady_trials_per_hour": trials / span.total_seconds() * 3600,
                "mean_accuracy": sum(r.metrics["accuracy"] for r in records) / trials,
            }
    torch.set_num_threads(cpus)
    one, single, two = runs[(1, cpus)], runs[(1, 1)], runs[(2, cpus)]
    return {
        "trials": trials,
        "epochs": epochs,
        f"one_worker_{cpus}_threads": one,
        "one_worker_1_thread": single,
        f"two_workers_{max(1, cpus // 2)}_thread_each": two,
        "speedup": two["trials_per_hour"] / one["trials_per_hour"],
        "speedup_vs_one_thread": two["trials_per_hour"] / single["trials_per_hour"],
        "steady_speedup": two["steady_trials_per_hour"] / one["steady_trials_per_hour"],
        "steady_speedup_vs_one_thread": two["steady_trials_per_hour"]
        / single["steady_trials_per_hour"],
    }


@contextlib.contextmanager
def _no_training(metrics: dict[str, float]) -> Iterator[None]:
    """Trials that train nothing: the study's own machinery (claim, store, tell) alone."""

    def evaluate(plan: TrialPlan, data: object, context: object = None) -> TrialResult:
        point = VariantResult(name="base", metrics={**metrics, "reward": plan.reward(metrics)})
        return TrialResult(status="complete", points=(point,))

    real = loop.run_trial
    loop.run_trial = evaluate  # type: ignore[assignment]
    try:
        yield
    finally:
        loop.run_trial = real


def bench_duplicates(runs: int, trials: int, workers: int) -> dict[str, object]:
    """How often parallel workers claim an architecture another worker holds (the later
    claim is superseded as a duplicate): ``runs`` studies of ``trials`` trials on
    ``workers`` processes, each worker's controller on its own random stream."""
    superseded = []
    for run in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            study = autosearch.create_study(
                f"dup{run}",
                controller=RandomSearch(TINY, seed=run),
                storage=f"sqlite:///{tmp}/s.db",
                artifacts=f"{tmp}/artifacts",
                train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
            )
            records = study.optimize(trials, n_workers=workers)
            assert len(records) == trials and study.trials.count("complete") == trials
            trials_all = study.optuna_study.get_trials(deepcopy=False)
            superseded.append(sum("superseded" in t.user_attrs for t in trials_all))
    return {
        "runs": runs,
        "trials": trials,
        "workers": workers,
        "space_size": TINY.size(),
        "superseded_per_run": superseded,
        "superseded_total": sum(superseded),
    }


def _postgres() -> tuple[str, str] | None:
    try:
        import psycopg

        admin = psycopg.connect(f"{PG}/test", autocommit=True, connect_timeout=5)
    except Exception:
        return None
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin.execute(f"CREATE DATABASE {name}")
    admin.close()
    return f"{PG}/{name}", name


def _drop(name: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG}/test", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def bench_storage(trials: int) -> dict[str, dict[str, float]]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        urls = {"sqlite": f"sqlite:///{tmp}/s.db", "journal": f"journal:{tmp}/s.log"}
        pg = _postgres()
        if pg:
            urls["postgresql"] = pg[0]
        for kind, url in urls.items():
            study = autosearch.create_study(
                f"overhead-{kind}",
                controller=RandomSearch(SPACE, seed=0),
                storage=url,
                train=TrainConfig(epochs=1),
            )
            start = time.perf_counter()
            with _no_training({"accuracy": 0.5, "flops": 1e6, "macs": 5e5, "params": 1e4}):
                study.optimize(trials)
            seconds = time.perf_counter() - start
            out[kind] = {"trials": trials, "ms_per_trial": 1000 * seconds / trials}
        if pg:
            _drop(pg[1])
        else:
            out["postgresql"] = {"skipped": "no server on 127.0.0.1:5432"}  # type: ignore[dict-item]
    return out


def _ray_cluster(nodes: int, cpus: int) -> tuple[str, list[str]]:
    """Start a Ray cluster of ``nodes`` nodes on 127.0.0.1; its address and ray CLI."""
    import socket
    import subprocess

    ray = str(Path(sys.executable).with_name("ray"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus), "--disable-usage-stats"]
    head = [ray, "start", "--head", "--port", str(port), "--include-dashboard", "false"]
    subprocess.run([*head, *common], check=True, capture_output=True)
    for _ in range(nodes - 1):
        subprocess.run(
            [ray, "start", "--address", f"127.0.0.1:{port}", *common],
            check=True,
            capture_output=True,
        )
    return f"127.0.0.1:{port}", [ray, "stop", "--force"]


def bench_ray(trials: int, epochs: int) -> dict[str, object]:
    """Local pool against Ray tasks on one and two nodes, same study."""
    import subprocess

    import ray

    from autosearch import RayExecutor

    runs: dict[str, dict[str, float]] = {}
    cpus = os.cpu_count() or 1
    for label, nodes in (("process_pool", 0), ("ray_1_node", 1), ("ray_2_nodes", 2)):
        stop: list[str] = []
        executor: object = "process"
        if nodes:
            address, stop = _ray_cluster(nodes, cpus // nodes)
            executor = RayExecutor(
                address=address, num_cpus=cpus // 2, init={"_node_ip_address": "127.0.0.1"}
            )
        try:
            with tempfile.TemporaryDirectory() as tmp:
                study = autosearch.create_study(
                    label,
                    controller=RandomSearch(SPACE, seed=0),
                    storage=f"sqlite:///{tmp}/s.db",
                    artifacts=f"{tmp}/artifacts",
                    train=TrainConfig(epochs=epochs, batch_size=64, lr=0.05),
                )
                start = time.perf_counter()
                records = study.optimize(trials, n_workers=2, executor=executor)  # type: ignore[arg-type]
                seconds = time.perf_counter() - start
                assert len(records) == trials and study.trials.count("complete") == trials
                runs[label] = {
                    "seconds": round(seconds, 2),
                    "trials_per_hour": round(trials / seconds * 3600),
                }
        finally:
            if nodes:
                ray.shutdown()
                subprocess.run(stop, capture_output=True)
    base = runs["process_pool"]["seconds"]
    return {
        "trials": trials,
        "epochs": epochs,
        **runs,
        "ray_1_node_vs_pool": round(runs["ray_1_node"]["seconds"] / base, 2),
        "ray_2_nodes_vs_pool": round(runs["ray_2_nodes"]["seconds"] / base, 2),
    }


def _bare_optuna(url: str) -> Callable[[int], None]:
    """Optuna alone: RandomSampler over the six NB201 edges, one user attribute per
    trial (as autosearch stores its result), two objective values."""
    space = NB201Space()
    study = optuna.create_study(
        study_name="bare",
        storage=open_storage(url),  # Optuna's own storage for the URL, as autosearch opens it
        directions=["maximize", "minimize"],
        sampler=optuna.samplers.RandomSampler(seed=0),
    )

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        for gene, domain in space.domains().items():
            trial.suggest_categorical(gene, list(domain.choices))  # type: ignore[attr-defined]
        trial.set_user_attr("result", {"accuracy": 0.5, "flops": 1e6})
        return 0.5, 1e6

    return lambda n: study.optimize(objective, n)


def _autosearch(url: str) -> Callable[[int], None]:
    study = autosearch.create_study(
        "growth", controller=RandomSearch(NB201Space(), seed=0), storage=url
    )

    def run(n: int) -> None:
        with _no_training({"accuracy": 0.5, "flops": 1e6, "macs": 5e5, "params": 1e4}):
            study.optimize(n)

    return run


def bench_growth(
    trials: int, chunk: int = 100, kinds: Sequence[str] = ("sqlite", "journal", "postgresql")
) -> dict[str, object]:
    """Does a trial cost more as the study grows? Per storage, ms per trial by chunk:
    bare Optuna's study and autosearch's grow side by side, a chunk of each in turn, so
    that the machine's drift falls on both alike."""
    out: dict[str, object] = {"trials": trials, "chunk": chunk}
    for kind in kinds:
        with tempfile.TemporaryDirectory() as tmp:
            pg = _postgres() if kind == "postgresql" else None
            if kind == "postgresql" and pg is None:
                out[kind] = {"skipped": "no server on 127.0.0.1:5432"}
                continue
            files = {"sqlite": "sqlite:///{}/{}.db", "journal": "journal:{}/{}.log"}
            urls = {  # one PostgreSQL database holds both studies
                who: pg[0] if pg else files[kind].format(tmp, who)
                for who in ("optuna", "autosearch")
            }
            runs = {
                "optuna": _bare_optuna(urls["optuna"]),
                "autosearch": _autosearch(urls["autosearch"]),
            }
            row: dict[str, list[float]] = {who: [] for who in runs}
            for _ in range(trials // chunk):
                for who, run in runs.items():
                    start = time.perf_counter()
                    run(chunk)
                    row[who].append(round(1000 * (time.perf_counter() - start) / chunk, 1))
            if pg:
                _drop(pg[1])
        ours, bare = row["autosearch"], row["optuna"]
        med = statistics.median
        out[kind] = {
            **row,
            "last_over_first": round(ours[-1] / ours[0], 2),
            # medians of three chunks at each end: one noisy chunk does not decide
            "last3_over_first3": round(med(ours[-3:]) / med(ours[:3]), 2),
            "vs_optuna_last_chunk": round(ours[-1] / bare[-1], 2),
            "vs_optuna_last3": round(med(ours[-3:]) / med(bare[-3:]), 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--storage-trials", type=int, default=60)
    parser.add_argument("--duplicate-runs", type=int, default=10)
    parser.add_argument("--growth-trials", type=int, default=2000)
    parser.add_argument("--growth-storages", nargs="*", default=["sqlite", "journal", "postgresql"])
    parser.add_argument(
        "--only", nargs="*", choices=["workers", "storage", "duplicates", "ray", "growth"]
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("autosearch").setLevel(logging.ERROR)
    chosen = args.only or ["workers", "storage", "duplicates", "ray", "growth"]
    result: dict[str, object] = {"device": "cpu", "cpus": os.cpu_count()}
    if "workers" in chosen:
        result["workers"] = bench_workers(args.trials, args.epochs)
    if "storage" in chosen:
        result["storage"] = bench_storage(args.storage_trials)
    if "duplicates" in chosen:
        result["duplicates"] = bench_duplicates(args.duplicate_runs, trials=8, workers=4)
    if "ray" in chosen:
        result["ray"] = bench_ray(args.trials, args.epochs)
    if "growth" in chosen:
        result["growth"] = bench_growth(args.growth_trials, kinds=args.growth_storages)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
