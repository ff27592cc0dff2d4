"""``autosearch train DIR``: train an exported architecture in full (plainly, as a
population, or by a population's schedule), under torchrun where asked."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from autosearch.cli._common import torchrun
from autosearch.data import load_data
from autosearch.errors import ConfigError
from autosearch.training.runtime import init_distributed, leave_distributed, world
from autosearch.training.train import EpochResult, TrainConfig


def cmd_train(args: argparse.Namespace) -> int:
    """Train an export folder from scratch with the shared stack."""
    from autosearch.export.retrain import recipe, train_export

    if args.nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        return torchrun(args.nproc_per_node, args.argv)
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
