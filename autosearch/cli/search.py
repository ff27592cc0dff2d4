"""``autosearch search NAME``: search a registered space with a registered controller,
without a study file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autosearch.cli._common import out_dir
from autosearch.cli.run import run_to_budget
from autosearch.data import load_data
from autosearch.errors import ConfigError
from autosearch.registry import controllers, spaces
from autosearch.scoring import objective
from autosearch.study import (
    Table,
    create_study,
)
from autosearch.training.train import TrainConfig


def cmd_search(args: argparse.Namespace) -> int:
    with out_dir(args, args.name) as out:
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
            "--proxies default (the zero-cost estimate's proxies), or names of proxies"
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
    return run_to_budget(study, args.n_trials, out)
