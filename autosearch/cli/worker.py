"""``autosearch worker``: join a stored study and run its trials."""

from __future__ import annotations

import argparse
import signal

from autosearch.cli._common import import_evaluator, supernet_first, tracking_options
from autosearch.study import (
    load_study,
)
from autosearch.study.study import join_as_worker
from autosearch.workers._heartbeat import worker_id


def cmd_worker(args: argparse.Namespace) -> int:
    """Join a stored study and run trials until ``--n-trials`` are done (or Ctrl-C)."""
    evaluator = import_evaluator(args.evaluator) if args.evaluator else None
    study = load_study(args.study, storage=args.storage, evaluator=evaluator)
    if args.mlflow is not None or args.tensorboard is not None:
        study.track(**tracking_options(args))
    code = supernet_first(study)  # trained once, by whichever worker comes first
    if code:
        return code
    join_as_worker(study, worker_id())  # its controller on a random stream of its own
    print(f"worker joined study {study.name} ({study.storage_url}); {args.n_trials} trials")
    try:
        records = study.optimize(
            args.n_trials,
            timeout=args.timeout,
            max_failures_in_a_row=args.max_failures,
            total=args.total,
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
