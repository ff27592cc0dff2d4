"""What each ``autosearch`` command does (the options are in autosearch.cli.parser).

Commands print tables and lines for people (``--json`` for programs); errors are raised
as AutosearchError, which ``main`` prints in one line with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
from tqdm import tqdm

from autosearch.cli.reading import table
from autosearch.data import load_data
from autosearch.errors import ConfigError, ExportError, StorageError, StudyError
from autosearch.evaluation.trial import Interrupted
from autosearch.registry import controllers, spaces
from autosearch.report import write_report
from autosearch.scoring import objective
from autosearch.study import (
    ProcessExecutor,
    RayExecutor,
    Study,
    Table,
    create_study,
    default_storage,
    load_study,
)
from autosearch.study.study import join_as_worker
from autosearch.studyfile import load_spec
from autosearch.training.runtime import init_distributed, leave_distributed, world
from autosearch.training.train import EpochResult, TrainConfig
from autosearch.workers._heartbeat import worker_id
from autosearch.workers.executors import Executor

__all__ = ["cmd_run", "cmd_search", "cmd_supernet", "cmd_train", "cmd_worker"]


@contextlib.contextmanager
def _out_dir(args: argparse.Namespace, name: str) -> Iterator[Path]:
    """Where the report and the export go; refused before any training if not writable.
    The folders it makes are removed again (while empty) when the command fails, so a
    bad name given with it leaves nothing behind."""
    out = Path(args.out) if args.out else Path("runs") / name
    missing = [p for p in (out, *out.parents) if not p.exists()]  # deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as exc:
        raise ExportError(
            f"cannot write the report and export to {out} ({exc.strerror or exc}); choose "
            "a writable folder with --out"
        ) from None
    try:
        yield out
    except BaseException:
        for folder in missing:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only while empty
        raise


def _run_to_budget(
    study: Study,
    total: int,
    out: Path,
    *,
    show_progress_bar: bool | None = None,
    args: argparse.Namespace | None = None,
    confirm: int = 0,
    export: bool = True,
) -> int:
    """Run the study to ``total`` finished trials (workers and executor as ``args`` say),
    confirm the top ``confirm`` of a supernet's front; write the report, export the best."""
    finished = study.trials.count("complete", "failed")
    remaining = max(total - finished, 0)
    print(
        f"study {study.name}: {finished} of {total} trials done, running {remaining} "
        f"({study.storage_url})"
    )
    interrupted, workers = None, getattr(args, "workers", 1) or 1
    try:
        study.optimize(
            remaining,
            show_progress_bar=show_progress_bar,
            n_workers=min(workers, remaining) if remaining else 1,
            executor=_executor(args),
            total=total,  # other workers of the study count: it is run to its total
        )
        interrupted = study.interrupted
        if confirm and not interrupted and study.trials.count("complete"):
            interrupted = _confirm(study, confirm)
    except KeyboardInterrupt as exc:  # StopNow names SIGTERM where that stopped it
        interrupted = getattr(exc, "signal", "SIGINT")
    report = write_report(study, out / "report.html")
    done = study.trials.count("complete", "failed")
    if interrupted:
        print(
            f"\ninterrupted ({interrupted}) after {done} of {total} trials; report so far: "
            f"{report}. Run the same command again to go on: a cut trial resumes from its "
            "last checkpoint"
        )
        return 128 + signal.Signals[interrupted].value  # as a shell reports the signal
    if not study.trials.count("complete"):
        return _nothing_complete(study, done, report)
    # Also where nothing ran now: figures lost are measured again.
    front = study.pareto(measured=True)
    best = study.best()
    print("\nPareto front (validation accuracy against FLOPs = 2 x MACs per image):")
    print(table(front))
    test = "" if best.test_accuracy is None else f", test {best.test_accuracy:.4f}"
    print(f"\nbest: trial {best.trial}, {best.description}: val {best.accuracy:.4f}{test}")
    print(f"storage: {study.storage_url}\nreport:  {report}")
    if study.definition.table is None and export:
        print(f"export:  {study.export(best, out / 'best')}/")
    elif study.definition.table is None:
        print(
            f"export:  not written (--no-export); `autosearch export --study {study.name} "
            f"--storage {study.storage_url}` writes it"
        )
    return 0


def _nothing_complete(study: Study, done: int, report: Path) -> int:
    """Exit status 1, saying why no trial is complete and what to do."""
    failed = [r for r in study.records(variants=False) if r.state == "failed"]
    if failed:
        print(
            f"all {len(failed)} trials failed; the last said: {failed[-1].reason}\nreport: "
            f"{report}. Fix the setup (data, training config, budget) before running more; "
            "`autosearch status` lists every reason"
        )
    else:
        print(
            f"no complete trial yet; report: {report}. Run trials with "
            f"`autosearch run FILE --n-trials N` (N > {done})"
        )
    return 1


