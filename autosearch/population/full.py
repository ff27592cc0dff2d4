"""An export trained in full as a population (``autosearch train DIR --population N``),
or by a population member's schedule replayed (``--schedule FILE``): trainers for
:func:`autosearch.export.retrain.train_export`.

A population's folder is ``full/population/`` (its record and every member's checkpoint,
so an interrupted run goes on, from this worker or others); the winner's weights are the
export's trained weights, its schedule is written to ``full/schedule.json`` and its
lineage and every round to ``metrics.json``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.nn as nn

from autosearch.data import Dataset
from autosearch.errors import ConfigError
from autosearch.export.retrain import Trainer
from autosearch.population.rules import PopulationBasedTraining
from autosearch.population.run import replay, train_population
from autosearch.training.train import EpochResult, TrainConfig, TrainResult

__all__ = ["population_trainer", "read_schedule", "schedule_trainer"]


# What is kept of each member with the trial: what autosearch.report.population draws.
_DRAWN = ("id", "settings", "scores", "schedule", "lineage")


def population_trainer(
    population: PopulationBasedTraining,
    on_epoch: Callable[[int, EpochResult], None] | None = None,
    *,
    grace: float = 600.0,
    folder: Path | None = None,
) -> Trainer:
    """Train the export (or a trial: the same shape) as ``population``; the winner is
    the trained model. ``grace``: seconds after which a member's silent worker is taken
    to be dead (0 where one worker alone holds the folder: a confirmation trial).
    ``folder``: the population's (default ``population/`` in the run's own folder)."""

    def run(
        build: Callable[[], nn.Module], data: Dataset, config: TrainConfig, seed: int, out: Path
    ) -> tuple[nn.Module, TrainResult, dict[str, Any]]:
        where = folder if folder is not None else out / "population"
        result = train_population(
            build, data, config, population, where, seed=seed, on_epoch=on_epoch, grace=grace
        )
        state = result.state()
        model = build()
        model.load_state_dict(state["model"])
        history = tuple(EpochResult(**e) for e in state["history"])
        (out / "schedule.json").write_text(json.dumps(result.schedule, indent=2) + "\n")
        extra = {
            "population": {
                "size": population.size,
                "winner": result.winner,
                "schedule": result.schedule,
                "lineage": result.members[result.winner]["lineage"],
                "final": {str(m["id"]): m["scores"][str(config.epochs)] for m in result.members},
                "rounds": result.rounds,
                "members": [{k: m[k] for k in _DRAWN} for m in result.members],
            }
        }
        return model, TrainResult(history=history), extra

    return run


def schedule_trainer(schedule: Sequence[Mapping[str, Any]]) -> Trainer:
    """Train the export by ``schedule`` (a population member's, replayed)."""

    def run(
        build: Callable[[], nn.Module], data: Dataset, config: TrainConfig, seed: int, out: Path
    ) -> tuple[nn.Module, TrainResult, dict[str, Any]]:
        model, history = replay(
            build, data, config, schedule, seed=seed, checkpoint=out / "checkpoint.pt"
        )
        return model, TrainResult(history=tuple(history)), {"schedule": list(schedule)}

    return run


def read_schedule(path: str | Path, epochs: int) -> list[dict[str, Any]]:
    """A schedule file (``schedule.json`` of a population's winner), checked: segments
    in order from epoch 0 to ``epochs``, each with its settings."""
    try:
        schedule = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the schedule {path}: {exc}") from None
    ok = isinstance(schedule, list) and schedule and all(
        isinstance(s, dict) and isinstance(s.get("settings"), dict)
        and isinstance(s.get("from"), int) and isinstance(s.get("to"), int)
        for s in schedule
    )  # fmt: skip
    if (
        not ok
        or schedule[0]["from"] != 0
        or any(a["to"] != b["from"] for a, b in itertools.pairwise(schedule))
    ):
        raise ConfigError(
            f"{path} is not a schedule: expected segments [{{'from': 0, 'to': E, "
            "'settings': {...}}, ...], each starting where the last ended (a population's "
            "schedule.json)"
        )
    if schedule[-1]["to"] != epochs:
        raise ConfigError(
            f"{path} schedules {schedule[-1]['to']} epochs but the run trains {epochs}: "
            f"pass --epochs {schedule[-1]['to']}"
        )
    return schedule
