"""The ``autosearch`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
import torch.distributed as dist
from tqdm import tqdm

from autosearch.data import load_data
from autosearch.errors import AutosearchError, StudyError
from autosearch.registry import controllers, spaces
from autosearch.report import write_report
from autosearch.runtime import init_distributed, world
from autosearch.scoring import objective
from autosearch.study import Record, Study, Table, create_study, default_storage, load_study
from autosearch.studyfile import load_spec
from autosearch.train import EpochResult, TrainConfig

__all__ = ["main"]


def _table(records: Sequence[Record]) -> str:
    """A plain-text table; FLOPs are 2 × MACs per image, latency ms per image at batch 1
    on one CPU thread, bytes of the saved weights."""
    nan = float("nan")
    rows = [
        (
            "trial",
            "architecture",
            "variant",
            "val acc",
            "test acc",
            "MFLOPs",
            "k params",
            "latency ms",
            "kB",
        )
    ]
    for r in records:
        m = r.metrics
        rows.append(
            (
                str(r.trial),
                r.description,
                r.variant,
                f"{m['accuracy']:.4f}",
                f"{m.get('test_accuracy', nan):.4f}",
                f"{m['flops'] / 1e6:.3f}",
                f"{m['params'] / 1e3:.1f}",
                f"{m.get('latency', nan):.3f}",
                f"{m.get('bytes', nan) / 1e3:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 1 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


def _open(args: argparse.Namespace) -> Study:
    """The study named by a study file or by --study (and --storage)."""
    if args.study_file:
        spec = load_spec(args.study_file)
        return load_study(
            spec.name, storage=args.storage or spec.storage or default_storage(spec.name)
        )
    if not args.study:
        raise StudyError("name the study: a study file (studies/digits_quick.py) or --study NAME")
    return load_study(args.study, storage=args.storage or default_storage(args.study))


def _out_dir(args: argparse.Namespace, study: Study) -> Path:
    return Path(args.out) if args.out else Path("runs") / study.name


def _run_to_budget(study: Study, total: int, out: Path) -> int:
    """Run the study until ``total`` trials have finished; write the report and export."""
    finished = study.count("complete", "failed")
    remaining = max(total - finished, 0)
    print(
        f"study {study.name}: {finished} of {total} trials done, running {remaining} "
        f"({study.storage_url})"
    )
    epochs = study.train_config.epochs
    with (
        tqdm(total=remaining, unit="trial", disable=not remaining, position=0) as bar,
        tqdm(total=epochs, unit="epoch", disable=not remaining, position=1, leave=False) as inner,
    ):

        def progress(_: Study, record: Record) -> None:
            acc = record.metrics.get("accuracy")
            bar.set_postfix_str(f"last {record.state}" + (f" acc {acc:.3f}" if acc else ""))
            bar.update()
            inner.reset()

        def epoch_progress(trial: int, epoch: EpochResult) -> None:
            inner.set_description(f"trial {trial}")
            inner.set_postfix_str(f"val {epoch.val_accuracy:.3f}")
            inner.update()

        study.optimize(remaining, callbacks=[progress], epoch_callbacks=[epoch_progress])
    report = write_report(study, out / "report.html")
    best = study.best()
    print("\nPareto front (validation accuracy against FLOPs = 2 x MACs per image):")
    print(_table(study.pareto()))
    test = best.metrics.get("test_accuracy")
    print(
        f"\nbest: trial {best.trial}, {best.description}: val {best.metrics['accuracy']:.4f}"
        + (f", test {test:.4f}" if test is not None else "")
    )
    print(f"storage: {study.storage_url}\nreport:  {report}")
    if study.table is None:
        print(f"export:  {study.export(best, out / 'best')}/")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        return _relaunch_under_torchrun(args)
    spec = load_spec(args.study_file)
    if not init_distributed():
        study = spec.create(storage=args.storage)
        total = args.n_trials if args.n_trials is not None else spec.n_trials
        return _run_to_budget(study, total, _out_dir(args, study))
    # Under torchrun: rank 0 creates (or opens) the study before the others open it.
    rank, _ = world()
    try:
        if rank == 0:
            study = spec.create(storage=args.storage)
        dist.barrier()
        if rank != 0:
            study = load_study(
                spec.name, storage=args.storage or spec.storage or default_storage(spec.name)
            )
            study.optimize(0)  # follow rank 0 until it has finished
            return 0
        total = args.n_trials if args.n_trials is not None else spec.n_trials
        return _run_to_budget(study, total, _out_dir(args, study))
    finally:
        dist.destroy_process_group()


def _relaunch_under_torchrun(args: argparse.Namespace) -> int:
    """``autosearch run --nproc-per-node N``: the same command, N processes, via torchrun."""
    forwarded = [args.study_file]
    for flag, value in (
        ("--n-trials", args.n_trials),
        ("--storage", args.storage),
        ("--out", args.out),
    ):
        if value is not None:
            forwarded += [flag, str(value)]
    return _torchrun(args.nproc_per_node, ["run", *forwarded])


def cmd_search(args: argparse.Namespace) -> int:
    budget = {
        k: v
        for k, v in (("max_flops", args.max_flops), ("max_params", args.max_params))
        if v is not None
    }
    space = spaces.get(args.space)(**budget)
    objectives = tuple(args.objectives.split(","))
    controller_cls = controllers.get(args.controller)
    options: dict[str, object] = {"seed": args.seed}
    if getattr(controller_cls, "multi_objective", False):  # NSGA-II: the study's objectives
        options["objectives"] = {o: objective(o).direction for o in objectives}
    controller = controller_cls(space, **options)
    table = Table(path=args.table) if args.table else None
    study = create_study(
        args.name,
        controller=controller,
        data=args.data,
        objectives=objectives,
        reward=args.reward,
        variants=tuple(v for v in args.variants.split(",") if v),
        train=TrainConfig(epochs=args.epochs),
        storage=args.storage,
        seed=args.seed,
        table=table,
        load_if_exists=True,
    )
    return _run_to_budget(study, args.n_trials, _out_dir(args, study))


def cmd_status(args: argparse.Namespace) -> int:
    study = _open(args)
    records = study.records(variants=False)
    counts = {s: sum(r.state == s for r in records) for s in ("complete", "failed", "running")}
    if args.json:
        print(
            json.dumps(
                {
                    "study": study.name,
                    "storage": study.storage_url,
                    "space": study.space.name,
                    "controller": study.controller.name,
                    "objectives": list(study.objectives),
                    "trials": counts,
                    "pareto": [
                        {
                            "trial": r.trial,
                            "variant": r.variant,
                            "description": r.description,
                            **r.metrics,
                        }
                        for r in study.pareto()
                    ],
                },
                indent=2,
            )
        )
        return 0
    print(
        f"study {study.name} ({study.storage_url}): space {study.space.name}, controller "
        f"{study.controller.name}, objectives {', '.join(study.objectives)}"
    )
    print(", ".join(f"{n} {s}" for s, n in counts.items()))
    if counts["complete"]:
        print(
            "\nPareto front over every (architecture, variant) (FLOPs = 2 x MACs per "
            "image; latency: ms per image, batch 1, one CPU thread):\n" + _table(study.pareto())
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    study = _open(args)
    path = write_report(
        study, Path(args.out) if args.out else Path("runs") / study.name / "report.html"
    )
    print(json.dumps({"report": str(path), "bytes": path.stat().st_size}) if args.json else path)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    study = _open(args)
    if args.trial is not None:
        record = study.record(args.trial, args.variant or "base")
    else:
        record = study.best(max_flops=args.max_flops, variant=args.variant)
    out = study.export(record, Path(args.out) if args.out else Path("runs") / study.name / "export")
    card = json.loads((out / "arch.json").read_text())
    if args.json:
        print(
            json.dumps(
                {"folder": str(out), "files": sorted(p.name for p in out.iterdir()), **card},
                indent=2,
            )
        )
        return 0
    print(
        f"exported trial {record.trial} ({record.description}), variant {record.variant}, "
        f"to {out}/: {', '.join(sorted(p.name for p in out.iterdir()))}\n"
        f"ONNX checked in onnxruntime: largest |difference| from torch "
        f"{card['onnx']['max_abs_diff']:.2g} on {card['onnx']['checked_images']} images"
    )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train an export folder from scratch with the shared stack."""
    from autosearch.retrain import train_export

    if args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        forwarded = [args.export_dir, "--data", args.data, "--epochs", str(args.epochs)]
        for flag, value in (
            ("--batch-size", args.batch_size),
            ("--lr", args.lr),
            ("--precision", args.precision),
            ("--seed", args.seed),
        ):
            forwarded += [flag, str(value)]
        return _torchrun(args.nproc_per_node, ["train", *forwarded])
    distributed = init_distributed()
    try:
        data = load_data(args.data, seed=args.seed)
        config = TrainConfig(
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            precision=args.precision,
            crop_padding=args.crop_padding,
            flip=args.flip,
        )
        rank, _ = world()
        with tqdm(total=args.epochs, unit="epoch", disable=rank != 0 or args.json) as bar:

            def progress(epoch: EpochResult) -> None:
                bar.set_postfix_str(f"loss {epoch.train_loss:.3f} val {epoch.val_accuracy:.4f}")
                bar.update()

            metrics = train_export(args.export_dir, data, config, seed=args.seed, on_epoch=progress)
        if rank == 0:
            if args.json:
                print(json.dumps(metrics, indent=2))
            else:
                print(
                    f"trained {args.export_dir} for {metrics['epochs']} epochs on {args.data}: "
                    f"val {metrics['val_accuracy']:.4f}, test {metrics['test_accuracy']:.4f} "
                    f"({metrics['seconds']:.1f} s, {metrics['world_size']} process(es), "
                    f"{metrics['precision']})\nweights and metrics: "
                    f"{Path(args.export_dir) / 'full'}/"
                )
        return 0
    finally:
        if distributed:
            dist.destroy_process_group()


