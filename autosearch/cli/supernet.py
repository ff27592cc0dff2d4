"""``autosearch supernet FILE``: train a weight-sharing study's supernet (once, by
whichever worker comes first)."""

from __future__ import annotations

import argparse
import os

import torch.distributed as dist

from autosearch.cli._common import supernet_first, torchrun, tracking_options
from autosearch.errors import StudyError
from autosearch.study import (
    default_storage,
    load_study,
)
from autosearch.studyfile import load_spec
from autosearch.training.runtime import init_distributed, leave_distributed, world


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
        return torchrun(args.nproc_per_node, args.argv)
    url = args.storage or spec.storage or default_storage(spec.name)
    distributed = init_distributed((spec.supernet.train or spec.train).device)
    try:
        rank, _ = world()
        if rank == 0:
            study = spec.create(storage=url, artifacts=args.artifacts, **tracking_options(args))
        if distributed:
            dist.barrier()
        if rank != 0:
            study = load_study(spec.name, storage=url)
        return supernet_first(study, retrain=args.retrain, as_json=args.json)
    finally:
        if distributed:
            leave_distributed()  # together: rank 0 stores after the others end