def _executor(args: argparse.Namespace | None) -> str | Executor:
    """``--executor``, with ``--ray-address`` for Ray and ``--per-gpu`` for the placement
    of workers on GPUs (Ray: the placement rule's GPU fraction, ``num_gpus="auto"``)."""
    name = getattr(args, "executor", None) or "process"
    per_gpu = getattr(args, "per_gpu", None)
    if getattr(args, "ray_address", None) and name != "ray":
        raise ConfigError("--ray-address names a Ray cluster: use it with --executor ray")
    if name == "ray":
        return RayExecutor(
            address=getattr(args, "ray_address", None), num_gpus="auto", per_gpu=per_gpu
        )
    if name == "process":
        return ProcessExecutor(per_gpu=per_gpu)
    if per_gpu is not None:
        raise ConfigError(
            f"--per-gpu places workers on GPUs of this machine or a Ray cluster; with "
            f"--executor {name} each job gets the GPUs of its task (drop --per-gpu)"
        )
    return str(name)


def _confirm(study: Study, k: int) -> str | None:
    """Train the top ``k`` subnets of the supernet's front (fewer where it is smaller) and
    show them; what interrupted it, if anything."""
    from autosearch.cli.confirm import confirmations_table
    from autosearch.weight_sharing.confirm import candidates

    assert study.supernet is not None  # asked of weight-sharing studies only
    k = min(k, len(candidates(study.records(), study.definition.objectives)))
    done = study.supernet.confirm(k)
    wanted = {r.confirms for r in done}
    rows = [c for c in study.supernet.confirmations() if c.trial in wanted]
    print(
        f"\nconfirmed by training from scratch (validation accuracy):\n{confirmations_table(rows)}"
    )
    return study.interrupted


def cmd_run(args: argparse.Namespace) -> int:
    _executor(args)  # a bad combination is refused before anything is created
    spec = load_spec(args.study_file)
    if args.nproc_per_node > 1 and spec.confirm:
        raise ConfigError(
            f"StudySpec(confirm={spec.confirm}) is not run under --nproc-per-node; run "
            f"without it, or `autosearch confirm {args.study_file} -k {spec.confirm}` after"
        )
    if args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        return _torchrun(args.nproc_per_node, args.argv)
    url = args.storage or spec.storage or default_storage(spec.name)
    total = args.n_trials if args.n_trials is not None else spec.n_trials
    if not total:  # nothing to run: report on the stored study, create none
        try:
            study = load_study(spec.name, storage=url, read_only=True)
        except (StorageError, StudyError) as exc:
            found = str(exc).split(";")[0].split(". ")[0]  # what is missing, without advice
            raise StudyError(
                f"n_trials is 0, so `run` only reports on study {spec.name!r}, which has not "
                f"run here ({found}); give {args.study_file} n_trials > 0, or --n-trials N, "
                "to run it"
            ) from None
        with _out_dir(args, spec.name) as out:
            return _run_to_budget(study, 0, out, export=args.export)
    with _out_dir(args, spec.name) as out:
        if not init_distributed(spec.train.device):
            study = spec.create(storage=url, artifacts=args.artifacts, **_tracking(args))
            return _supernet_first(study) or _run_to_budget(
                study, total, out, args=args, confirm=spec.confirm, export=args.export
            )
        # Under torchrun: rank 0 creates (or opens) the study before the others open it.
        rank, _ = world()
        try:
            if rank == 0:
                study = spec.create(storage=url, artifacts=args.artifacts, **_tracking(args))
            dist.barrier()
            if rank != 0:
                study = load_study(spec.name, storage=url)
                code = _supernet_first(study)
                if not code:
                    study.optimize(0)  # follow rank 0 to the end
                return code
            return _supernet_first(study) or _run_to_budget(study, total, out, export=args.export)
        finally:
            leave_distributed()


def _tracking(args: argparse.Namespace) -> dict[str, Any]:
    """``--mlflow`` and ``--tensorboard``, where the command has them."""
    return {k: getattr(args, k, None) for k in ("mlflow", "tensorboard")}