def cmd_worker(args: argparse.Namespace) -> int:
    """Join a stored study and run trials until ``--n-trials`` are done (or Ctrl-C)."""
    study = load_study(args.study, storage=args.storage)
    print(f"worker joined study {study.name} ({study.storage_url}); {args.n_trials} trials")
    with tqdm(total=args.n_trials, unit="trial") as bar:
        records = study.optimize(
            args.n_trials,
            callbacks=[lambda _s, _r: bar.update()],
            max_failures_in_a_row=args.max_failures,
        )
    print(f"worker finished {len(records)} trials: {[r.trial for r in records]}")
    return 0


def cmd_rerun(args: argparse.Namespace) -> int:
    """Retrain a stored trial with its seed and compare with what was stored."""
    study = _open(args)
    outcome = study.rerun(args.trial)
    if args.json:
        print(json.dumps(outcome, indent=2))
    else:
        stored, again = outcome["stored"], outcome["rerun"]
        verdict = "reproduced exactly" if outcome["identical"] else "NOT reproduced"
        print(
            f"trial {args.trial} ({outcome['description']}), seed {outcome['seed']}: "
            f"stored val {stored['accuracy']:.6f} test {stored['test_accuracy']:.6f}; "
            f"rerun val {again['accuracy']:.6f} test {again['test_accuracy']:.6f}: {verdict}"
        )
        if outcome["data_hash"]["stored"] != outcome["data_hash"]["now"]:
            print(f"the data differs from the stored data: {outcome['data_hash']}")
        for key, change in outcome["provenance_changed"].items():
            print(f"{key} changed since the trial ran: {change['stored']} -> {change['now']}")
    return 0 if outcome["identical"] else 1


