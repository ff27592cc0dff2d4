"""``autosearch run FILE``: run a study file to its budget, then show its front, write
its report and export its best."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch.distributed as dist

from autosearch.cli._common import (
    executor_of,
    out_dir,
    supernet_first,
    table,
    torchrun,
    tracking_options,
)
from autosearch.cli.confirm import confirmations_table
from autosearch.errors import ConfigError, StorageError, StudyError
from autosearch.report import write_report
from autosearch.study import (
    Study,
    default_storage,
    load_study,
)
from autosearch.studyfile import load_spec
from autosearch.training.runtime import init_distributed, leave_distributed, world


def run_to_budget(
    study: Study,
    total: int,
    out: Path,
    *,
    show_progress_bar: bool | None = None,
    args: argparse.Namespace | None = None,
    confirm: int = 0,
    export: bool = True,
    timeout: float | None = None,
) -> int:
    """Run the study to ``total`` finished trials (workers and executor as ``args`` say),
    or until ``timeout`` seconds are spent; confirm the top ``confirm`` of a supernet's
    front; write the report, export the best."""
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
            executor=executor_of(args),
            total=total,  # other workers of the study count: it is run to its total
            timeout=timeout,
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


def _confirm(study: Study, k: int) -> str | None:
    """Train the top ``k`` subnets of the supernet's front (fewer where it is smaller) and
    show them; what interrupted it, if anything."""
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
    executor_of(args)  # a bad combination is refused before anything is created
    spec = load_spec(args.study_file)
    if args.nproc_per_node > 1 and spec.confirm:
        raise ConfigError(
            f"StudySpec(confirm={spec.confirm}) is not run under --nproc-per-node; run "
            f"without it, or `autosearch confirm {args.study_file} -k {spec.confirm}` after"
        )
    if args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        return torchrun(args.nproc_per_node, args.argv)
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
        with out_dir(args, spec.name) as out:
            return run_to_budget(study, 0, out, export=args.export)
    with out_dir(args, spec.name) as out:
        if not init_distributed(spec.train.device):
            study = spec.create(storage=url, artifacts=args.artifacts, **tracking_options(args))
            return supernet_first(study) or run_to_budget(
                study,
                total,
                out,
                args=args,
                confirm=spec.confirm,
                export=args.export,
                timeout=args.timeout,
            )
        # Under torchrun: rank 0 creates (or opens) the study before the others open it.
        rank, _ = world()
        try:
            if rank == 0:
                study = spec.create(storage=url, artifacts=args.artifacts, **tracking_options(args))
            dist.barrier()
            if rank != 0:
                study = load_study(spec.name, storage=url)
                code = supernet_first(study)
                if not code:
                    study.optimize(0)  # follow rank 0 to the end
                return code
            return supernet_first(study) or run_to_budget(
                study, total, out, export=args.export, timeout=args.timeout
            )
        finally:
            leave_distributed()