def _supernet_first(study: Study, *, retrain: bool = False, as_json: bool = False) -> int:
    """A study that evaluates on a supernet trains it first (a no-op once trained, a
    wait while another worker trains it); 0, or the exit status of an interrupted run."""
    if study.supernet is None:
        return 0
    try:
        info = study.supernet.train(retrain=retrain)
    except Interrupted as exc:
        signal_name = str(exc) or "SIGTERM"
        if world()[0] == 0:
            print(
                f"supernet training of study {study.name} interrupted ({signal_name}); run the "
                "same command again to go on: it resumes from its last epoch's checkpoint"
            )
        return 128 + signal.Signals[signal_name].value  # as a shell reports the signal
    if not info or world()[0] != 0:
        return 0
    if as_json:
        print(json.dumps({k: v for k, v in info.items() if k != "history"}, indent=2))
    elif "imported_from" in info:
        print(f"supernet of study {study.name}: imported from {info['imported_from']}")
    else:
        print(
            f"supernet of study {study.name}: trained {info['epochs']} epochs "
            f"({info['seconds']:.1f} s), weights {info['digest'] or info['weights']}"
        )
    return 0


def cmd_supernet(args: argparse.Namespace) -> int:
    """Train the study's supernet (resuming a cut run, or again with --retrain when its
    weights were lost), and say how it went."""
    spec = load_spec(args.study_file)  # its confirm= is run's: training a supernet confirms none
    if spec.supernet is None:
        raise StudyError(
            f"study file {args.study_file} defines no supernet (StudySpec(supernet=...)); "
            "`autosearch run` trains its candidates"
        )
    if args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        return _torchrun(args.nproc_per_node, args.argv)
    url = args.storage or spec.storage or default_storage(spec.name)
    distributed = init_distributed((spec.supernet.train or spec.train).device)
    try:
        rank, _ = world()
        if rank == 0:
            study = spec.create(storage=url, artifacts=args.artifacts, **_tracking(args))
        if distributed:
            dist.barrier()
        if rank != 0:
            study = load_study(spec.name, storage=url)
        return _supernet_first(study, retrain=args.retrain, as_json=args.json)
    finally:
        if distributed:
            leave_distributed()  # together: rank 0 stores after the others end


def cmd_search(args: argparse.Namespace) -> int:
    with _out_dir(args, args.name) as out:
        return _search(args, out)


def _search(args: argparse.Namespace, out: Path) -> int:
    budget: dict[str, Any] = {
        k: v
        for k, v in (("max_flops", args.max_flops), ("max_params", args.max_params))
        if v is not None
    }
    if budget and not args.table:  # the budget holds at the data's image size, not 3×32×32
        data = load_data(args.data)
        budget.update(budget_input=data.input_shape, budget_classes=data.num_classes)
    space = spaces.get(args.space)(**budget)
    objectives = tuple(args.objectives.split(","))
    controller_cls = controllers.get(args.controller)
    options: dict[str, object] = {"seed": args.seed}
    if getattr(controller_cls, "multi_objective", False):  # NSGA-II: the study's objectives
        options["objectives"] = {o: objective(o).direction for o in objectives}
    controller = controller_cls(space, **options)
    if controller.needs_scorer and not args.proxies:
        raise ConfigError(
            f"--controller {args.controller} ranks candidates by zero-cost proxies: add "
            "--proxies synflow,naswot,jacob_cov (or all)"
        )
    table = Table(path=args.table, **args.table_columns) if args.table else None
    study = create_study(
        args.name,
        controller=controller,
        data=args.data,
        objectives=objectives,
        reward=args.reward,
        variants=tuple(v for v in args.variants.split(",") if v),
        train=TrainConfig(epochs=args.epochs),
        storage=args.storage,
        artifacts=args.artifacts,
        seed=args.seed,
        table=table,
        proxies=args.proxies,
        load_if_exists=True,
    )
    return _run_to_budget(study, args.n_trials, out)