def _torchrun(nproc: int, argv: list[str]) -> int:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    command = [torchrun, "--standalone", f"--nproc-per-node={nproc}", "-m", "autosearch.cli"]
    return subprocess.call([*command, *argv])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autosearch", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log each trial")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a study file until its trial budget is spent")
    run.add_argument("study_file")
    run.add_argument("--n-trials", type=int, help="total trials (default: the file's n_trials)")
    run.add_argument(
        "--storage", help="storage URL (default: the file's, or sqlite:///runs/NAME/study.db)"
    )
    run.add_argument("--out", help="folder for report.html and best/ (default runs/NAME)")
    run.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        help="train each trial with N DDP processes (torchrun; gloo on CPU)",
    )
    run.set_defaults(func=cmd_run)

    search = sub.add_parser("search", help="search a registered space with a registered controller")
    search.add_argument("name", help="study name")
    search.add_argument("--space", required=True, help=f"one of: {', '.join(spaces.names())}")
    search.add_argument(
        "--controller", default="random", help=f"one of: {', '.join(controllers.names())}"
    )
    search.add_argument("--n-trials", type=int, default=10, help="total trials")
    search.add_argument("--data", default="digits", help="dataset (default digits)")
    search.add_argument("--epochs", type=int, default=10, help="training epochs per trial")
    search.add_argument("--table", help="evaluate by looking up this benchmark table (CSV/JSON)")
    search.add_argument("--objectives", default="accuracy,flops", help="comma-separated")
    search.add_argument(
        "--variants",
        default="base",
        help="comma-separated variants measured per candidate, e.g. base,prune-channels@0.5,int8",
    )
    search.add_argument(
        "--reward", default="mnas", help="mnas (default), mnas@flops=5e6, hard@macs=2e6, accuracy"
    )
    search.add_argument("--max-flops", type=float, help="budget: FLOPs (2 x MACs) at 3x32x32")
    search.add_argument("--max-params", type=float, help="budget: parameters")
    search.add_argument("--seed", type=int, default=0)
    search.add_argument("--storage", help="storage URL (default sqlite:///runs/NAME/study.db)")
    search.add_argument("--out", help="folder for report.html and best/ (default runs/NAME)")
    search.set_defaults(func=cmd_search)

    def reading(
        name: str, help: str, func: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("study_file", nargs="?", help="a study file naming the study")
        p.add_argument("--study", help="study name (instead of a study file)")
        p.add_argument("--storage", help="storage URL (default sqlite:///runs/NAME/study.db)")
        p.set_defaults(func=func)
        return p

    reading("status", "trial counts and the Pareto front", cmd_status).add_argument(
        "--json", action="store_true", help="machine-readable output"
    )
    report = reading("report", "write the HTML report (works offline)", cmd_report)
    report.add_argument("--out", help="HTML path (default runs/NAME/report.html)")
    report.add_argument("--json", action="store_true", help="machine-readable output")
    export = reading("export", "export a trained architecture (model.py + weights)", cmd_export)
    which = export.add_mutually_exclusive_group()
    which.add_argument("--trial", type=int, help="trial number")
    which.add_argument("--best", action="store_true", help="the most accurate trial (default)")
    export.add_argument("--max-flops", type=float, help="with --best: FLOPs budget (2 x MACs)")
    export.add_argument(
        "--variant",
        help="a measured variant (base, int8, prune-channels@0.5, ...; default base), "
        "derived again from the trial's weights",
    )
    export.add_argument("--out", help="export folder (default runs/NAME/export)")
    export.add_argument("--json", action="store_true", help="machine-readable output")

    rerun = reading(
        "rerun", "retrain a trial with its seed; compare with the stored result", cmd_rerun
    )
    rerun.add_argument("--trial", type=int, required=True, help="trial number")
    rerun.add_argument("--json", action="store_true", help="machine-readable output")

    worker = sub.add_parser("worker", help="join a stored study from any machine and run trials")
    worker.add_argument("--study", required=True, help="study name")
    worker.add_argument("--storage", required=True, help="storage URL the study lives in")
    worker.add_argument("--n-trials", type=int, default=10, help="trials this worker runs")
    worker.add_argument(
        "--max-failures", type=int, default=10, help="stop after this many failures in a row"
    )
    worker.set_defaults(func=cmd_worker)

    full = sub.add_parser("train", help="train an export folder from scratch, in full")
    full.add_argument("export_dir", help="a folder written by `autosearch export`")
    full.add_argument("--data", default="digits", help="dataset spec (default digits)")
    full.add_argument("--epochs", type=int, default=30)
    full.add_argument("--batch-size", type=int, default=128)
    full.add_argument("--lr", type=float, default=0.05)
    full.add_argument("--precision", default="auto", help="auto, fp32, bf16 or fp16")
    full.add_argument("--crop-padding", type=int, default=0, help="random-crop padding (0: off)")
    full.add_argument("--flip", action="store_true", help="random horizontal flips")
    full.add_argument("--seed", type=int, default=0)
    full.add_argument(
        "--nproc-per-node", type=int, default=1, help="train with N processes (torchrun, DDP)"
    )
    full.add_argument("--json", action="store_true", help="print the metrics as JSON")
    full.set_defaults(func=cmd_train)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    optuna.logging.set_verbosity(optuna.logging.INFO if args.verbose else optuna.logging.WARNING)
    try:
        return int(args.func(args))
    except AutosearchError as exc:
        print(f"autosearch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