def cmd_train(args: argparse.Namespace) -> int:
    """Train an export folder from scratch with the shared stack."""
    from autosearch.export.retrain import recipe, train_export

    if args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        return _torchrun(args.nproc_per_node, args.argv)
    trained_on, seed, config = recipe(args.export_dir)
    given = {name: getattr(args, name) for name in _TRAIN_OPTIONS}
    config = dataclasses.replace(config, **{k: v for k, v in given.items() if v is not None})
    seed = args.seed if args.seed is not None else seed
    spec = args.data or trained_on or "digits"
    distributed = init_distributed(config.device)
    try:
        data = load_data(spec, seed=seed)
        rank, _ = world()
        bars: list[tqdm] = []  # opened with the first epoch, after the export is checked

        def progress(epoch: EpochResult) -> None:
            if not bars:
                quiet = rank != 0 or args.json or not sys.stderr.isatty()  # no bar in a log
                bars.append(tqdm(total=config.epochs, unit="epoch", disable=quiet))
            bars[0].set_postfix_str(f"loss {epoch.train_loss:.3f} val {epoch.val_accuracy:.4f}")
            bars[0].update()

        try:
            metrics = train_export(
                args.export_dir,
                data,
                config,
                seed=seed,
                on_epoch=progress,
                trained_on=trained_on,
                trainer=_trainer(args, config, seed),
            )
        finally:
            for bar in bars:
                bar.close()
        if rank == 0:
            if args.json:
                print(json.dumps(metrics, indent=2))
            else:
                print(
                    f"trained {args.export_dir} for {metrics['epochs']} epochs on {spec}: "
                    f"val {metrics['val_accuracy']:.4f}, test {metrics['test_accuracy']:.4f} "
                    f"({metrics['seconds']:.1f} s, {metrics['world_size']} process(es), "
                    f"{metrics['precision']})"
                    + _population_line(metrics, Path(args.export_dir) / "full")
                    + "\nweights and metrics: "
                    f"{Path(args.export_dir) / 'full'}/"
                )
        return 0
    finally:
        if distributed:
            leave_distributed()


def _trainer(args: argparse.Namespace, config: TrainConfig, seed: int) -> Any:
    """How ``autosearch train`` trains: a population (``--population N``: the learning
    rate adapted within 1/10 to 10 times the recipe's), a replayed schedule
    (``--schedule FILE``), or one plain run (None)."""
    if args.population and args.schedule:
        raise ConfigError("--population and --schedule: give one (a schedule replays one member)")
    if args.population:
        from autosearch.population.full import population_trainer
        from autosearch.population.rules import PopulationBasedTraining

        population = PopulationBasedTraining.of_learning_rate(
            args.population, args.population_interval, config.lr, seed=seed
        )
        return population_trainer(population)
    if args.schedule:
        from autosearch.population.full import read_schedule, schedule_trainer

        return schedule_trainer(read_schedule(args.schedule, config.epochs))
    return None


def _population_line(metrics: dict[str, Any], out: Path) -> str:
    """What a population did, in a line, and its figure written (population.html)."""
    population = metrics.get("population")
    if not population:
        return ""
    from autosearch.report.population import population as figure

    figure(out / "population").write_html(out / "population.html", include_plotlyjs=True)
    copies = len(population["lineage"])
    return (
        f"\npopulation of {population['size']}: member {population['winner']} won "
        f"({copies} exploit(s) in its lineage); its schedule: schedule.json "
        "(replay it with --schedule); every member: population.html"
    )


def cmd_worker(args: argparse.Namespace) -> int:
    """Join a stored study and run trials until ``--n-trials`` are done (or Ctrl-C)."""
    study = load_study(args.study, storage=args.storage)
    if args.mlflow is not None or args.tensorboard is not None:
        study.track(**_tracking(args))
    code = _supernet_first(study)  # trained once, by whichever worker comes first
    if code:
        return code
    join_as_worker(study, worker_id())  # its controller on a random stream of its own
    print(f"worker joined study {study.name} ({study.storage_url}); {args.n_trials} trials")
    try:
        records = study.optimize(
            args.n_trials, max_failures_in_a_row=args.max_failures, total=args.total
        )
    except KeyboardInterrupt as exc:  # StopNow names SIGTERM where that stopped it
        study.interrupted = getattr(exc, "signal", "SIGINT")
        records = []
    if study.interrupted:
        print(
            f"worker interrupted ({study.interrupted}); its trial resumes from its last "
            "checkpoint on the next claim"
        )
        return 128 + signal.Signals[study.interrupted].value
    print(f"worker finished {len(records)} trials: {[r.trial for r in records]}")
    return 0


_TRAIN_OPTIONS = (
    "epochs",
    "batch_size",
    "lr",
    "precision",
    "crop_padding",
    "flip",
    "parallel",
    "shard_size",
)


def _torchrun(nproc: int, argv: list[str]) -> int:
    """The same command line again, as ``nproc`` processes under torchrun (which sets
    LOCAL_RANK, so the processes do not relaunch). torchrun's launcher runs in this
    process, as the ``torchrun`` command would in its own: the ranks start without a
    third interpreter importing torch first (about 2 s on a 2-core CPU). Where a rank fails:
    the first failed rank's status (a refusal's 2, as one process would
    give); 128 + the signal's number when this process is signalled (the ranks are
    stopped first)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(["--standalone", f"--nproc-per-node={nproc}", "-m", "autosearch.cli", *argv])
    except ChildFailedError as exc:  # torchrun has said which rank failed and how
        return max(1, exc.get_first_failure()[1].exitcode)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0
